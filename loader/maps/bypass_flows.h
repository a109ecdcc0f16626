#pragma once
// The sockmap bypass as the proxy sees it: which of its sockets towards an app are in
// sm_bypass_proxy (the app's sends into them skip the TCP stack; the app's end is in sm_bypass,
// where sk_msg runs), and sm_stack_flows, where the proxy sends an app's flow back to the stack
// when it stops reading it.
//
// Why pinning exists: bytes redirected by sk_msg land in the proxy socket's ingress queue, which
// has no limit and no window, so an app facing a proxy that stopped reading (its other side is
// blocked) would keep writing into kernel memory. Through the stack, the proxy socket's receive
// window stops the app within its socket buffers. A pinned flow never returns to the redirect
// (bytes redirected later could overtake those waiting in the TCP receive queue); its entry goes
// when the app's socket closes (sockops STATE_CB in bpf/bypass.bpf.c).
#include <cstdint>
#include <optional>
#include <string>

#include "base/ip_address.h"
#include "loader/maps/pinned_map.h"
#include "loader/maps/result.h"
#include "sockmesh/consts.h"
#include "sockmesh/maps.h"

namespace sockmesh::maps {

// One end of a TCP connection from that socket's point of view, in its network namespace: the
// key of sm_bypass, sm_bypass_proxy and sm_stack_flows (struct sm_flow_key).
struct FlowKey {
  uint64_t netns = 0;  // SO_NETNS_COOKIE of the socket's namespace
  Endpoint local;
  Endpoint remote;

  // The other end of the same connection, provided it lives in the same namespace (true of the
  // app <-> proxy hop, the only connections in the bypass maps).
  FlowKey reversed() const { return FlowKey{netns, remote, local}; }
  sm_flow_key to_kernel() const;
  // "netns 4096 10.0.0.2:41000 -> 10.0.0.9:80", for logs.
  std::string to_string() const;

  bool operator==(const FlowKey&) const = default;
};

// The key sockops gave the connected TCP socket `fd` at establishment.
Result<FlowKey> flow_of_socket(int fd);
// The key of the app's end of a connection whose proxy end is `fd`: `fd`'s endpoints reversed,
// in `fd`'s namespace (the proxy creates its sockets to and from a pod in the pod's netns).
Result<FlowKey> app_flow_of_proxy_socket(int fd);

// Which bypass map holds a socket: the apps' ends are in sm_bypass (sk_msg runs on their sends),
// the proxy's in sm_bypass_proxy (where the apps' sends are redirected to; nothing runs on its
// own).
enum class BypassMap { kNone, kApps, kProxy };

class BypassFlows {
 public:
  // Opens <pin_root>/sm_bypass (looked up, and app sockets removed), <pin_root>/sm_bypass_proxy
  // (looked up) and <pin_root>/sm_stack_flows (written). Fails when sockmesh is not installed
  // there, or was built with another layout of the maps. A pin root installed by a loader older
  // than sm_bypass_proxy has every socket in sm_bypass: then only that one is looked in, until
  // the map appears (proxy_map_arrived(); still_pinned() turns false too).
  static Result<BypassFlows> open(const std::string& pin_root = SM_PIN_ROOT_DEFAULT);

  // Which map holds the socket with this key now. An unexpected kernel error is logged once and
  // read as "none" (the connection then just keeps the unbounded queue).
  BypassMap map_of(const FlowKey& socket) const;
  // Whether the socket with this key is in either map now.
  bool bypassed(const FlowKey& socket) const { return map_of(socket) != BypassMap::kNone; }
  // Sends the app's later bytes on flow `app` through the TCP stack. Idempotent.
  Status pin_to_stack(const FlowKey& app) const;
  // Takes the app's socket of flow `app` out of sm_bypass, which gives it back TCP's own receive
  // path. Only for a flow already pinned: without the pin, a send racing with the removal could
  // still be redirected. Loses nothing: nothing is ever redirected into an app's socket (only the
  // app's sends are), so its psock's queue is empty. Why it matters: while in the SOCKHASH, the
  // socket's recvmsg is tcp_bpf's, which answers a wakeup that brought no data (the ACKs of a
  // full send buffer, which only a flow on the stack path has) with EAGAIN, even on a blocking
  // socket (tests/loader/bypass_pinning_test.cc). Idempotent: an entry already gone is success.
  Status release_app_socket(const FlowKey& app) const;
  // Whether the flow is pinned (for tests and diagnostics).
  bool pinned(const FlowKey& app) const;

  // False once the loader removed or recreated the maps under the pin root.
  bool still_pinned() const;
  // Opened without sm_bypass_proxy, which a newer loader has pinned since: its sockops already
  // puts this proxy's sockets there, so the owner must open the maps again before its next
  // question (one access(2) per call, only while the pin root is an older loader's).
  bool proxy_map_arrived() const;
  const std::string& path() const { return stack_flows_.path(); }

 private:
  BypassFlows(std::string pin_root, PinnedMap bypass, std::optional<PinnedMap> proxy,
              PinnedMap stack_flows)
      : pin_root_(std::move(pin_root)),
        bypass_(std::move(bypass)),
        proxy_(std::move(proxy)),
        stack_flows_(std::move(stack_flows)) {}
  std::string pin_root_;
  PinnedMap bypass_;
  std::optional<PinnedMap> proxy_;  // absent: the pin root predates sm_bypass_proxy
  PinnedMap stack_flows_;
};

}  // namespace sockmesh::maps
