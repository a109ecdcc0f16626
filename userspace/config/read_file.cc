#include "config/read_file.h"

#include "base/regular_file.h"

namespace sockmesh::config {

int read_config_file(const std::string& path, std::string* out) {
  // A FIFO or device would block the watcher thread forever: refused as not a regular file.
  return read_regular_file(path, kMaxConfigFileBytes, out);
}

std::string read_config_error_text(int err) {
  return regular_file_error_text(err, kMaxConfigFileBytes);
}

}  // namespace sockmesh::config
