#pragma once
// A small HTTP/1.1 server for the admin (15000), metrics (15020) and readiness (15021) ports.
// Requests are answered by a handler on the server's io_context (the proxy gives these servers a
// thread of their own, apart from the acceptors); bodies are small. Every listener is bounded:
// connections, request size, and the time a request may take to arrive and its answer to leave.
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "base/ip_address.h"

namespace sockmesh::observe {

class Registry;
class Counter;

struct HttpRequest {
  std::string method;
  std::string path;                          // without the query
  std::map<std::string, std::string> query;  // decoded ?a=b&c=d
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

struct HttpLimits {
  // Open connections per listener. One more makes room by closing the connection that has waited
  // longest for a request; if every one is busy answering, the new one is closed (both counted).
  size_t max_connections = 32;
  // A whole request (from the connection's first byte, or the previous answer) must arrive in
  // this, and its answer be written in this again; otherwise the connection is closed.
  std::chrono::milliseconds request_timeout{10000};
  // Request line + headers, and body, each at most this; larger gets 413 and a close.
  size_t max_request_bytes = 16384;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // `metrics` (optional) gets sockmesh_http_connections_shed_total and
  // sockmesh_http_requests_rejected_total with listener=`name`.
  HttpServer(boost::asio::io_context& io, std::string name, HttpLimits limits = {},
             Registry* metrics = nullptr);
  ~HttpServer();
  // Exact path -> handler. Unknown paths get 404 with the list of known ones.
  void route(const std::string& path, Handler handler);
  std::optional<std::string> listen(const Endpoint& at);
  Endpoint local_endpoint() const;
  void close();
  // Connections open now (for tests and diagnostics).
  size_t open_connections() const;

 private:
  void accept();
  bool evict_oldest_waiting();
  class Session;
  // What sessions share with the server; they keep it alive, so a session that outlives the
  // server (its handler still queued) touches nothing freed.
  struct Shared;

  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer accept_backoff_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace sockmesh::observe
