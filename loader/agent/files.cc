#include "loader/agent/files.h"

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
