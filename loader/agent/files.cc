#include "loader/agent/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "loader/maps/unique_fd.h"

namespace sockmesh::agent {

using maps::Error;

namespace {

std::string random_suffix() {
  unsigned char r[8] = {};
  if (getrandom(r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r)) {
    // No entropy yet (early boot): the clock still makes the name hard to guess ahead of time;
    // O_EXCL keeps it safe either way.
    uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::memcpy(r, &t, sizeof r);
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : r) {
    s.push_back(kDigits[c >> 4]);
    s.push_back(kDigits[c & 0xf]);
  }
  return s;
}

}  // namespace

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
  // A fresh name, created exclusively and never through a symlink: a name that someone else
  // planted (a link to a file we would then overwrite) makes this fail instead.
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + random_suffix();
  {
    maps::UniqueFd fd(
        open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
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

std::vector<std::string> remove_stale_temp_files(const std::string& path) {
  std::vector<std::string> removed;
  auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return removed;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    // unlink(2) removes a symlink itself, never what it points to.
    if (unlinkat(dirfd(d), name.c_str(), 0) == 0) removed.push_back(dir + "/" + name);
  }
  closedir(d);
  return removed;
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
