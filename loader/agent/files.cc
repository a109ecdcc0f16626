#include "loader/agent/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "loader/maps/unique_fd.h"

namespace sockmesh::agent {

using maps::Error;

maps::Status make_dirs(const std::string& dir) {
  if (dir.empty()) return {};
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0) return {};
  auto slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (auto s = make_dirs(dir.substr(0, slash)); !s) return s;
  }
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Error::from_errno(errno, "creating directory " + dir);
  }
  return {};
}

maps::Status write_file_atomic(const std::string& path, const std::string& content, mode_t mode) {
  auto slash = path.rfind('/');
  if (slash != std::string::npos) {
    if (auto s = make_dirs(path.substr(0, slash)); !s) return s;
  }
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    maps::UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
    if (!fd) return Error::from_errno(errno, "creating " + tmp);
    size_t done = 0;
    while (done < content.size()) {
      ssize_t n = write(fd.get(), content.data() + done, content.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int err = errno;
        unlink(tmp.c_str());
        return Error::from_errno(err, "writing " + tmp);
      }
      done += static_cast<size_t>(n);
    }
    if (fchmod(fd.get(), mode) != 0 || fsync(fd.get()) != 0) {
      int err = errno;
      unlink(tmp.c_str());
      return Error::from_errno(err, "finishing " + tmp);
    }
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return Error::from_errno(err, "renaming " + tmp + " to " + path);
  }
  return {};
}

maps::Result<std::string> read_file(const std::string& path) {
  maps::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    int err = errno;
    return Error{err, err == ENOENT ? path + " does not exist"
                                    : Error::from_errno(err, "opening " + path).message};
  }
  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::from_errno(errno, "reading " + path);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace sockmesh::agent
