#pragma once
// A small HTTP/1.1 server for the admin (15000), metrics (15020) and readiness (15021) ports.
// Requests are answered by a handler on the control thread; bodies are small.
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "base/ip_address.h"

namespace sockmesh::observe {

struct HttpRequest {
  std::string method;
  std::string path;                           // without the query
  std::map<std::string, std::string> query;   // decoded ?a=b&c=d
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpServer(boost::asio::io_context& io, std::string name);
  ~HttpServer();
  // Exact path -> handler. Unknown paths get 404 with the list of known ones.
  void route(const std::string& path, Handler handler);
  std::optional<std::string> listen(const Endpoint& at);
  Endpoint local_endpoint() const;
  void close();

 private:
  void accept();
  class Session;

  boost::asio::io_context& io_;
  std::string name_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::map<std::string, Handler> routes_;
};

}  // namespace sockmesh::observe
