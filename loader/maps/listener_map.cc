#include "loader/maps/listener_map.h"

#include <linux/bpf.h>

#include <cerrno>

#include "loader/maps/workload_map.h"

namespace sockmesh::maps {
namespace {

constexpr MapShape kListenerShape{BPF_MAP_TYPE_SOCKHASH, sizeof(sm_listener_key), sizeof(uint64_t)};

sm_listener_key key_of(const IpAddress& ip, ListenerKind kind) {
  sm_listener_key key{};
  key.ip = to_kernel(ip);
  key.kind = static_cast<uint32_t>(kind);
  return key;
}

}  // namespace

std::string_view to_string(ListenerKind kind) {
  switch (kind) {
    case ListenerKind::kOutbound:
      return "outbound";
    case ListenerKind::kInboundPlain:
      return "inbound-plaintext";
    case ListenerKind::kHbone:
      return "hbone";
    case ListenerKind::kDnsUdp:
      return "dns-udp";
    case ListenerKind::kDnsTcp:
      return "dns-tcp";
  }
  return "unknown";
}

uint16_t port_of(ListenerKind kind) {
  switch (kind) {
    case ListenerKind::kOutbound:
      return SM_PORT_OUTBOUND;
    case ListenerKind::kInboundPlain:
      return SM_PORT_INBOUND_PLAIN;
    case ListenerKind::kHbone:
      return SM_PORT_HBONE;
    case ListenerKind::kDnsUdp:
    case ListenerKind::kDnsTcp:
      return SM_PORT_DNS;
  }
  return 0;
}

Result<ListenerMap> ListenerMap::open(const std::string& pin_root) {
  auto map = PinnedMap::open(pin_root, SM_MAP_LISTENERS, Access::kReadWrite, kListenerShape);
  if (!map) return map.error();
  return ListenerMap(std::move(map).value());
}

Status ListenerMap::add(const IpAddress& pod_ip, ListenerKind kind, int listening_fd) {
  sm_listener_key key = key_of(pod_ip, kind);
  uint64_t fd = static_cast<uint64_t>(listening_fd);
  int err = map_.update(&key, &fd, BPF_ANY);
  if (err == -EOPNOTSUPP) {
    return Error::from_errno(-err, "registering the " + std::string(to_string(kind)) +
                                       " listener of " + pod_ip.to_string() +
                                       ": the kernel refuses this socket in a SOCKHASH (not a "
                                       "TCP listener, or a kernel before 5.7)");
  }
  if (err != 0) {
    return Error::from_errno(-err, "registering the " + std::string(to_string(kind)) +
                                       " listener of " + pod_ip.to_string() + " in " + map_.path());
  }
  return {};
}

Result<bool> ListenerMap::remove(const IpAddress& pod_ip, ListenerKind kind) {
  sm_listener_key key = key_of(pod_ip, kind);
  int err = map_.remove(&key);
  if (err == -ENOENT) return false;
  if (err != 0) return Error::from_errno(-err, "unregistering a listener in " + map_.path());
  return true;
}

std::optional<uint64_t> ListenerMap::socket_cookie(const IpAddress& pod_ip,
                                                   ListenerKind kind) const {
  sm_listener_key key = key_of(pod_ip, kind);
  uint64_t cookie = 0;
  if (map_.lookup(&key, &cookie) != 0) return std::nullopt;
  return cookie;
}

Result<std::vector<ListenerSlot>> ListenerMap::list() const {
  std::vector<ListenerSlot> out;
  auto keys = map_.keys<sm_listener_key>();
  if (!keys) return keys.error();
  for (const auto& k : *keys) {
    uint64_t cookie = 0;
    if (map_.lookup(&k, &cookie) == 0) {
      out.push_back({from_kernel(k.ip), static_cast<ListenerKind>(k.kind), cookie});
    }
  }
  return out;
}

}  // namespace sockmesh::maps
