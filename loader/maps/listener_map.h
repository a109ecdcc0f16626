#pragma once
// The proxy's listening sockets in each enrolled pod, by (pod IP, listener kind). The proxy
// registers each listener it opens in a pod's netns; tc looks the slot up and assigns captured
// SYNs to that socket. A closed socket leaves the map by itself.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/ip_address.h"
#include "loader/maps/pinned_map.h"
#include "loader/maps/result.h"
#include "sockmesh/consts.h"
#include "sockmesh/maps.h"

namespace sockmesh::maps {

enum class ListenerKind : uint32_t {
  kOutbound = SM_LISTENER_OUTBOUND,           // 15001, IP_TRANSPARENT
  kInboundPlain = SM_LISTENER_INBOUND_PLAIN,  // 15006
  kHbone = SM_LISTENER_HBONE,                 // 15008 (tc does not use this slot)
  kDnsUdp = SM_LISTENER_DNS_UDP,              // 15053/udp, IP_TRANSPARENT
  kDnsTcp = SM_LISTENER_DNS_TCP,              // 15053/tcp, IP_TRANSPARENT
};

std::string_view to_string(ListenerKind kind);
uint16_t port_of(ListenerKind kind);

struct ListenerSlot {
  IpAddress pod_ip;
  ListenerKind kind = ListenerKind::kOutbound;
  uint64_t socket_cookie = 0;  // SO_COOKIE of the registered socket
};

class ListenerMap {
 public:
  static Result<ListenerMap> open(const std::string& pin_root = SM_PIN_ROOT_DEFAULT);

  // Registers a listening TCP socket, or for kDnsUdp a bound UDP socket (any netns), for the pod;
  // replaces a previous one.
  Status add(const IpAddress& pod_ip, ListenerKind kind, int listening_fd);
  // Unregisters; true if the slot was filled. Closing the socket has the same effect.
  Result<bool> remove(const IpAddress& pod_ip, ListenerKind kind);
  // The cookie of the registered socket, or nullopt.
  std::optional<uint64_t> socket_cookie(const IpAddress& pod_ip, ListenerKind kind) const;
  Result<std::vector<ListenerSlot>> list() const;

  const PinnedMap& map() const { return map_; }

 private:
  explicit ListenerMap(PinnedMap map) : map_(std::move(map)) {}
  PinnedMap map_;
};

}  // namespace sockmesh::maps
