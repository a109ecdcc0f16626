#include "identity/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/atomic_file.h"
#include "base/errno_text.h"

namespace sockmesh::identity::files {
namespace {

constexpr size_t kMaxFileSize = 1 << 20;  // PEM bundles are kilobytes; refuse to slurp a log.

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now so that a failing close (NFS reports write errors there) can be reported.
  int close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

Status write_all(int fd, std::string_view content) {
  while (!content.empty()) {
    ssize_t n = ::write(fd, content.data(), content.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{errno_text(errno)};
    }
    content.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

}  // namespace

Result<std::optional<std::string>> read(const std::filesystem::path& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever (and hold
  // the renewal thread); anything but a regular file is refused below.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    return Error{path.string() + ": " + errno_text(errno)};
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Error{path.string() + ": " + errno_text(errno)};
  if (!S_ISREG(st.st_mode)) {
    return Error{path.string() +
                 ": not a regular file (a FIFO, device, socket or directory); "
                 "refused"};
  }
  std::string out;
  char buf[8192];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{path.string() + ": " + errno_text(errno)};
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > kMaxFileSize) return Error{path.string() + ": larger than 1 MiB"};
  }
  return std::optional<std::string>(std::move(out));
}

Result<Publish> publish_exclusive(const std::filesystem::path& dir, std::string_view name,
                                  std::string_view content, mode_t mode) {
  std::filesystem::path target = dir / name;
  std::filesystem::path tmp = dir / ("." + std::string(name) + ".tmp." +
                                     std::to_string(::getpid()) + "." + random_name_suffix());
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode));
  if (fd.get() < 0) return Error{tmp.string() + ": " + errno_text(errno)};

  auto fail = [&](const std::string& what) -> Result<Publish> {
    ::unlink(tmp.c_str());
    return Error{tmp.string() + ": " + what};
  };
  if (auto st = write_all(fd.get(), content); !st) return fail(st.error().message);
  // Durable before visible: after a crash the name must not point at an empty file.
  if (::fsync(fd.get()) != 0) return fail(errno_text(errno));
  if (fd.close() != 0) return fail(errno_text(errno));

  int rc = ::link(tmp.c_str(), target.c_str());
  int link_errno = errno;
  ::unlink(tmp.c_str());
  if (rc != 0) {
    if (link_errno == EEXIST) return Publish::kAlreadyExists;
    return Error{"publishing " + target.string() + ": " + errno_text(link_errno)};
  }
  // Persist the directory entry as well.
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) ::fsync(dfd.get());
  return Publish::kWritten;
}

std::optional<Stamp> stamp(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  Stamp s;
  s.dev = static_cast<uint64_t>(st.st_dev);
  s.ino = static_cast<uint64_t>(st.st_ino);
  s.size = static_cast<int64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  return s;
}

}  // namespace sockmesh::identity::files
