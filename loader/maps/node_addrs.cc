#include "loader/maps/node_addrs.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <netinet/in.h>

#include <cstring>

#include "loader/maps/workload_map.h"
#include "sockmesh/maps.h"

namespace sockmesh::maps {
namespace {

constexpr MapShape kNodeAddrShape{BPF_MAP_TYPE_HASH, sizeof(sm_ip), sizeof(uint32_t)};

}  // namespace

Result<NodeAddrMap> NodeAddrMap::open(const std::string& pin_root) {
  auto map = PinnedMap::open(pin_root, SM_MAP_NODE_ADDRS, Access::kReadWrite, kNodeAddrShape);
  if (!map) return map.error();
  return NodeAddrMap(std::move(map).value());
}

Result<std::set<IpAddress>> NodeAddrMap::list() const {
  auto keys = map_.keys<sm_ip>();
  if (!keys) return keys.error();
  std::set<IpAddress> out;
  for (const auto& k : *keys) out.insert(from_kernel(k));
  return out;
}

Result<size_t> NodeAddrMap::replace(const std::set<IpAddress>& addresses) {
  auto current = list();
  if (!current) return current.error();
  size_t changed = 0;
  for (const auto& ip : *current) {
    if (addresses.count(ip) != 0) continue;
    sm_ip key = to_kernel(ip);
    if (int err = map_.remove(&key); err != 0 && err != -ENOENT) {
      return Error::from_errno(-err, "removing " + ip.to_string() + " from " + map_.path());
    }
    ++changed;
  }
  for (const auto& ip : addresses) {
    if (current->count(ip) != 0) continue;
    sm_ip key = to_kernel(ip);
    uint32_t value = SM_NODE_ADDR_EXEMPT;
    if (int err = map_.update(&key, &value, BPF_ANY); err != 0) {
      return Error::from_errno(-err, "adding " + ip.to_string() + " to " + map_.path());
    }
    ++changed;
  }
  return changed;
}

}  // namespace sockmesh::maps
