#include "dns/server.h"

// GCC 12 reports a false mismatched-new-delete inside Boost 1.74's awaitable frame allocator for
// some coroutine bodies (the frame is allocated and freed by the same class-specific operators).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "base/errno_text.h"
#include "base/log.h"
#include "dns/message.h"
#include "dns/names.h"

namespace sockmesh::dns {
namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using Udp = asio::ip::udp;
using Tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::string_view kScope = "dns";

std::string errno_message(int err) { return std::strerror(err); }

// One query's facts for metrics and the debug line.
struct QueryInfo {
  std::string name;
  uint16_t type = 0;
  bool tcp = false;
  Endpoint client;
  const char* protocol() const { return tcp ? "tcp" : "udp"; }
};

enum class Outcome { kDrop, kReply, kForward };

struct Decision {
  Outcome outcome = Outcome::kDrop;
  std::vector<uint8_t> reply;
  uint16_t id = 0;
  uint16_t flags = 0;
  std::optional<Question> question;
};

int default_open(int family, int type, std::string* error) {
  int fd = ::socket(family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) *error = "socket(): " + errno_message(errno);
  return fd;
}

}  // namespace

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  asio::io_context& io;
  ServerOptions options;
  SnapshotSource snapshot_source;
  observe::Registry& metrics;
  ServerStats stats;

  state::SnapshotPtr table_snapshot;
  std::unique_ptr<NameTable> table;

  size_t inflight = 0;
  std::map<IpAddress, size_t> inflight_by_client;
  std::map<IpAddress, size_t> tcp_by_client;
  bool mark_warned = false;
  bool stopped = false;

  struct Served {
    std::shared_ptr<Udp::socket> udp;
    std::shared_ptr<Tcp::acceptor> tcp;
  };
  std::multimap<std::string, Served> served;
  // Transparent sockets bound to an address the pod asked (e.g. 10.96.0.10:53), per tag.
  std::map<std::pair<std::string, Endpoint>, int> reply_sockets;

  Impl(asio::io_context& io_, ServerOptions o, SnapshotSource s, observe::Registry& m)
      : io(io_), options(std::move(o)), snapshot_source(std::move(s)), metrics(m) {}
  ~Impl() {
    for (auto& [k, fd] : reply_sockets) ::close(fd);
  }

  const NameTable& names(state::SnapshotPtr* snap) {
    *snap = snapshot_source ? snapshot_source() : nullptr;
    if (!*snap) *snap = std::make_shared<const state::Snapshot>();
    if (!table || table_snapshot != *snap) {
      table = std::make_unique<NameTable>(**snap, options.cluster_domain);
      table_snapshot = *snap;
    }
    return *table;
  }

  observe::Labels labels(const QueryInfo& q, const state::Workload* source) const {
    return {
        {"request_query_type", std::string(type_name(q.type))},
        {"request_protocol", q.protocol()},
        {"source_canonical_service",
         source && !source->canonical_name.empty() ? source->canonical_name : "unknown"},
        {"source_canonical_revision",
         source && !source->canonical_revision.empty() ? source->canonical_revision : "unknown"}};
  }
  observe::Counter& counter(std::string_view name, const QueryInfo& q,
                            const state::Workload* source) {
    std::string_view help = name == "istio_dns_requests_total" ? "Total number of DNS requests"
                            : name == "istio_dns_upstream_requests_total"
                                ? "Total number of DNS requests forwarded to upstream"
                                : "Total number of DNS requests that failed to forward upstream";
    return metrics.counter(name, help, labels(q, source));
  }
  observe::Counter& dropped(std::string_view reason) {
    return metrics.counter("sockmesh_dns_dropped_total",
                           "DNS queries the proxy dropped without an answer, by reason",
                           {{"reason", std::string(reason)}});
  }
  void observe_duration(const QueryInfo& q, const state::Workload* source, Clock::duration d) {
    // Buckets as ztunnel's (src/dns/metrics.rs): 0.5 ms, 1 ms, 10 ms, 100 ms, 1 s, 5 s.
    static const std::vector<double> kBuckets{0.0005, 0.001, 0.01, 0.1, 1, 5};
    metrics
        .histogram("istio_dns_upstream_request_duration_seconds",
                   "Total time in seconds to get a DNS response from upstream", kBuckets,
                   labels(q, source))
        .observe(std::chrono::duration<double>(d).count());
  }

  void set_mark(int fd) {
    if (options.upstream_mark == 0) return;
    uint32_t mark = options.upstream_mark;
    if (::setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof mark) != 0 && !mark_warned) {
      mark_warned = true;
      SM_WARN(kScope) << "cannot set SO_MARK on DNS upstream sockets (" << errno_message(errno)
                      << "); tc capture may take the proxy's own queries";
    }
  }

  // Parses and either answers, drops or asks for forwarding.
  Decision decide(std::span<const uint8_t> bytes, QueryInfo* info, const state::Workload** src) {
    Decision d;
    ++stats.queries;
    state::SnapshotPtr snap;
    const NameTable& table_ref = names(&snap);
    *src = snap->workload_by_ip(info->client.ip);
    auto header = parse_header(bytes);
    if (!header || header->qr()) {
      ++stats.malformed;
      dropped("malformed").inc();
      SM_DEBUG(kScope) << "dropped from " << info->client.to_string() << " over "
                       << info->protocol() << ": "
                       << (header ? "a response, not a query" : header.error().message);
      return d;
    }
    d.id = header->id;
    d.flags = header->flags;
    auto query = parse_query(bytes);
    if (!query) {
      ++stats.malformed;
      counter("istio_dns_requests_total", *info, *src).inc();
      SM_DEBUG(kScope) << "refused query from " << info->client.to_string() << " over "
                       << info->protocol() << ": FORMERR (" << query.error().message << ")";
      d.outcome = Outcome::kReply;
      d.reply = build_error(d.id, d.flags, nullptr, Rcode::kFormErr);
      return d;
    }
    info->name = query->question.name;
    info->type = query->question.type;
    d.question = query->question;
    counter("istio_dns_requests_total", *info, *src).inc();
    if (query->header.opcode() != 0) {
      SM_DEBUG(kScope) << "refused " << info->name << " from " << info->client.to_string()
                       << ": NOTIMP (opcode " << int(query->header.opcode()) << ")";
      d.outcome = Outcome::kReply;
      d.reply = build_error(d.id, d.flags, &*d.question, Rcode::kNotImp);
      return d;
    }
    if (query->question.klass == kClassIn) {
      const std::string ns = *src ? (*src)->namespace_name : std::string();
      NameAnswer a = table_ref.lookup(info->name, info->type, ns);
      if (a.known) {
        ++stats.answered_locally;
        SM_DEBUG(kScope) << "answered locally " << info->name << " " << type_name(info->type)
                         << " for " << info->client.to_string() << " (namespace "
                         << (ns.empty() ? "unknown" : ns) << ") as " << a.matched << ": "
                         << a.addresses.size() << " address(es) over " << info->protocol();
        d.outcome = Outcome::kReply;
        d.reply = build_answer(*query, a.addresses, options.answer_ttl_seconds);
        return d;
      }
    }
    if (inflight >= options.max_inflight) {
      ++stats.dropped_global_limit;
      dropped("global_limit").inc();
      SM_DEBUG(kScope) << "dropped " << info->name << " from " << info->client.to_string() << ": "
                       << inflight << " upstream queries in flight (the limit)";
      return d;
    }
    if (inflight_by_client[info->client.ip] >= options.max_inflight_per_client) {
      ++stats.dropped_client_limit;
      dropped("client_limit").inc();
      SM_DEBUG(kScope) << "dropped " << info->name << " from " << info->client.to_string()
                       << ": the client has " << options.max_inflight_per_client
                       << " upstream queries in flight (the limit)";
      return d;
    }
    d.outcome = Outcome::kForward;
    return d;
  }

  struct Attempt {
    std::optional<std::vector<uint8_t>> reply;
    std::string error;
  };

  awaitable<Attempt> ask_udp(const Binding& b, const Endpoint& up, std::vector<uint8_t> query,
                             uint16_t id, Clock::time_point deadline) {
    Attempt r;
    const int family = up.ip.is_v4() ? AF_INET : AF_INET6;
    int fd = (b.open_socket ? b.open_socket : default_open)(family, SOCK_DGRAM, &r.error);
    if (fd < 0) co_return r;
    set_mark(fd);
    boost::system::error_code ec;
    auto s = std::make_shared<Udp::socket>(io);
    s->assign(family == AF_INET ? Udp::v4() : Udp::v6(), fd, ec);
    if (ec) {
      ::close(fd);
      r.error = "assign: " + ec.message();
      co_return r;
    }
    s->connect(Udp::endpoint(asio::ip::make_address(up.ip.to_string()), up.port), ec);
    if (!ec) s->send(asio::buffer(query), 0, ec);
    if (ec) {
      r.error = "send: " + ec.message();
      co_return r;
    }
    asio::steady_timer timer(io, deadline);
    timer.async_wait([s](boost::system::error_code e) {
      if (!e) s->close(e);
    });
    std::vector<uint8_t> buf(kMaxMessageSize);
    while (true) {
      size_t n =
          co_await s->async_receive(asio::buffer(buf), asio::redirect_error(use_awaitable, ec));
      if (ec) {
        r.error =
            ec == asio::error::operation_aborted || !s->is_open() ? "timed out" : ec.message();
        break;
      }
      if (n >= 2 && ((buf[0] << 8) | buf[1]) == id) {
        buf.resize(n);
        r.reply = std::move(buf);
        break;
      }
    }
    timer.cancel();
    co_return r;
  }

  awaitable<Attempt> ask_tcp(const Binding& b, const Endpoint& up, std::vector<uint8_t> query,
                             Clock::time_point deadline) {
    Attempt r;
    const int family = up.ip.is_v4() ? AF_INET : AF_INET6;
    int fd = (b.open_socket ? b.open_socket : default_open)(family, SOCK_STREAM, &r.error);
    if (fd < 0) co_return r;
    set_mark(fd);
    boost::system::error_code ec;
    auto s = std::make_shared<Tcp::socket>(io);
    s->assign(family == AF_INET ? Tcp::v4() : Tcp::v6(), fd, ec);
    if (ec) {
      ::close(fd);
      r.error = "assign: " + ec.message();
      co_return r;
    }
    asio::steady_timer timer(io, deadline);
    timer.async_wait([s](boost::system::error_code e) {
      if (!e) s->close(e);
    });
    auto timed_out = [&] { return !s->is_open(); };
    co_await s->async_connect(Tcp::endpoint(asio::ip::make_address(up.ip.to_string()), up.port),
                              asio::redirect_error(use_awaitable, ec));
    if (!ec) {
      std::array<uint8_t, 2> len{static_cast<uint8_t>(query.size() >> 8),
                                 static_cast<uint8_t>(query.size() & 0xFF)};
      std::array<asio::const_buffer, 2> out{asio::buffer(len), asio::buffer(query)};
      co_await asio::async_write(*s, out, asio::redirect_error(use_awaitable, ec));
    }
    std::array<uint8_t, 2> len{};
    if (!ec)
      co_await asio::async_read(*s, asio::buffer(len), asio::redirect_error(use_awaitable, ec));
    if (!ec) {
      std::vector<uint8_t> buf((len[0] << 8) | len[1]);
      co_await asio::async_read(*s, asio::buffer(buf), asio::redirect_error(use_awaitable, ec));
      if (!ec) r.reply = std::move(buf);
    }
    if (ec) r.error = timed_out() ? "timed out" : ec.message();
    timer.cancel();
    boost::system::error_code ignored;
    s->close(ignored);
    co_return r;
  }

  // Forwards to the upstreams in order until one answers or the timeout passes; SERVFAIL then.
  awaitable<std::vector<uint8_t>> forward(Binding b, std::vector<uint8_t> query, Decision d,
                                          QueryInfo info, const state::Workload* source_ptr) {
    // The workload may vanish with its snapshot while we wait: copy what the metrics need.
    std::optional<state::Workload> source;
    if (source_ptr) source = *source_ptr;
    const state::Workload* src = source ? &*source : nullptr;
    ++inflight;
    ++inflight_by_client[info.client.ip];
    ++stats.forwarded;
    auto self = shared_from_this();
    const auto start = Clock::now();
    const auto deadline = start + options.upstream_timeout;
    std::string errors;
    std::optional<std::vector<uint8_t>> reply;
    for (const auto& up : options.upstreams) {
      if (Clock::now() >= deadline) break;
      counter("istio_dns_upstream_requests_total", info, src).inc();
      Attempt a;
      if (info.tcp) {
        a = co_await ask_tcp(b, up, query, deadline);
      } else {
        a = co_await ask_udp(b, up, query, d.id, deadline);
      }
      if (a.reply) {
        reply = std::move(a.reply);
        SM_DEBUG(kScope) << "forwarded " << info.name << " " << type_name(info.type) << " for "
                         << info.client.to_string() << " to " << up.to_string() << " over "
                         << info.protocol() << ": " << reply->size() << " bytes relayed";
        break;
      }
      counter("istio_dns_upstream_failures_total", info, src).inc();
      if (!errors.empty()) errors += "; ";
      errors += up.to_string() + ": " + a.error;
    }
    observe_duration(info, src, Clock::now() - start);
    --inflight;
    if (--inflight_by_client[info.client.ip] == 0) inflight_by_client.erase(info.client.ip);
    std::vector<uint8_t> out;
    if (reply) {
      out = std::move(*reply);
      co_return out;
    }
    ++stats.upstream_failures;
    SM_DEBUG(kScope) << "SERVFAIL for " << info.name << " " << type_name(info.type) << " from "
                     << info.client.to_string() << ": no upstream answered ("
                     << (errors.empty() ? std::string("no upstream configured") : errors) << ")";
    out = build_error(d.id, d.flags, d.question ? &*d.question : nullptr, Rcode::kServFail);
    co_return out;
  }

  // Sends a UDP reply from `origdst` when that is not the listener's own address.
  void send_udp_reply(Udp::socket& listener, const Binding& b, const Endpoint& local,
                      const std::optional<Endpoint>& origdst, const sockaddr_storage& to,
                      socklen_t to_len, const std::vector<uint8_t>& reply) {
    int fd = listener.native_handle();
    const bool foreign = origdst && (origdst->port != local.port ||
                                     (!local.ip.is_unspecified() && origdst->ip != local.ip));
    if (foreign) {
      fd = reply_socket(b, *origdst);
      if (fd < 0) return;
    }
    if (::sendto(fd, reply.data(), reply.size(), MSG_DONTWAIT,
                 reinterpret_cast<const sockaddr*>(&to), to_len) < 0) {
      SM_DEBUG(kScope) << "cannot send a DNS reply to "
                       << Endpoint::from_sockaddr(reinterpret_cast<const sockaddr*>(&to))
                              .value_or(Endpoint{})
                              .to_string()
                       << ": " << errno_message(errno);
    }
  }

  int reply_socket(const Binding& b, const Endpoint& from) {
    auto key = std::make_pair(b.tag, from);
    if (auto it = reply_sockets.find(key); it != reply_sockets.end()) return it->second;
    std::string error;
    const bool v4 = from.ip.is_v4();
    int fd =
        (b.open_socket ? b.open_socket : default_open)(v4 ? AF_INET : AF_INET6, SOCK_DGRAM, &error);
    if (fd < 0) {
      SM_WARN(kScope) << "cannot open a reply socket for " << from.to_string() << ": " << error;
      return -1;
    }
    int one = 1;
    set_mark(fd);
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = v4 ? ::setsockopt(fd, SOL_IP, IP_TRANSPARENT, &one, sizeof one)
                : ::setsockopt(fd, SOL_IPV6, IPV6_TRANSPARENT, &one, sizeof one);
    sockaddr_storage ss;
    socklen_t len = from.to_sockaddr(&ss);
    if (rc != 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&ss), len) != 0) {
      SM_WARN(kScope) << "cannot reply from " << from.to_string()
                      << " (transparent bind: " << errno_message(errno) << ")";
      ::close(fd);
      return -1;
    }
    reply_sockets.emplace(key, fd);
    return fd;
  }

  awaitable<void> udp_loop(std::shared_ptr<Udp::socket> sock, Binding b, Endpoint local) {
    auto self = shared_from_this();
    std::vector<uint8_t> buf(kMaxMessageSize + 1);
    while (!stopped && sock->is_open()) {
      boost::system::error_code ec;
      co_await sock->async_wait(Udp::socket::wait_read, asio::redirect_error(use_awaitable, ec));
      if (ec || !sock->is_open()) co_return;
      for (int batch = 0; batch < 64 && sock->is_open(); ++batch) {
        sockaddr_storage from{};
        alignas(cmsghdr) std::array<char, 256> control{};
        iovec iov{buf.data(), buf.size()};
        msghdr mh{};
        mh.msg_name = &from;
        mh.msg_namelen = sizeof from;
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = control.data();
        mh.msg_controllen = control.size();
        ssize_t n = ::recvmsg(sock->native_handle(), &mh, MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) {
            SM_DEBUG(kScope) << "recvmsg on the DNS UDP socket: " << errno_message(errno);
          }
          break;
        }
        std::optional<Endpoint> origdst;
        for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
          if ((c->cmsg_level == SOL_IP && c->cmsg_type == IP_ORIGDSTADDR) ||
              (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_ORIGDSTADDR)) {
            sockaddr_storage od{};
            std::memcpy(&od, CMSG_DATA(c), std::min<size_t>(c->cmsg_len - CMSG_LEN(0), sizeof od));
            origdst = Endpoint::from_sockaddr(reinterpret_cast<const sockaddr*>(&od));
          }
        }
        auto client = Endpoint::from_sockaddr(reinterpret_cast<const sockaddr*>(&from));
        if (!client) continue;
        if (static_cast<size_t>(n) > kMaxMessageSize) {
          ++stats.malformed;
          dropped("malformed").inc();
          continue;
        }
        QueryInfo info{{}, 0, false, *client};
        const state::Workload* src = nullptr;
        std::span<const uint8_t> bytes(buf.data(), static_cast<size_t>(n));
        Decision d = decide(bytes, &info, &src);
        if (d.outcome == Outcome::kReply) {
          send_udp_reply(*sock, b, local, origdst, from, mh.msg_namelen, d.reply);
        } else if (d.outcome == Outcome::kForward) {
          std::vector<uint8_t> query(bytes.begin(), bytes.end());
          socklen_t from_len = mh.msg_namelen;
          asio::co_spawn(
              io,
              [self, sock, b, local, origdst, from, from_len, query = std::move(query), d, info,
               src]() mutable -> awaitable<void> {
                auto reply = co_await self->forward(b, std::move(query), d, info, src);
                if (sock->is_open()) {
                  self->send_udp_reply(*sock, b, local, origdst, from, from_len, reply);
                }
              },
              asio::detached);
        }
      }
    }
  }

  awaitable<void> tcp_connection(std::shared_ptr<Tcp::socket> s, Binding b, Endpoint client) {
    auto self = shared_from_this();
    asio::steady_timer idle(io);
    auto arm = [&] {
      idle.expires_after(options.tcp_idle_timeout);
      idle.async_wait([s](boost::system::error_code e) {
        if (!e) s->close(e);
      });
    };
    while (!stopped && s->is_open()) {
      boost::system::error_code ec;
      arm();
      std::array<uint8_t, 2> len{};
      co_await asio::async_read(*s, asio::buffer(len), asio::redirect_error(use_awaitable, ec));
      if (ec) break;
      const size_t n = (len[0] << 8) | len[1];
      std::vector<uint8_t> msg(n);
      co_await asio::async_read(*s, asio::buffer(msg), asio::redirect_error(use_awaitable, ec));
      if (ec) break;
      idle.cancel();
      QueryInfo info{{}, 0, true, client};
      const state::Workload* src = nullptr;
      Decision d = decide(msg, &info, &src);
      std::vector<uint8_t> reply;
      if (d.outcome == Outcome::kReply) {
        reply = std::move(d.reply);
      } else if (d.outcome == Outcome::kForward) {
        reply = co_await forward(b, std::move(msg), d, info, src);
      } else {
        break;  // not a DNS query at all: end the connection
      }
      if (!s->is_open()) break;
      std::array<uint8_t, 2> out_len{static_cast<uint8_t>(reply.size() >> 8),
                                     static_cast<uint8_t>(reply.size() & 0xFF)};
      std::array<asio::const_buffer, 2> out{asio::buffer(out_len), asio::buffer(reply)};
      arm();
      co_await asio::async_write(*s, out, asio::redirect_error(use_awaitable, ec));
      idle.cancel();
      if (ec) break;
    }
    idle.cancel();
    boost::system::error_code ignored;
    s->close(ignored);
    if (--tcp_by_client[client.ip] == 0) tcp_by_client.erase(client.ip);
  }

  awaitable<void> accept_loop(std::shared_ptr<Tcp::acceptor> acc, Binding b) {
    auto self = shared_from_this();
    while (!stopped && acc->is_open()) {
      boost::system::error_code ec;
      auto s = std::make_shared<Tcp::socket>(io);
      co_await acc->async_accept(*s, asio::redirect_error(use_awaitable, ec));
      if (ec) {
        if (ec == asio::error::operation_aborted || !acc->is_open()) co_return;
        SM_DEBUG(kScope) << "accept on the DNS TCP listener: " << ec.message();
        continue;
      }
      auto remote = s->remote_endpoint(ec);
      if (ec) continue;
      Endpoint client{*IpAddress::parse(remote.address().to_string()), remote.port()};
      if (tcp_by_client[client.ip] >= options.max_tcp_connections_per_client) {
        ++stats.tcp_refused_client_limit;
        dropped("tcp_connection_limit").inc();
        SM_DEBUG(kScope) << "closed a DNS TCP connection from " << client.to_string() << ": "
                         << options.max_tcp_connections_per_client
                         << " connections from it are open (the limit)";
        s->close(ec);
        continue;
      }
      ++tcp_by_client[client.ip];
      asio::co_spawn(io, tcp_connection(s, b, client), asio::detached);
    }
  }
};

Server::Server(asio::io_context& io, ServerOptions options, SnapshotSource snapshot,
               observe::Registry& metrics)
    : impl_(std::make_shared<Impl>(io, std::move(options), std::move(snapshot), metrics)) {}

Server::~Server() { stop(); }

std::shared_ptr<Server> Server::create(asio::io_context& io, ServerOptions options,
                                       SnapshotSource snapshot, observe::Registry& metrics) {
  return std::shared_ptr<Server>(new Server(io, std::move(options), std::move(snapshot), metrics));
}

const ServerStats& Server::stats() const { return impl_->stats; }

namespace {
std::optional<Endpoint> local_of(int fd, int* family) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return std::nullopt;
  *family = ss.ss_family;
  return Endpoint::from_sockaddr(reinterpret_cast<const sockaddr*>(&ss));
}
}  // namespace

Status Server::serve_udp(int fd, Binding binding) {
  int family = 0;
  auto local = local_of(fd, &family);
  if (!local) {
    int err = errno;
    ::close(fd);
    return Error{"DNS UDP socket: getsockname failed: " + errno_message(err)};
  }
  int one = 1;
  // The address the client asked, so that a captured query's reply leaves from it.
  if (family == AF_INET) {
    ::setsockopt(fd, SOL_IP, IP_RECVORIGDSTADDR, &one, sizeof one);
  } else {
    ::setsockopt(fd, SOL_IPV6, IPV6_RECVORIGDSTADDR, &one, sizeof one);
    ::setsockopt(fd, SOL_IP, IP_RECVORIGDSTADDR, &one, sizeof one);  // v4-mapped clients
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  auto sock = std::make_shared<Udp::socket>(impl_->io);
  boost::system::error_code ec;
  sock->assign(family == AF_INET ? Udp::v4() : Udp::v6(), fd, ec);
  if (ec) {
    ::close(fd);
    return Error{"DNS UDP socket " + local->to_string() + ": " + ec.message()};
  }
  impl_->served.emplace(binding.tag, Impl::Served{sock, nullptr});
  SM_INFO(kScope) << "serving DNS over UDP on " << local->to_string()
                  << (binding.tag.empty() ? "" : " for " + binding.tag);
  asio::co_spawn(impl_->io, impl_->udp_loop(sock, std::move(binding), *local), asio::detached);
  return {};
}

Status Server::serve_tcp(int fd, Binding binding) {
  int family = 0;
  auto local = local_of(fd, &family);
  if (!local) {
    int err = errno;
    ::close(fd);
    return Error{"DNS TCP listener: getsockname failed: " + errno_message(err)};
  }
  auto acc = std::make_shared<Tcp::acceptor>(impl_->io);
  boost::system::error_code ec;
  acc->assign(family == AF_INET ? Tcp::v4() : Tcp::v6(), fd, ec);
  if (ec) {
    ::close(fd);
    return Error{"DNS TCP listener " + local->to_string() + ": " + ec.message()};
  }
  impl_->served.emplace(binding.tag, Impl::Served{nullptr, acc});
  SM_INFO(kScope) << "serving DNS over TCP on " << local->to_string()
                  << (binding.tag.empty() ? "" : " for " + binding.tag);
  asio::co_spawn(impl_->io, impl_->accept_loop(acc, std::move(binding)), asio::detached);
  return {};
}

void Server::close_tag(const std::string& tag) {
  auto [lo, hi] = impl_->served.equal_range(tag);
  for (auto it = lo; it != hi; ++it) {
    boost::system::error_code ec;
    if (it->second.udp) it->second.udp->close(ec);
    if (it->second.tcp) it->second.tcp->close(ec);
  }
  impl_->served.erase(lo, hi);
  for (auto it = impl_->reply_sockets.begin(); it != impl_->reply_sockets.end();) {
    if (it->first.first == tag) {
      ::close(it->second);
      it = impl_->reply_sockets.erase(it);
    } else {
      ++it;
    }
  }
}

void Server::stop() {
  impl_->stopped = true;
  for (auto& [tag, s] : impl_->served) {
    boost::system::error_code ec;
    if (s.udp) s.udp->close(ec);
    if (s.tcp) s.tcp->close(ec);
  }
  impl_->served.clear();
}

int open_dns_socket(int type, const Endpoint& at, bool transparent, uint32_t mark,
                    std::string* error) {
  const int family = at.ip.is_v4() ? AF_INET : AF_INET6;
  const char* what = type == SOCK_DGRAM ? "DNS UDP socket" : "DNS TCP listener";
  int fd = ::socket(family, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  auto fail = [&](const std::string& step) {
    *error =
        std::string(what) + " on " + at.to_string() + ": " + step + ": " + errno_message(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  };
  if (fd < 0) return fail("socket()");
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  if (family == AF_INET6 && ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0) {
    return fail("IPV6_V6ONLY");
  }
  if (transparent) {
    int r = family == AF_INET ? ::setsockopt(fd, SOL_IP, IP_TRANSPARENT, &one, sizeof one)
                              : ::setsockopt(fd, SOL_IPV6, IPV6_TRANSPARENT, &one, sizeof one);
    if (r != 0) return fail("IP_TRANSPARENT (needs CAP_NET_ADMIN)");
  }
  if (mark != 0 && ::setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof mark) != 0) {
    return fail("SO_MARK (needs CAP_NET_ADMIN)");
  }
  sockaddr_storage ss{};
  socklen_t len = at.to_sockaddr(&ss);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&ss), len) != 0) return fail("bind");
  if (type == SOCK_STREAM && ::listen(fd, 1024) != 0) return fail("listen");
  return fd;
}

std::vector<Endpoint> nameservers_from_resolv_conf(const std::string& path) {
  std::vector<Endpoint> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key, value;
    if (!(ls >> key >> value) || key != "nameserver") continue;
    if (auto pct = value.find('%'); pct != std::string::npos) value.resize(pct);
    if (auto ip = IpAddress::parse(value)) out.push_back(Endpoint{*ip, 53});
  }
  return out;
}

std::optional<std::vector<Endpoint>> parse_upstreams(std::string_view text, std::string* error) {
  std::vector<Endpoint> out;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    if (auto ip = IpAddress::parse(item)) {
      out.push_back(Endpoint{*ip, 53});
    } else if (auto ep = Endpoint::parse(item)) {
      out.push_back(*ep);
    } else {
      *error = "'" + std::string(item) + "' is not IP, IP:PORT or [IPv6]:PORT";
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace sockmesh::dns
