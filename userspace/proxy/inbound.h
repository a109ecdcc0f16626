#pragma once
// The HBONE server (port 15008): mutual TLS with the certificate of the workload that was dialled,
// then HTTP/2 CONNECT streams, each checked and relayed to the local application.
#include <boost/asio/ip/tcp.hpp>

namespace sockmesh::proxy {

struct ProxyContext;
class Worker;

class InboundHbone {
 public:
  explicit InboundHbone(ProxyContext& ctx) : ctx_(ctx) {}
  // On the worker that owns `socket`.
  void handle(Worker& worker, boost::asio::ip::tcp::socket socket);

 private:
  ProxyContext& ctx_;
};

}  // namespace sockmesh::proxy
