#pragma once
// Opens a TCP connection from the proxy to an application or peer, with the proxy's mark, an
// optional source address (the client's, so the server sees the real client IP), and a deadline.
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <functional>
#include <string>

#include "net/sockets.h"

namespace sockmesh::proxy {

struct DialResult {
  bool ok = false;
  bool timed_out = false;
  bool source_kept = false;
  std::string error;
};

using DialCallback = std::function<void(DialResult, boost::asio::ip::tcp::socket)>;

void dial(boost::asio::io_context& io, const Endpoint& target, const net::DialOptions& options,
          std::chrono::milliseconds timeout, DialCallback done);

}  // namespace sockmesh::proxy
