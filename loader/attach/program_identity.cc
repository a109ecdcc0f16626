#include "loader/attach/program_identity.h"

#include <bpf/bpf.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "loader/maps/unique_fd.h"

namespace sockmesh::loader {
namespace {

std::string hex(const uint8_t* bytes, size_t n) {
  std::string out;
  char buf[3];
  for (size_t i = 0; i < n; ++i) {
    snprintf(buf, sizeof(buf), "%02x", bytes[i]);
    out += buf;
  }
  return out;
}

}  // namespace

maps::Result<ProgramIdentity> identity_of(int prog_fd) {
  bpf_prog_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(prog_fd, &info, &len) != 0) {
    return maps::Error::from_errno(errno, "reading BPF program info");
  }
  ProgramIdentity out;
  out.id = info.id;
  out.tag = hex(info.tag, sizeof(info.tag));
  std::vector<uint32_t> map_ids(info.nr_map_ids);
  if (!map_ids.empty()) {
    bpf_prog_info again{};
    again.nr_map_ids = static_cast<uint32_t>(map_ids.size());
    again.map_ids = reinterpret_cast<uint64_t>(map_ids.data());
    len = sizeof(again);
    if (bpf_obj_get_info_by_fd(prog_fd, &again, &len) != 0) {
      return maps::Error::from_errno(errno, "reading BPF program maps");
    }
  }
  for (uint32_t map_id : map_ids) {
    maps::UniqueFd map(bpf_map_get_fd_by_id(map_id));
    if (!map) continue;
    bpf_map_info minfo{};
    uint32_t mlen = sizeof(minfo);
    if (bpf_obj_get_info_by_fd(map.get(), &minfo, &mlen) != 0) continue;
    if (std::strchr(minfo.name, '.') == nullptr) {
      out.maps.push_back(map_id);  // a shared map (libbpf names the object's own "<obj>.<sec>")
      continue;
    }
    if (std::strstr(minfo.name, ".rodata") == nullptr) continue;
    std::string value(minfo.value_size, '\0');
    uint32_t zero = 0;
    if (bpf_map_lookup_elem(map.get(), &zero, value.data()) == 0) out.rodata = value;
  }
  std::sort(out.maps.begin(), out.maps.end());
  return out;
}

}  // namespace sockmesh::loader
