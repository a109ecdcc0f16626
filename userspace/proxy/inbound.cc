#include "proxy/inbound.h"

#include <boost/asio/steady_timer.hpp>

#include "base/log.h"
#include "net/sockets.h"
#include "policy/authorize.h"
#include "proxy/connection_record.h"
#include "proxy/context.h"
#include "proxy/dial.h"
#include "proxy/forwarded.h"
#include "proxy/tunnel_relay.h"

namespace sockmesh::proxy {
namespace {

using Tcp = boost::asio::ip::tcp;
using observe::ResponseFlags;

// Failure statuses of a CONNECT, each with its own meaning so that a client can tell them apart.
constexpr int kBadRequest = 400;          // :authority is not ip:port
constexpr int kForbidden = 403;           // authorization policy denied
constexpr int kNotFound = 404;            // no local workload has that IP
constexpr int kMethodNotAllowed = 405;    // not CONNECT
constexpr int kMisdirected = 421;         // target belongs to another workload than the TLS one
constexpr int kHeadersTooLarge = 431;     // header list over the limit
constexpr int kServiceUnavailable = 503;  // the application refused or reset
constexpr int kGatewayTimeout = 504;      // the application did not answer in time
constexpr int kLoopDetected = 508;        // target is one of the proxy's own ports

// One TLS+HTTP/2 connection from a peer proxy.
struct InboundSession {
  Endpoint peer;   // the client workload's address
  Endpoint local;  // the workload IP that was dialled, :15008
  std::string peer_identity;
  std::string workload_uid;
  uint64_t drain_id = 0;
  // This connection's place under the connection caps, given back when it closes.
  ConnectionLimits::Ticket ticket;
};

const char* limit_name(h2::H2Connection::Limit limit) {
  switch (limit) {
    case h2::H2Connection::Limit::kRefusedStream:
      return "refused_stream";
    case h2::H2Connection::Limit::kRapidReset:
      return "rapid_reset";
    case h2::H2Connection::Limit::kContinuationFlood:
      return "continuation_flood";
    case h2::H2Connection::Limit::kIdle:
      return "idle";
  }
  return "unknown";
}

void refuse(const std::shared_ptr<h2::H2Stream>& stream, int status, const std::string& reason) {
  stream->respond(status, {{"sockmesh-error", reason}});
}

void handle_request(ProxyContext& ctx, Worker& worker, std::shared_ptr<InboundSession> session,
                    std::shared_ptr<h2::H2Stream> stream) {
  const h2::Request& req = stream->request();
  auto record = std::make_shared<ConnectionRecord>(ctx, worker, "inbound");
  record->set_path("hbone");
  auto& access = record->access();
  access.src_addr = session->peer.to_string();
  access.src_identity = session->peer_identity;
  access.dst_addr = req.authority;
  access.dst_hbone_addr = session->local.to_string();
  auto snap = ctx.store->get();
  ConnectionView view;
  view.source = snap->workload_by_ip(session->peer.ip);
  view.source_principal = session->peer_identity;
  view.mutual_tls = true;

  auto fail = [&](int status, const std::string& reason, ResponseFlags flags) {
    SM_INFO("inbound") << "refused CONNECT " << req.authority << " from " << session->peer_identity
                       << " (" << session->peer.to_string() << "): " << status << " " << reason;
    refuse(stream, status, reason);
    record->identify(observe::Reporter::kDestination, view);
    record->finish(reason, flags);
  };

  if (req.oversized) {
    fail(kHeadersTooLarge,
         "request headers exceed " + std::to_string(ctx.config.h2.max_header_list_bytes) + " bytes",
         ResponseFlags::kConnectionFailure);
    return;
  }
  if (req.method != "CONNECT") {
    fail(kMethodNotAllowed, "only CONNECT is served on the HBONE port (got " + req.method + ")",
         ResponseFlags::kConnectionFailure);
    return;
  }
  auto target = Endpoint::parse(req.authority);
  if (!target) {
    fail(kBadRequest, "malformed :authority '" + req.authority + "', expected ip:port",
         ResponseFlags::kConnectionFailure);
    return;
  }
  if (ctx.is_proxy_port(target->port) || ctx.is_own_listener(*target)) {
    fail(kLoopDetected, "target port " + std::to_string(target->port) + " is the proxy's own",
         ResponseFlags::kConnectionFailure);
    return;
  }
  const state::Workload* dst = ctx.local_workload(*snap, target->ip);
  if (dst == nullptr) {
    fail(kNotFound, "no workload with IP " + target->ip.to_string() + " on this node",
         ResponseFlags::kConnectionFailure);
    return;
  }
  view.destination = dst;
  view.destination_principal = dst->identity();
  if (dst->uid != session->workload_uid) {
    fail(kMisdirected,
         "target " + target->ip.to_string() + " is not the workload whose certificate was shown",
         ResponseFlags::kConnectionFailure);
    return;
  }
  auto facts = policy::ConnectionFacts::make(session->peer.ip, session->peer_identity, target->ip,
                                             target->port);
  auto verdict = ctx.admit(*snap, *dst, facts);
  if (!verdict.allowed) {
    fail(kForbidden, "not authorized: " + verdict.reason,
         ResponseFlags::kAuthorizationPolicyDenied);
    // A peer that no port of this workload lets in gets nothing from its connection but a place
    // to hold memory: close it (GOAWAY; streams already open finish) after this first refusal.
    if (policy::denied_on_every_port(*snap, *dst, facts)) {
      SM_INFO("inbound") << "closing HBONE connection from " << session->peer_identity << " ("
                         << session->peer.to_string() << "): no port of " << dst->identity()
                         << " lets this identity in";
      ctx.metrics
          ->counter("sockmesh_hbone_denied_connections_closed_total",
                    "HBONE connections closed because every port of their workload denies the "
                    "peer's identity")
          .inc();
      stream->connection().shutdown_gracefully();
    }
    return;
  }
  record->identify(observe::Reporter::kDestination, view);
  std::string fwd = forwarded_for(req);
  if (!fwd.empty()) SM_DEBUG("inbound") << "CONNECT " << req.authority << " forwarded for " << fwd;

  net::DialOptions dial_opts = ctx.dial_to_app(session->peer.ip, target->ip);
  std::string dst_uid = dst->uid;
  dial(worker.io(), *target, dial_opts, ctx.config.connect_timeout,
       [&ctx, &worker, stream, record, facts, dst_uid, target = *target](DialResult r,
                                                                         Tcp::socket socket) {
         if (stream->closed()) {
           record->finish("client went away before the target answered",
                          ResponseFlags::kConnectionFailure);
           return;
         }
         if (!r.ok) {
           int status = r.timed_out ? kGatewayTimeout : kServiceUnavailable;
           SM_INFO("inbound") << "CONNECT " << target.to_string() << " failed: " << r.error;
           refuse(stream, status, r.error);
           record->finish(r.error, ResponseFlags::kConnectionFailure);
           return;
         }
         if (ctx.config.preserve_source_ip && !r.source_kept) {
           SM_DEBUG("inbound") << "source address not kept for " << target.to_string();
         }
         // Decided now: sockops paired this socket with the app's when the connect completed.
         auto bypass_exit = ctx.bypass_exit(socket.native_handle());
         stream->respond(200);
         auto relay = std::make_shared<TunnelRelay>(
             std::make_shared<Tcp::socket>(std::move(socket)), stream);
         relay->on_bypass_exit(std::move(bypass_exit));
         std::weak_ptr<TunnelRelay> weak = relay;
         record->track(dst_uid, facts, [weak](const std::string& reason) {
           if (auto r = weak.lock()) r->abort(reason);
         });
         // The relay's socket is the application: socket-to-stream flows back to the client.
         record->set_relay("tunnel");
         relay->start(finish_when_done<TunnelRelay::Result>(record),
                      count_bytes(record, /*forward_is_outgoing=*/false));
       });
}

}  // namespace

void InboundHbone::handle(Worker& worker, Tcp::socket socket) {
  boost::system::error_code ec;
  auto local_ep = socket.local_endpoint(ec);
  auto peer_ep = socket.remote_endpoint(ec);
  if (ec) return;  // already gone
  net::set_nodelay(socket);
  auto session = std::make_shared<InboundSession>();
  session->local = net::from_asio(local_ep);
  session->peer = net::from_asio(peer_ep);

  // The caps come first, before any TLS work is spent on the connection.
  ConnectionLimits::Refusal refusal;
  bool log_now = false;
  uint64_t unlogged = 0;
  session->ticket = ctx_.hbone_limits->admit(session->peer.ip, &refusal, &log_now, &unlogged);
  if (!session->ticket) {
    ctx_.metrics
        ->counter("sockmesh_hbone_connections_refused_total",
                  "HBONE connections closed at accept: over the total or per-source-IP cap",
                  {{"reason", refusal_name(refusal)}})
        .inc();
    if (log_now) {
      SM_WARN("inbound") << "HBONE connection from " << session->peer.to_string() << " to "
                         << session->local.to_string() << " refused: "
                         << (refusal == ConnectionLimits::Refusal::kTotal
                                 ? std::to_string(ctx_.hbone_limits->max_total()) +
                                       " connections open (--hbone-max-connections)"
                                 : std::to_string(ctx_.hbone_limits->max_per_source()) +
                                       " connections open from this address "
                                       "(--hbone-max-connections-per-source)")
                         << "; " << unlogged << " more refused since the last such line"
                         << " (one line per " << ConnectionLimits::kLogInterval.count() << " s)";
    }
    net::close_with_reset(socket);
    return;
  }

  auto snap = ctx_.store->get();
  const state::Workload* wl = ctx_.local_workload(*snap, session->local.ip);
  auto& failures = ctx_.metrics->counter(
      "sockmesh_hbone_accept_failures_total",
      "HBONE connections closed before HTTP/2 started, other than by a failed TLS handshake "
      "(those count in sockmesh_tls_handshake_failures_total)");
  if (wl == nullptr) {
    SM_WARN("inbound") << "HBONE connection to " << session->local.to_string() << " from "
                       << session->peer.to_string()
                       << " closed: no local workload has that address";
    failures.inc();
    return;
  }
  session->workload_uid = wl->uid;
  auto cert = ctx_.certificate_for(wl->identity());
  if (!cert) {
    SM_ERROR("inbound") << "no certificate for " << wl->identity() << ": " << cert.error().message;
    failures.inc();
    return;
  }
  // The deadline and the handshake complete on the stream's executor, the worker's one-thread
  // io_context, so they never run at once; but either may already be queued when the other runs
  // (cancel() cannot recall a queued completion). Whichever runs first sets `done`, and the other
  // then leaves the stream alone: it may have been moved into the HTTP/2 connection.
  struct Handshake {
    std::unique_ptr<h2::TlsStream> tls;
    tls::PeerCheck check;
    boost::asio::steady_timer deadline;
    bool done = false;
    ActiveGuard active;
    Handshake(Tcp::socket s, boost::asio::ssl::context& c, std::atomic<int64_t>* counter)
        : tls(std::make_unique<h2::TlsStream>(std::move(s), c)),
          deadline(tls->get_executor()),
          active(counter) {}
  };
  auto hs = std::make_shared<Handshake>(std::move(socket), ctx_.tls->server(), &worker.active());
  SSL* ssl = hs->tls->native_handle();
  if (auto err = tls::MeshTls::use_certificate(ssl, **cert)) {
    SM_ERROR("inbound") << "cannot use certificate of " << wl->identity() << ": " << *err;
    failures.inc();
    return;
  }
  tls::MeshTls::attach_peer_check(ssl, &hs->check);
  hs->deadline.expires_after(ctx_.config.handshake_timeout);
  hs->deadline.async_wait([hs](const boost::system::error_code& e) {
    if (e || hs->done) return;
    hs->done = true;
    boost::system::error_code ignored;
    hs->tls->next_layer().close(ignored);  // the handshake then completes with an error
  });
  auto& ctx = ctx_;
  hs->tls->async_handshake(
      boost::asio::ssl::stream_base::server,
      [&ctx, &worker, hs, session, &failures](const boost::system::error_code& e) {
        // Set by the deadline: it closed the socket, even if the handshake had just succeeded.
        bool timed_out = hs->done;
        hs->done = true;
        hs->deadline.cancel();
        SSL* ssl = hs->tls->native_handle();
        std::string why;
        if (timed_out) {
          why = "timed out after " + std::to_string(ctx.config.handshake_timeout.count()) + " ms";
        } else if (e) {
          why = tls::MeshTls::describe_failure(ssl, e.message());
        }
        tls::MeshTls::attach_peer_check(ssl, nullptr);
        if (timed_out || e) {
          SM_WARN("inbound") << "TLS handshake from " << session->peer.to_string() << " to "
                             << session->local.to_string() << " failed: " << why;
          ctx.metrics
              ->counter("sockmesh_tls_handshake_failures_total", "Failed TLS handshakes",
                        {{"direction", "inbound"}})
              .inc();
          return;
        }
        if (tls::MeshTls::negotiated_alpn(ssl) != "h2") {
          SM_WARN("inbound") << "connection from " << session->peer.to_string()
                             << " closed: ALPN h2 was not negotiated";
          failures.inc();
          return;
        }
        auto peer = tls::MeshTls::peer_identity(ssl);
        if (!peer) {
          SM_WARN("inbound") << "connection from " << session->peer.to_string()
                             << " closed: no verified peer identity";
          failures.inc();
          return;
        }
        session->peer_identity = peer->to_string();
        h2::Settings settings = ctx.config.h2;
        settings.idle_timeout = ctx.config.hbone_idle_timeout;
        auto conn = std::make_shared<h2::H2Connection>(std::move(hs->tls),
                                                       h2::H2Connection::Role::kServer, settings);
        conn->set_limit_handler([&ctx](h2::H2Connection::Limit limit) {
          ctx.metrics
              ->counter("sockmesh_hbone_h2_limits_total",
                        "HTTP/2 limits hit on inbound HBONE connections: streams refused over "
                        "MAX_CONCURRENT_STREAMS, connections closed for rapid reset, CONTINUATION "
                        "floods, or idleness",
                        {{"limit", limit_name(limit)}})
              .inc();
        });
        conn->set_request_handler([&ctx, &worker, session](std::shared_ptr<h2::H2Stream> s) {
          handle_request(ctx, worker, session, std::move(s));
        });
        std::weak_ptr<h2::H2Connection> weak = conn;
        session->drain_id = worker.on_drain([weak] {
          if (auto c = weak.lock()) c->shutdown_gracefully();
        });
        conn->set_close_handler([&worker, session](const std::string& reason) {
          worker.forget_drain(session->drain_id);
          session->ticket.release();
          SM_DEBUG("inbound") << "HBONE connection from " << session->peer_identity << " ("
                              << session->peer.to_string() << ") closed: " << reason;
        });
        if (!conn->start()) {
          SM_WARN("inbound") << "HTTP/2 session failed to start";
          return;
        }
        if (ctx.draining.load()) conn->shutdown_gracefully();
        SM_DEBUG("inbound") << "HBONE connection from " << session->peer_identity << " ("
                            << session->peer.to_string() << ") to " << session->local.to_string();
      });
}

}  // namespace sockmesh::proxy
