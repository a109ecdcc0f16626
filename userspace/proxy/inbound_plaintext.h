#pragma once
// Inbound plaintext (port 15006): a captured connection from outside the mesh to a local
// workload. There is no peer identity, so policy sees only addresses and ports.
#include <boost/asio/ip/tcp.hpp>

namespace sockmesh::proxy {

struct ProxyContext;
class Worker;

class InboundPlaintext {
 public:
  explicit InboundPlaintext(ProxyContext& ctx) : ctx_(ctx) {}
  void handle(Worker& worker, boost::asio::ip::tcp::socket socket);

 private:
  ProxyContext& ctx_;
};

}  // namespace sockmesh::proxy
