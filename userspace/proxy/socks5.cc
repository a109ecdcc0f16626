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
#include "proxy/socks5_negotiate.h"

namespace sockmesh::proxy {
namespace {

using Tcp = boost::asio::ip::tcp;
using boost::asio::awaitable;
using boost::asio::use_awaitable;

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

std::optional<IpAddress> resolve_host(ProxyContext& ctx, const std::string& host) {
  auto snap = ctx.store->get();
  if (const auto* svc = service_by_hostname(*snap, host); svc && !svc->vips.empty()) {
    return svc->vips.front().ip;
  }
  return IpAddress::parse(host);
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
      [&ctx, sock]() -> awaitable<socks5::Negotiated> {
        co_return co_await socks5::negotiate(
            *sock, [&ctx](const std::string& host) { return resolve_host(ctx, host); });
      },
      [&ctx, &outbound, &worker, sock, timer, client](std::exception_ptr e,
                                                      socks5::Negotiated n) {
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
          auto r = std::make_shared<std::array<uint8_t, 10>>(socks5::reply(socks5::kNotAllowed));
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
                          uint8_t code = socks5::kSucceeded;
                          if (!o.ok) {
                            code = o.policy_denied ? socks5::kNotAllowed
                                   : o.unreachable ? socks5::kConnectionRefused
                                                   : socks5::kGeneralFailure;
                          }
                          auto r = std::make_shared<std::array<uint8_t, 10>>(socks5::reply(code));
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
