#include "cni/install/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/atomic_file.h"
#include "base/regular_file.h"

namespace sockmesh::cni::install {
std::optional<std::string> read_file(const std::string& path, int* err) {
  // Non-blocking and regular files only: a FIFO in a config's place must not hang the installer.
  std::string out;
  if (int e = read_regular_file(path, kNoFileSizeLimit, &out); e != 0) {
    if (err != nullptr) *err = e;
    return std::nullopt;
  }
  return out;
}

bool write_file_atomic(const std::string& path, const std::string& content, mode_t mode,
                       std::string* error) {
  // A fresh name, created exclusively and never through a symlink (a planted link to another
  // file would otherwise have that file overwritten, as root, on the host).
  auto written = sockmesh::write_file_atomic(path, content, mode);
  if (!written) *error = written.error().message;
  return written.ok();
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
