#pragma once
// A BPF map opened from its pin in bpffs, checked against the layout this build expects, so that
// a reader built from another version of bpf/include/sockmesh/maps.h fails at open with a clear
// message instead of reading garbage.
#include <cstdint>
#include <cerrno>
#include <string>
#include <vector>

#include "loader/maps/result.h"
#include "loader/maps/unique_fd.h"

namespace sockmesh::maps {

// What a map must look like: its type (BPF_MAP_TYPE_*) and key and value sizes.
struct MapShape {
  uint32_t type = 0;
  uint32_t key_size = 0;
  uint32_t value_size = 0;
};

enum class Access { kReadOnly, kReadWrite };

class PinnedMap {
 public:
  // Opens <pin_root>/<name>. Fails when the pin is missing (with a hint to run the loader's
  // install), when it is not a map, or when its shape differs from `expected`.
  static Result<PinnedMap> open(const std::string& pin_root, const std::string& name, Access access,
                                const MapShape& expected);

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  uint32_t id() const { return id_; }
  uint32_t max_entries() const { return max_entries_; }
  // Whether the pin still names this map (false once the loader uninstalled, or recreated the
  // maps under the same root: the open descriptor then points to a map nobody uses).
  bool still_pinned() const;

  // Raw element access; `errno`-style results (0, or a negative errno).
  int lookup(const void* key, void* value) const;
  int update(const void* key, const void* value, uint64_t flags) const;
  int remove(const void* key) const;
  // Next key after `key` (nullptr: the first). -ENOENT at the end.
  int next_key(const void* key, void* next) const;
  // Every key, as the kernel walks them (entries added or removed meanwhile may be missed).
  template <typename Key>
  Result<std::vector<Key>> keys() const {
    std::vector<Key> out;
    Key key{};
    Key next{};
    const void* prev = nullptr;
    while (true) {
      int err = next_key(prev, &next);
      if (err == -ENOENT) break;
      if (err != 0) return Error::from_errno(-err, "listing " + path_);
      out.push_back(next);
      key = next;
      prev = &key;
    }
    return out;
  }

 private:
  PinnedMap() = default;
  UniqueFd fd_;
  std::string path_;
  uint32_t id_ = 0;
  uint32_t max_entries_ = 0;
};

}  // namespace sockmesh::maps
