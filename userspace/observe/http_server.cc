#include "observe/http_server.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "base/log.h"

namespace sockmesh::observe {

namespace beast = boost::beast;
namespace http = boost::beast::http;
using Tcp = boost::asio::ip::tcp;

namespace {

std::string url_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%' && i + 2 < s.size()) {
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

HttpRequest parse_target(std::string_view target) {
  HttpRequest r;
  auto q = target.find('?');
  r.path = std::string(target.substr(0, q));
  if (q == std::string_view::npos) return r;
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    auto amp = rest.find('&');
    auto pair = rest.substr(0, amp);
    auto eq = pair.find('=');
    try {
      if (eq == std::string_view::npos) {
        r.query[url_decode(pair)] = "";
      } else {
        r.query[url_decode(pair.substr(0, eq))] = url_decode(pair.substr(eq + 1));
      }
    } catch (const std::exception&) {
      // A malformed escape: skip that pair.
    }
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
  return r;
}

}  // namespace

class HttpServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Tcp::socket s, HttpServer& server) : stream_(std::move(s)), server_(server) {}
  void start() { read(); }

 private:
  void read() {
    req_ = {};
    stream_.expires_after(std::chrono::seconds(30));
    http::async_read(stream_, buf_, req_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return;
                       self->respond();
                     });
  }
  void respond() {
    HttpRequest r = parse_target(std::string_view(req_.target().data(), req_.target().size()));
    r.method = std::string(req_.method_string());
    r.body = req_.body();
    HttpResponse out;
    auto it = server_.routes_.find(r.path);
    if (it == server_.routes_.end()) {
      out.status = 404;
      out.body = "unknown path " + r.path + "; known:";
      for (auto& [p, _] : server_.routes_) out.body += " " + p;
      out.body += "\n";
    } else {
      try {
        out = it->second(r);
      } catch (const std::exception& e) {
        out.status = 500;
        out.body = std::string("error: ") + e.what() + "\n";
      }
    }
    res_ = {};
    res_.version(req_.version());
    res_.result(static_cast<http::status>(out.status));
    res_.set(http::field::content_type, out.content_type);
    res_.set(http::field::server, "sockmesh");
    res_.body() = std::move(out.body);
    res_.keep_alive(req_.keep_alive());
    res_.prepare_payload();
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec || !self->res_.keep_alive()) {
        beast::error_code ignored;
        self->stream_.socket().shutdown(Tcp::socket::shutdown_send, ignored);
        return;
      }
      self->read();
    });
  }

  beast::tcp_stream stream_;
  HttpServer& server_;
  beast::flat_buffer buf_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
};

HttpServer::HttpServer(boost::asio::io_context& io, std::string name)
    : io_(io), name_(std::move(name)), acceptor_(io) {}

HttpServer::~HttpServer() { close(); }

void HttpServer::route(const std::string& path, Handler handler) {
  routes_[path] = std::move(handler);
}

std::optional<std::string> HttpServer::listen(const Endpoint& at) {
  sockaddr_storage ss{};
  at.to_sockaddr(&ss);
  Tcp::endpoint ep;
  std::memcpy(ep.data(), &ss, at.ip.is_v4() ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  boost::system::error_code ec;
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(Tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(128, ec);
  if (ec) return name_ + " server on " + at.to_string() + ": " + ec.message();
  SM_INFO("admin") << "listening: " << name_ << " on " << local_endpoint().to_string();
  accept();
  return std::nullopt;
}

Endpoint HttpServer::local_endpoint() const {
  boost::system::error_code ec;
  auto ep = acceptor_.local_endpoint(ec);
  auto e = Endpoint::from_sockaddr(ep.data());
  return e ? *e : Endpoint{};
}

void HttpServer::close() {
  boost::system::error_code ec;
  acceptor_.close(ec);
}

void HttpServer::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, Tcp::socket s) {
    if (ec == boost::asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) std::make_shared<Session>(std::move(s), *this)->start();
    accept();
  });
}

}  // namespace sockmesh::observe
