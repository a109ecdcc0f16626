#include "observe/http_server.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <cstring>
#include <optional>

#include "base/log.h"
#include "observe/metrics.h"

namespace sockmesh::observe {

namespace beast = boost::beast;
namespace http = boost::beast::http;
using Tcp = boost::asio::ip::tcp;

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Query decoding ('+' is a space, %XX a byte). nullopt when a '%' is not followed by two hex
// digits: such a query is refused whole (400) rather than read as something it does not say.
std::optional<std::string> url_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%') {
      int hi = i + 1 < s.size() ? hex_digit(s[i + 1]) : -1;
      int lo = i + 2 < s.size() ? hex_digit(s[i + 2]) : -1;
      if (hi < 0 || lo < 0) return std::nullopt;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The path and decoded query of a request target; nullopt for a malformed escape.
std::optional<HttpRequest> parse_target(std::string_view target) {
  HttpRequest r;
  auto q = target.find('?');
  r.path = std::string(target.substr(0, q));
  if (q == std::string_view::npos) return r;
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    auto amp = rest.find('&');
    auto pair = rest.substr(0, amp);
    auto eq = pair.find('=');
    auto key = url_decode(pair.substr(0, eq));
    auto value = eq == std::string_view::npos ? std::optional<std::string>("")
                                              : url_decode(pair.substr(eq + 1));
    if (!key || !value) return std::nullopt;
    r.query[*key] = *value;
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
  return r;
}

}  // namespace

struct HttpServer::Shared {
  std::string name;
  HttpLimits limits;
  std::map<std::string, Handler> routes;
  std::atomic<size_t> open{0};
  bool refusing = false;  // logs once per episode of shedding, not once per connection
  // Sessions waiting for a request, oldest first (by the order they began to wait).
  std::map<uint64_t, std::weak_ptr<Session>> waiting;
  uint64_t next_wait = 0;
  Counter* refused = nullptr;
  Counter* evicted = nullptr;
  Counter* too_large = nullptr;
  Counter* timed_out = nullptr;
  Counter* malformed = nullptr;
};

class HttpServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Tcp::socket s, std::shared_ptr<Shared> shared)
      : stream_(std::move(s)), shared_(std::move(shared)), buf_(shared_->limits.max_request_bytes) {
    shared_->open.fetch_add(1);
  }
  ~Session() {
    stop_waiting();
    release();
  }
  void start() { read(); }

  // Closes a session that is waiting for its request, to make room for a new connection.
  void evict() {
    stop_waiting();
    release();
    beast::error_code ignored;
    stream_.socket().set_option(boost::asio::socket_base::linger(true, 0), ignored);
    stream_.socket().close(ignored);  // the pending read ends with operation_aborted
  }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(shared_->limits.max_request_bytes));
    parser_->body_limit(shared_->limits.max_request_bytes);
    // One deadline for the whole request, however slowly its bytes trickle in.
    stream_.expires_after(shared_->limits.request_timeout);
    wait_seq_ = ++shared_->next_wait;
    shared_->waiting.emplace(wait_seq_, weak_from_this());
    http::async_read(
        stream_, buf_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    stop_waiting();
    if (!ec) {
      respond();
      return;
    }
    if (ec == http::error::end_of_stream || ec == boost::asio::error::eof ||
        ec == boost::asio::error::connection_reset || ec == boost::asio::error::operation_aborted) {
      return;
    }
    if (ec == beast::error::timeout) {
      count(shared_->timed_out);
      SM_DEBUG("admin") << shared_->name
                        << ": closing a connection whose request did not arrive in "
                        << shared_->limits.request_timeout.count() << " ms";
      return;
    }
    if (ec == http::error::header_limit || ec == http::error::body_limit ||
        ec == http::error::buffer_overflow) {
      count(shared_->too_large);
      SM_DEBUG("admin") << shared_->name << ": request larger than "
                        << shared_->limits.max_request_bytes << " bytes refused";
      send_error(413, "request too large: at most " +
                          std::to_string(shared_->limits.max_request_bytes) +
                          " bytes of headers and of body\n");
      return;
    }
    count(shared_->malformed);
    send_error(400, "malformed request: " + ec.message() + "\n");
  }

  void send_error(int status, std::string body) {
    HttpResponse out{status, "text/plain; charset=utf-8", std::move(body)};
    write(out, 11, false);
  }

  void respond() {
    const auto& req = parser_->get();
    auto parsed = parse_target(std::string_view(req.target().data(), req.target().size()));
    if (!parsed) {
      count(shared_->malformed);
      send_error(400, "malformed request: a '%' in the query is not followed by two hex digits\n");
      return;
    }
    HttpRequest r = std::move(*parsed);
    r.method = std::string(req.method_string());
    r.body = req.body();
    HttpResponse out;
    auto it = shared_->routes.find(r.path);
    if (it == shared_->routes.end()) {
      out.status = 404;
      out.body = "unknown path " + r.path + "; known:";
      for (auto& [p, _] : shared_->routes) out.body += " " + p;
      out.body += "\n";
    } else {
      try {
        out = it->second(r);
      } catch (const std::exception& e) {
        out.status = 500;
        out.body = std::string("error: ") + e.what() + "\n";
      }
    }
    write(out, req.version(), req.keep_alive());
  }

  void write(HttpResponse& out, unsigned version, bool keep_alive) {
    res_ = {};
    res_.version(version);
    res_.result(static_cast<http::status>(out.status));
    res_.set(http::field::content_type, out.content_type);
    res_.set(http::field::server, "sockmesh");
    res_.body() = std::move(out.body);
    res_.keep_alive(keep_alive);
    res_.prepare_payload();
    // A reader that takes the answer slowly gets as long as a request may take, then is closed.
    stream_.expires_after(shared_->limits.request_timeout);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec == beast::error::timeout) self->count(self->shared_->timed_out);
      if (ec || !self->res_.keep_alive()) {
        beast::error_code ignored;
        self->stream_.socket().shutdown(Tcp::socket::shutdown_send, ignored);
        return;
      }
      self->read();
    });
  }

  static void count(Counter* c) {
    if (c != nullptr) c->inc();
  }

  void stop_waiting() {
    if (wait_seq_ != 0) shared_->waiting.erase(wait_seq_);
    wait_seq_ = 0;
  }

  void release() {
    if (counted_) shared_->open.fetch_sub(1);
    counted_ = false;
  }

  uint64_t wait_seq_ = 0;  // key in shared_->waiting while a request is awaited
  bool counted_ = true;    // in shared_->open

  beast::tcp_stream stream_;
  std::shared_ptr<Shared> shared_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
};

HttpServer::HttpServer(boost::asio::io_context& io, std::string name, HttpLimits limits,
                       Registry* metrics)
    : acceptor_(io), accept_backoff_(io), shared_(std::make_shared<Shared>()) {
  shared_->name = std::move(name);
  shared_->limits = limits;
  if (shared_->limits.max_request_bytes < 1024) shared_->limits.max_request_bytes = 1024;
  if (shared_->limits.max_connections == 0) shared_->limits.max_connections = 1;
  if (shared_->limits.request_timeout < std::chrono::milliseconds(100)) {
    shared_->limits.request_timeout = std::chrono::milliseconds(100);
  }
  if (metrics != nullptr) {
    auto shed = [&](const char* reason) {
      return &metrics->counter(
          "sockmesh_http_connections_shed_total",
          "Connections to an admin, metrics or readiness listener closed because it had its "
          "maximum open (--http-max-connections): idle_evicted (the one waiting longest for a "
          "request, to make room), refused (a new one, when all were busy)",
          {{"listener", shared_->name}, {"reason", reason}});
    };
    shared_->refused = shed("refused");
    shared_->evicted = shed("idle_evicted");
    auto rejected = [&](const char* reason) {
      return &metrics->counter("sockmesh_http_requests_rejected_total",
                               "Requests to an admin, metrics or readiness listener refused: "
                               "too_large (--http-max-request-bytes), timeout (not received or "
                               "answer not taken in --http-request-timeout-ms), malformed",
                               {{"listener", shared_->name}, {"reason", reason}});
    };
    shared_->too_large = rejected("too_large");
    shared_->timed_out = rejected("timeout");
    shared_->malformed = rejected("malformed");
  }
}

HttpServer::~HttpServer() { close(); }

void HttpServer::route(const std::string& path, Handler handler) {
  shared_->routes[path] = std::move(handler);
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
  if (ec) return shared_->name + " server on " + at.to_string() + ": " + ec.message();
  SM_INFO("admin") << "listening: " << shared_->name << " on " << local_endpoint().to_string()
                   << " max_connections=" << shared_->limits.max_connections
                   << " request_timeout_ms=" << shared_->limits.request_timeout.count()
                   << " max_request_bytes=" << shared_->limits.max_request_bytes;
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
  accept_backoff_.cancel();
}

size_t HttpServer::open_connections() const { return shared_->open.load(); }

bool HttpServer::evict_oldest_waiting() {
  // A full listener makes room by closing the connection that has waited longest for its
  // request: clients that connect and send nothing only ever push each other out, while a
  // scraper, whose request follows its connect at once, gets through.
  while (!shared_->waiting.empty()) {
    auto oldest = shared_->waiting.begin()->second.lock();
    shared_->waiting.erase(shared_->waiting.begin());
    if (!oldest) continue;
    oldest->evict();
    if (shared_->evicted != nullptr) shared_->evicted->inc();
    if (!shared_->refusing) {
      SM_WARN("admin") << shared_->name << ": " << shared_->limits.max_connections
                       << " connections open (--http-max-connections); closing the ones that "
                          "wait longest for a request to make room for new ones";
      shared_->refusing = true;
    }
    return true;
  }
  return false;
}

void HttpServer::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, Tcp::socket s) {
    if (ec == boost::asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Out of file descriptors (or another accept error): try again shortly instead of at once,
      // which would spin this thread while the condition lasts.
      SM_WARN("admin") << shared_->name << ": accept failed: " << ec.message()
                       << "; retrying in 100 ms";
      accept_backoff_.expires_after(std::chrono::milliseconds(100));
      accept_backoff_.async_wait([this](boost::system::error_code e) {
        if (!e && acceptor_.is_open()) accept();
      });
      return;
    }
    const bool full = shared_->open.load() >= shared_->limits.max_connections;
    if (!full) shared_->refusing = false;
    if (full && !evict_oldest_waiting()) {
      // Every open connection is busy with a request or its answer (each bounded by the
      // request timeout): this one is closed at once.
      if (shared_->refused != nullptr) shared_->refused->inc();
      if (!shared_->refusing) {
        SM_WARN("admin") << shared_->name << ": " << shared_->limits.max_connections
                         << " connections open and busy (--http-max-connections); closing new "
                            "ones until one ends";
        shared_->refusing = true;
      }
      boost::system::error_code ignored;
      s.set_option(boost::asio::socket_base::linger(true, 0), ignored);
      s.close(ignored);
    } else {
      std::make_shared<Session>(std::move(s), shared_)->start();
    }
    accept();
  });
}

}  // namespace sockmesh::observe
