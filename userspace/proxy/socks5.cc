#include "proxy/socks5.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <array>

#include "base/log.h"
#include "net/sockets.h"
#include "proxy/context.h"
#include "proxy/outbound.h"

namespace sockmesh::proxy {
namespace {

using Tcp = boost::asio::ip::tcp;
using boost::asio::awaitable;
using boost::asio::use_awaitable;

enum Reply : uint8_t {
  kSucceeded = 0,
  kGeneralFailure = 1,
  kNotAllowed = 2,
  kHostUnreachable = 4,
  kConnectionRefused = 5,
  kCommandNotSupported = 7,
  kAddressTypeNotSupported = 8,
};

std::array<uint8_t, 10> reply(uint8_t code) {
  return {5, code, 0, 1, 0, 0, 0, 0, 0, 0};
}

// Peer-supplied text for a log line: control characters, DEL, bytes outside ASCII and the
// backslash come out as \xNN, so a hostname cannot forge log lines or terminal escapes.
std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

// Why `client` may not use the SOCKS5 entry, or nullopt when --socks5-clients grants it a local
// workload that (still) owns that address.
std::optional<std::string> refusal(ProxyContext& ctx, const IpAddress& client) {
  const Socks5Client* grant = nullptr;
  for (const auto& c : ctx.config.socks5_clients) {
    if (c.source == client) grant = &c;
  }
  if (grant == nullptr)
    return "source " + client.to_string() + " is not listed in --socks5-clients";
  auto snap = ctx.store->get();
  const state::Workload* named = snap->workload_by_uid(grant->workload_uid);
  if (named == nullptr) {
    return "workload " + grant->workload_uid + " (granted to " + client.to_string() +
           " by --socks5-clients) is not in the mesh state";
  }
  if (ctx.local_workload(*snap, client) != named) {
    return "source " + client.to_string() + " is not an address of local workload " +
           grant->workload_uid + " (granted by --socks5-clients)";
  }
  return std::nullopt;
}

const state::Service* service_by_hostname(const state::Snapshot& snap, const std::string& host) {
  for (const auto& s : snap.services()) {
    if (s.hostname == host) return &s;
  }
  return nullptr;
}

struct Negotiated {
  bool ok = false;
  Endpoint destination;
};

// Reads the greeting and the request; answers errors itself.
awaitable<Negotiated> negotiate(ProxyContext& ctx, Tcp::socket& s) {
  Negotiated out;
  uint8_t head[2];
  co_await boost::asio::async_read(s, boost::asio::buffer(head), use_awaitable);
  if (head[0] != 5 || head[1] == 0) {
    SM_INFO("socks5") << "not a SOCKS5 greeting (version " << int(head[0]) << ")";
    co_return out;
  }
  std::vector<uint8_t> methods(head[1]);
  co_await boost::asio::async_read(s, boost::asio::buffer(methods), use_awaitable);
  bool no_auth = std::find(methods.begin(), methods.end(), 0) != methods.end();
  uint8_t choice[2] = {5, static_cast<uint8_t>(no_auth ? 0 : 0xff)};
  co_await boost::asio::async_write(s, boost::asio::buffer(choice), use_awaitable);
  if (!no_auth) co_return out;

  uint8_t req[4];
  co_await boost::asio::async_read(s, boost::asio::buffer(req), use_awaitable);
  if (req[0] != 5) co_return out;
  if (req[1] != 1) {
    auto r = reply(kCommandNotSupported);
    co_await boost::asio::async_write(s, boost::asio::buffer(r), use_awaitable);
    co_return out;
  }
  std::optional<IpAddress> ip;
  if (req[3] == 1) {
    std::array<uint8_t, 4> a;
    co_await boost::asio::async_read(s, boost::asio::buffer(a), use_awaitable);
    ip = IpAddress::v4((uint32_t(a[0]) << 24) | (uint32_t(a[1]) << 16) | (uint32_t(a[2]) << 8) |
                       a[3]);
  } else if (req[3] == 4) {
    std::array<uint8_t, 16> a;
    co_await boost::asio::async_read(s, boost::asio::buffer(a), use_awaitable);
    ip = IpAddress::from_bytes16(a);
  } else if (req[3] == 3) {
    uint8_t len = 0;
    co_await boost::asio::async_read(s, boost::asio::buffer(&len, 1), use_awaitable);
    std::string host(len, '\0');
    co_await boost::asio::async_read(s, boost::asio::buffer(host), use_awaitable);
    // Names resolve against the mesh's services only: the proxy does no DNS.
    auto snap = ctx.store->get();
    if (const auto* svc = service_by_hostname(*snap, host); svc && !svc->vips.empty()) {
      ip = svc->vips.front().ip;
    } else if (auto literal = IpAddress::parse(host)) {
      ip = literal;
    }
    if (!ip) {
      SM_INFO("socks5") << "unknown host \"" << printable(host) << "\"";
      uint8_t port[2];
      co_await boost::asio::async_read(s, boost::asio::buffer(port), use_awaitable);
      auto r = reply(kHostUnreachable);
      co_await boost::asio::async_write(s, boost::asio::buffer(r), use_awaitable);
      co_return out;
    }
  } else {
    auto r = reply(kAddressTypeNotSupported);
    co_await boost::asio::async_write(s, boost::asio::buffer(r), use_awaitable);
    co_return out;
  }
  uint8_t port[2];
  co_await boost::asio::async_read(s, boost::asio::buffer(port), use_awaitable);
  out.destination = Endpoint{*ip, static_cast<uint16_t>((port[0] << 8) | port[1])};
  out.ok = out.destination.port != 0;
  if (!out.ok) {
    auto r = reply(kGeneralFailure);
    co_await boost::asio::async_write(s, boost::asio::buffer(r), use_awaitable);
  }
  co_return out;
}

}  // namespace

void Socks5::handle(Worker& worker, Tcp::socket socket) {
  boost::system::error_code ec;
  auto peer = socket.remote_endpoint(ec);
  if (ec) return;
  net::set_nodelay(socket);
  auto sock = std::make_shared<Tcp::socket>(std::move(socket));
  auto timer = std::make_shared<boost::asio::steady_timer>(worker.io());
  timer->expires_after(ctx_.config.handshake_timeout);
  timer->async_wait([sock](const boost::system::error_code& e) {
    if (e) return;
    boost::system::error_code ignored;
    sock->close(ignored);
  });
  auto& ctx = ctx_;
  auto& outbound = outbound_;
  Endpoint client = net::from_asio(peer);
  boost::asio::co_spawn(
      worker.io(),
      [&ctx, sock]() -> awaitable<Negotiated> { co_return co_await negotiate(ctx, *sock); },
      [&ctx, &outbound, &worker, sock, timer, client](std::exception_ptr e, Negotiated n) {
        timer->cancel();
        if (e || !n.ok || !sock->is_open()) {
          boost::system::error_code ignored;
          sock->close(ignored);
          return;
        }
        // Checked when the request is in, so that the client gets a reply that says "not allowed".
        if (auto why = refusal(ctx, client.ip)) {
          SM_WARN("socks5") << "client " << client.to_string() << " refused: " << *why;
          ctx.metrics
              ->counter("sockmesh_socks5_refused_total",
                        "SOCKS5 clients refused because --socks5-clients grants their source "
                        "address no local workload")
              .inc();
          auto r = std::make_shared<std::array<uint8_t, 10>>(reply(kNotAllowed));
          boost::asio::async_write(*sock, boost::asio::buffer(*r),
                                   [r, sock](const boost::system::error_code&, size_t) {
                                     boost::system::error_code ignored;
                                     sock->close(ignored);
                                   });
          return;
        }
        outbound.handle(worker, std::move(*sock), client, n.destination,
                        [](const OutboundOutcome& o, Outbound::ClientSocket client_sock,
                           std::function<void()> proceed) {
                          uint8_t code = kSucceeded;
                          if (!o.ok) {
                            code = o.policy_denied ? kNotAllowed
                                   : o.unreachable ? kConnectionRefused
                                                   : kGeneralFailure;
                          }
                          auto r = std::make_shared<std::array<uint8_t, 10>>(reply(code));
                          boost::asio::async_write(
                              *client_sock, boost::asio::buffer(*r),
                              [r, client_sock, ok = o.ok, proceed = std::move(proceed)](
                                  const boost::system::error_code& e, size_t) {
                                if (e || !ok) {
                                  boost::system::error_code ignored;
                                  client_sock->close(ignored);
                                  return;
                                }
                                proceed();
                              });
                        });
      });
}

}  // namespace sockmesh::proxy
