#pragma once
// Reading a configuration file whole, shared by the loader and the watcher (which needs to tell a
// missing file, a normal moment during rename-replace, from other failures).
#include <cstddef>
#include <string>

namespace sockmesh::config {

// Bigger files are refused: a local config this large is a mistake, and the watcher re-reads it.
inline constexpr size_t kMaxConfigFileBytes = 16u << 20;

// Returns 0 and fills `out`, or an errno value (EFBIG when over the limit, EISDIR/EINVAL when not a
// regular file).
int read_config_file(const std::string& path, std::string* out);

// What read_config_file's error means, for an operator ("not a regular file (FIFO, device or
// socket)", "larger than ... bytes", or strerror).
std::string read_config_error_text(int err);

}  // namespace sockmesh::config
