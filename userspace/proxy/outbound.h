#pragma once
// The outbound side: a connection from a local application whose original destination is known
// (a transparent 15001 listener, or SOCKS5). It resolves the destination (a service VIP picks an
// endpoint), then either tunnels it over HBONE to the destination's node or, for destinations
// outside the mesh, passes it through as plain TCP.
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <string>
#include <unordered_map>

#include "base/ip_address.h"
#include "observe/metrics.h"

namespace sockmesh::proxy {

struct ProxyContext;
class Worker;

struct OutboundOutcome {
  bool ok = false;
  std::string error;
  observe::ResponseFlags flags = observe::ResponseFlags::kNone;
  bool policy_denied = false;  // the destination refused by policy (HTTP 403)
  bool unreachable = false;    // no route or nobody listening
};

class Outbound {
 public:
  using ClientSocket = std::shared_ptr<boost::asio::ip::tcp::socket>;
  // Called once the upstream side is set up or has failed, before any byte is relayed. The role
  // that accepted the connection may answer its client first (SOCKS5), then calls proceed() on
  // success; on failure it closes the client itself.
  using Ready = std::function<void(const OutboundOutcome&, ClientSocket client,
                                   std::function<void()> proceed)>;

  explicit Outbound(ProxyContext& ctx) : ctx_(ctx) {}
  void handle(Worker& worker, boost::asio::ip::tcp::socket client, const Endpoint& client_addr,
              const Endpoint& original_destination, Ready ready = nullptr);

 private:
  ProxyContext& ctx_;
};

}  // namespace sockmesh::proxy
