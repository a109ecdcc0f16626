#include "loader/agent/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/atomic_file.h"
#include "base/regular_file.h"
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
  // A fresh name, created exclusively and never through a symlink: a name that someone else
  // planted (a link to a file we would then overwrite) makes this fail instead.
  auto written = sockmesh::write_file_atomic(path, content, mode);
  if (!written) return Error{written.error().code, written.error().message};
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
  // Non-blocking and regular files only: a FIFO planted in the run dir must not hang the agent.
  std::string out;
  if (int err = read_regular_file(path, kNoFileSizeLimit, &out); err != 0) {
    if (err == ENOENT) return Error{err, path + " does not exist"};
    return Error{err, "reading " + path + ": " + regular_file_error_text(err)};
  }
  return out;
}

}  // namespace sockmesh::agent
