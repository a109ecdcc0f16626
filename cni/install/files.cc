#include "cni/install/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

namespace sockmesh::cni::install {
namespace {

std::string random_suffix() {
  unsigned char r[8] = {};
  if (getrandom(r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r)) {
    // No entropy yet: the clock makes the name hard to guess; O_EXCL keeps it safe regardless.
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

std::optional<std::string> read_file(const std::string& path, int* err) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (err != nullptr) *err = errno;
    return std::nullopt;
  }
  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      if (err != nullptr) *err = errno;
      close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

bool write_file_atomic(const std::string& path, const std::string& content, mode_t mode,
                       std::string* error) {
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  // A fresh name, created exclusively and never through a symlink (a planted link to another
  // file would otherwise have that file overwritten, as root, on the host).
  std::string tmp =
      dir + "/." + base + "." + std::to_string(getpid()) + "." + random_suffix() + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    *error = "creating " + tmp + ": " + std::strerror(errno);
    return false;
  }
  size_t done = 0;
  bool ok = true;
  while (ok && done < content.size()) {
    ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ok = false;
      break;
    }
    done += static_cast<size_t>(n);
  }
  ok = ok && fchmod(fd, mode) == 0 && fsync(fd) == 0;
  int saved = errno;
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok) saved = errno;
    unlink(tmp.c_str());
    *error = "writing " + path + ": " + std::strerror(saved);
    return false;
  }
  return true;
}

bool remove_file(const std::string& path, std::string* error) {
  if (unlink(path.c_str()) == 0 || errno == ENOENT) return true;
  *error = "removing " + path + ": " + std::strerror(errno);
  return false;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace sockmesh::cni::install
