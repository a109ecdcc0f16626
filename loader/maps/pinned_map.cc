#include "loader/maps/pinned_map.h"

#include <bpf/bpf.h>
#include <linux/bpf.h>

#include <cerrno>
#include <cstring>

namespace sockmesh::maps {

Error Error::from_errno(int code, const std::string& what) {
  if (code < 0) code = -code;
  return Error{code, what + ": " + std::strerror(code)};
}

Result<PinnedMap> PinnedMap::open(const std::string& pin_root, const std::string& name,
                                  Access access, const MapShape& expected) {
  PinnedMap map;
  map.path_ = pin_root + "/" + name;
  LIBBPF_OPTS(bpf_obj_get_opts, opts);
  opts.file_flags = access == Access::kReadOnly ? BPF_F_RDONLY : 0;
  int fd = bpf_obj_get_opts(map.path_.c_str(), &opts);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) {
      return Error{err, "BPF map " + map.path_ +
                            " is not pinned: is sockmesh installed with this pin root "
                            "(sockmesh-loader install --pin-root " +
                            pin_root + ")?"};
    }
    if (err == EPERM || err == EACCES) {
      return Error{err, "opening BPF map " + map.path_ +
                            ": permission denied (needs CAP_BPF, or access to the pin's file)"};
    }
    return Error::from_errno(err, "opening BPF map " + map.path_);
  }
  map.fd_.reset(fd);

  bpf_map_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) {
    return Error::from_errno(errno, map.path_ + " is not a BPF map");
  }
  if (info.type != expected.type || info.key_size != expected.key_size ||
      info.value_size != expected.value_size) {
    return Error{EINVAL, "BPF map " + map.path_ + " has type " + std::to_string(info.type) +
                             ", key " + std::to_string(info.key_size) + " bytes, value " +
                             std::to_string(info.value_size) + " bytes; this build expects type " +
                             std::to_string(expected.type) + ", key " +
                             std::to_string(expected.key_size) + ", value " +
                             std::to_string(expected.value_size) +
                             " (loader and reader built from different ABI headers?)"};
  }
  map.id_ = info.id;
  map.max_entries_ = info.max_entries;
  return map;
}

bool PinnedMap::still_pinned() const {
  LIBBPF_OPTS(bpf_obj_get_opts, opts);
  opts.file_flags = BPF_F_RDONLY;
  UniqueFd fd(bpf_obj_get_opts(path_.c_str(), &opts));
  if (!fd) return false;
  bpf_map_info info{};
  uint32_t len = sizeof(info);
  return bpf_obj_get_info_by_fd(fd.get(), &info, &len) == 0 && info.id == id_;
}

int PinnedMap::lookup(const void* key, void* value) const {
  return bpf_map_lookup_elem(fd_.get(), key, value) == 0 ? 0 : -errno;
}

int PinnedMap::update(const void* key, const void* value, uint64_t flags) const {
  return bpf_map_update_elem(fd_.get(), key, value, flags) == 0 ? 0 : -errno;
}

int PinnedMap::remove(const void* key) const {
  return bpf_map_delete_elem(fd_.get(), key) == 0 ? 0 : -errno;
}

int PinnedMap::next_key(const void* key, void* next) const {
  return bpf_map_get_next_key(fd_.get(), key, next) == 0 ? 0 : -errno;
}

}  // namespace sockmesh::maps
