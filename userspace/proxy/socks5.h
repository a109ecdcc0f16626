#pragma once
// SOCKS5 (RFC 1928), no authentication, CONNECT only: an explicit way into the outbound side for
// applications and tests on this host, without any capture. Off unless configured; bind it to
// loopback only.
#include <boost/asio/ip/tcp.hpp>

namespace sockmesh::proxy {

struct ProxyContext;
class Worker;
class Outbound;

class Socks5 {
 public:
  Socks5(ProxyContext& ctx, Outbound& outbound) : ctx_(ctx), outbound_(outbound) {}
  void handle(Worker& worker, boost::asio::ip::tcp::socket socket);

 private:
  ProxyContext& ctx_;
  Outbound& outbound_;
};

}  // namespace sockmesh::proxy
