#pragma once
// File operations of the installer. Every write is a temporary file in the same directory plus
// rename(2): the runtime, which reads the CNI conf dir at any moment, sees the old file or the new
// one, never half of one. Temporary names start with "." and end in ".tmp", which libcni skips
// (it loads *.conf, *.conflist and *.json only).
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace sockmesh::cni::install {

// The whole file, or nullopt when it cannot be read (*err = errno).
std::optional<std::string> read_file(const std::string& path, int* err = nullptr);
// Atomic replace; false with *error on failure (nothing changed then).
bool write_file_atomic(const std::string& path, const std::string& content, mode_t mode,
                       std::string* error);
bool remove_file(const std::string& path, std::string* error);  // a missing file is fine
bool file_exists(const std::string& path);
// Names in `dir` (no "." or ".."), sorted bytewise as libcni sorts them.
std::vector<std::string> list_dir(const std::string& dir);

}  // namespace sockmesh::cni::install
