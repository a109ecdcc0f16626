#pragma once
// File primitives shared by the CA's state directory and the mounted-certificate reader.
// Internal to the identity module.
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "identity/result.h"

namespace sockmesh::identity::files {

// Whole file; nullopt when it does not exist (ENOENT), an error for anything else.
Result<std::optional<std::string>> read(const std::filesystem::path& path);

enum class Publish { kWritten, kAlreadyExists };

// Writes `content` to `dir/name` with `mode` unless that name already exists. The content goes
// to a private temporary file (O_EXCL, `mode`) that is fsynced and then hard-linked into place:
// link() fails with EEXIST instead of replacing, so concurrent writers race on one atomic step
// and readers never observe a partial file. rename() would be atomic too but silently replaces
// a file another process already published and may already be using.
Result<Publish> publish_exclusive(const std::filesystem::path& dir, std::string_view name,
                                  std::string_view content, mode_t mode);

// Identity of a file's current contents as far as stat() can tell. Kubernetes updates mounted
// secrets by swapping a symlink, which changes the inode; editors and cp change mtime/size.
struct Stamp {
  uint64_t dev = 0;
  uint64_t ino = 0;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  bool operator==(const Stamp&) const = default;
};

// Follows symlinks. nullopt when the file does not exist or cannot be stat'ed.
std::optional<Stamp> stamp(const std::filesystem::path& path);

}  // namespace sockmesh::identity::files
