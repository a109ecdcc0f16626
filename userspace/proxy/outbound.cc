#include "proxy/outbound.h"

#include <atomic>

#include "base/log.h"
#include "net/relay.h"
#include "net/sockets.h"
#include "policy/authorize.h"
#include "proxy/connection_record.h"
#include "proxy/context.h"
#include "proxy/dial.h"
#include "proxy/plain_relay.h"
#include "proxy/pool.h"
#include "proxy/resolve.h"
#include "proxy/tunnel_relay.h"

namespace sockmesh::proxy {
namespace {

using Tcp = boost::asio::ip::tcp;
using observe::ResponseFlags;

std::string baggage_of(const state::Workload& w) {
  std::string b = "k8s.cluster.name=" + w.cluster_id + ",k8s.namespace.name=" + w.namespace_name;
  std::string wname = w.workload_name.empty() ? w.name : w.workload_name;
  b += ",k8s.deployment.name=" + wname;
  b += ",service.name=" + (w.canonical_name.empty() ? wname : w.canonical_name);
  b += ",service.version=" + (w.canonical_revision.empty() ? "latest" : w.canonical_revision);
  return b;
}

// Ends the record and tells the client: through `ready` (SOCKS5 answers), or with a reset.
void fail_client(const std::shared_ptr<ConnectionRecord>& record,
                 const Outbound::ClientSocket& client, const Outbound::Ready& ready,
                 const OutboundOutcome& outcome) {
  record->finish(outcome.error, outcome.flags);
  if (ready) {
    ready(outcome, client, [] {});
  } else {
    net::close_with_reset(*client);
  }
}

// The same-node fast path: the destination `dst` is a workload this proxy serves, so the HBONE
// hop to its own 15008 would only encrypt to itself. Instead the connection is authorized here as
// the inbound side authorizes a CONNECT (policy::authorize, the source identity from the workload
// map), dialled into the server pod as the inbound side dials the app (the client's IP, the
// to-app mark, the pod's netns), and relayed as plain TCP. Both reporters' metrics and access-log
// lines are written, as the tunnel writes them; the lines say path=same-node.
void serve_same_node(ProxyContext& ctx, Worker& worker,
                     const std::shared_ptr<ConnectionRecord>& out_record, ConnectionView view,
                     const state::Snapshot& snap, const state::Workload& dst,
                     const Endpoint& client_addr, const Endpoint& target,
                     const Outbound::ClientSocket& client, const Outbound::Ready& ready,
                     BypassExit client_exit) {
  ctx.metrics
      ->counter("sockmesh_same_node_fast_path_total",
                "Outbound connections to a workload of this proxy served without a tunnel "
                "(--same-node-fast-path)")
      .inc();
  view.destination_principal = dst.identity();
  view.mutual_tls = true;  // both identities are the proxy's own knowledge, as over its tunnel
  out_record->access().path = "same-node";
  out_record->set_path("same-node");
  out_record->identify(observe::Reporter::kSource, view);

  // The inbound half, as InboundHbone records a CONNECT from this client.
  auto in_record = std::make_shared<ConnectionRecord>(ctx, worker, "inbound");
  auto& in_access = in_record->access();
  in_access.src_addr = client_addr.to_string();
  in_access.dst_addr = target.to_string();
  in_access.path = "same-node";
  in_record->set_path("same-node");
  ConnectionView in_view;
  in_view.source = snap.workload_by_ip(client_addr.ip);  // as InboundHbone: the mesh's view
  in_view.source_principal = view.source_principal;
  in_view.destination = &dst;
  in_view.destination_principal = dst.identity();
  in_view.mutual_tls = true;
  in_record->identify(observe::Reporter::kDestination, in_view);

  auto facts =
      policy::ConnectionFacts::make(client_addr.ip, view.source_principal, target.ip, target.port);
  auto verdict = ctx.admit(snap, dst, facts);
  if (!verdict.allowed) {
    std::string reason = "not authorized: " + verdict.reason;
    SM_INFO("outbound") << "same-node " << client_addr.to_string() << " -> " << target.to_string()
                        << " denied: " << verdict.reason;
    in_record->finish(reason, ResponseFlags::kAuthorizationPolicyDenied);
    fail_client(out_record, client, ready,
                {false, reason, ResponseFlags::kAuthorizationPolicyDenied, true, false});
    return;
  }

  net::DialOptions opts = ctx.dial_to_app(client_addr.ip, target.ip);
  std::string dst_uid = dst.uid;
  dial(worker.io(), target, opts, ctx.config.connect_timeout,
       [&ctx, out_record, in_record, client, ready, client_exit, facts, dst_uid](
           DialResult r, Tcp::socket upstream) mutable {
         if (!r.ok) {
           in_record->finish(r.error, ResponseFlags::kConnectionFailure);
           fail_client(out_record, client, ready,
                       {false, r.error, ResponseFlags::kConnectionFailure, false, true});
           return;
         }
         // The upstream socket is the server app's peer; sockops paired the two at connect.
         auto app_exit = ctx.bypass_exit(upstream.native_handle());
         auto start = [&ctx, out_record, in_record, client, facts, dst_uid,
                       client_exit = std::move(client_exit), app_exit = std::move(app_exit),
                       up = std::make_shared<Tcp::socket>(std::move(upstream))]() mutable {
           auto count_out = count_bytes(out_record, /*forward_is_outgoing=*/true);
           auto count_in = count_bytes(in_record, /*forward_is_outgoing=*/true);
           auto done_out = finish_when_done<net::TcpRelay::Result>(out_record);
           auto done_in = finish_when_done<net::TcpRelay::Result>(in_record);
           auto relay = start_plain_relay(
               ctx, std::move(*client), std::move(*up), std::move(client_exit), std::move(app_exit),
               [done_out, done_in](const net::TcpRelay::Result& res) {
                 done_in(res);
                 done_out(res);
               },
               [count_out, count_in](bool forward, size_t n) {
                 count_out(forward, n);
                 count_in(forward, n);
               });
           out_record->set_relay(relay.spliced ? "splice" : "copy");
           in_record->set_relay(relay.spliced ? "splice" : "copy");
           // The live re-check closes it when a policy change denies it, as an inbound one.
           in_record->track(dst_uid, facts, std::move(relay.abort));
         };
         if (ready) {
           ready(OutboundOutcome{true}, client, std::move(start));
         } else {
           start();
         }
       });
}

}  // namespace

void Outbound::handle(Worker& worker, Tcp::socket client, const Endpoint& client_addr,
                      const Endpoint& original_destination, Ready ready) {
  auto& ctx = ctx_;
  auto record = std::make_shared<ConnectionRecord>(ctx, worker, "outbound");
  auto& access = record->access();
  access.src_addr = client_addr.to_string();
  access.dst_addr = original_destination.to_string();
  auto snap = ctx.store->get();
  ConnectionView view;
  view.source = ctx.local_workload(*snap, client_addr.ip);

  auto client_ptr = std::make_shared<Tcp::socket>(std::move(client));
  auto fail = [&](OutboundOutcome o) {
    SM_INFO("outbound") << "connection from " << client_addr.to_string() << " to "
                        << original_destination.to_string() << " failed: " << o.error;
    record->identify(observe::Reporter::kSource, view);
    fail_client(record, client_ptr, ready, o);
  };

  if (view.source == nullptr) {
    fail({false, "source " + client_addr.ip.to_string() + " is not a workload on this node",
          ResponseFlags::kConnectionFailure});
    return;
  }
  view.source_principal = view.source->identity();
  if (ctx.is_proxy_port(original_destination.port) &&
      ctx.local_workload(*snap, original_destination.ip) != nullptr) {
    fail({false, "destination is the proxy itself", ResponseFlags::kConnectionFailure});
    return;
  }
  Route route = resolve(*snap, original_destination);
  view.service = route.service;
  view.destination = route.workload;
  if (!route.error.empty()) {
    fail({false, route.error, ResponseFlags::kConnectionFailure, false, true});
    return;
  }
  // The proxy's admin, metrics, readiness and entry listeners are not destinations: reaching
  // them through the proxy would lend them the proxy's own source address (and its loopback).
  const Endpoint* aimed_at[] = {&original_destination, &route.target};
  for (const Endpoint* at : aimed_at) {
    if (ctx.is_own_listener(*at)) {
      ctx.metrics
          ->counter("sockmesh_outbound_loop_refused_total",
                    "Outbound connections refused because they were aimed at one of the "
                    "proxy's own listeners")
          .inc();
      fail({false, "destination " + at->to_string() + " is one of the proxy's own listeners",
            ResponseFlags::kConnectionFailure});
      return;
    }
  }
  access.dst_addr = route.target.to_string();
  // Decided now, while the client socket is fresh: sockops paired it with the app at accept.
  auto bypass_exit = ctx.bypass_exit(client_ptr->native_handle());

  bool hbone = route.workload != nullptr && route.workload->protocol == state::Protocol::kHbone;
  if (!hbone && (route.target.ip.is_loopback() || route.target.ip.is_unspecified())) {
    // Loopback is the proxy's own host (or the pod's, in-pod): its admin port, node services.
    ctx.metrics
        ->counter("sockmesh_outbound_loopback_refused_total",
                  "Plain-TCP passthrough refused because the destination was a loopback "
                  "or unspecified address")
        .inc();
    fail({false, "passthrough to " + route.target.to_string() + " refused: loopback destination",
          ResponseFlags::kConnectionFailure});
    return;
  }
  if (!hbone) {
    // Passthrough: outside the mesh, or a workload that does not speak HBONE.
    if (route.workload != nullptr) view.destination_principal = route.workload->identity();
    record->set_path("passthrough");
    record->identify(observe::Reporter::kSource, view);
    net::DialOptions opts;
    if (ctx.config.preserve_source_ip) opts.source = client_addr.ip;
    opts.mark = ctx.config.mark;
    opts.netns = ctx.pod_netns.find(client_addr.ip);  // in-pod mode: leave from the client's pod
    dial(worker.io(), route.target, opts, ctx.config.connect_timeout,
         [&ctx, record, client_ptr, ready, bypass_exit](DialResult r, Tcp::socket upstream) {
           if (!r.ok) {
             OutboundOutcome o{false, r.error, ResponseFlags::kConnectionFailure, false, true};
             fail_client(record, client_ptr, ready, o);
             return;
           }
           auto start = [&ctx, record, client_ptr, bypass_exit,
                         up = std::make_shared<Tcp::socket>(std::move(upstream))]() mutable {
             auto relay = start_plain_relay(ctx, std::move(*client_ptr), std::move(*up),
                                            std::move(bypass_exit), nullptr,
                                            finish_when_done<net::TcpRelay::Result>(record),
                                            count_bytes(record, /*forward_is_outgoing=*/true));
             record->set_relay(relay.spliced ? "splice" : "copy");
           };
           if (ready) {
             ready(OutboundOutcome{true}, client_ptr, start);
           } else {
             start();
           }
         });
    return;
  }

  if (ctx.config.same_node_fast_path) {
    // A workload this proxy serves: in in-pod mode only once its netns was handed over.
    const state::Workload* local = ctx.local_workload(*snap, route.target.ip);
    if (local != nullptr &&
        (ctx.config.zds_socket.empty() || ctx.pod_netns.find(route.target.ip))) {
      serve_same_node(ctx, worker, record, view, *snap, *local, client_addr, route.target,
                      client_ptr, ready, bypass_exit);
      return;
    }
  }

  // HBONE tunnel to the destination workload's node.
  const state::Workload& dst = *route.workload;
  view.destination_principal = dst.identity();
  view.mutual_tls = true;
  record->set_path("hbone");
  record->identify(observe::Reporter::kSource, view);
  access.dst_hbone_addr = Endpoint{route.target.ip, ctx.config.hbone_port}.to_string();

  std::vector<std::string> acceptable{dst.identity()};
  if (route.service != nullptr) {
    for (const auto& san : route.service->subject_alt_names) acceptable.push_back(san);
  }
  PoolKey key = PoolKey::make(view.source->identity(), client_addr.ip, dst.identity(),
                              Endpoint{route.target.ip, ctx.config.hbone_port},
                              std::move(acceptable));
  std::string authority = route.target.to_string();
  h2::HeaderList headers{{"forwarded", "for=\"" + client_addr.to_string() + "\""},
                         {"baggage", baggage_of(*view.source)}};
  worker.pool().acquire(
      key, [record, client_ptr, ready, authority, headers, bypass_exit](
               std::shared_ptr<h2::H2Connection> conn, const HbonePool::Failure* failure) {
        if (failure != nullptr) {
          OutboundOutcome o{false, failure->reason, failure->flag, false, true};
          fail_client(record, client_ptr, ready, o);
          return;
        }
        auto responded = std::make_shared<bool>(false);
        auto stream_holder = std::make_shared<std::shared_ptr<h2::H2Stream>>();
        h2::H2Stream::Handlers h;
        h.on_response = [record, client_ptr, ready, stream_holder, responded, authority,
                         bypass_exit](int status, const h2::HeaderList& resp) {
          *responded = true;
          auto stream = *stream_holder;
          if (status != 200) {
            std::string reason;
            for (const auto& hd : resp) {
              if (hd.name == "sockmesh-error") reason = hd.value;
            }
            OutboundOutcome o{false,
                              "CONNECT " + authority + " answered " + std::to_string(status) +
                                  (reason.empty() ? "" : ": " + reason),
                              status == 403 ? ResponseFlags::kAuthorizationPolicyDenied
                                            : ResponseFlags::kConnectionFailure,
                              status == 403, status == 503 || status == 504 || status == 404};
            SM_INFO("outbound") << o.error;
            stream->reset(NGHTTP2_NO_ERROR);  // nothing more to send on a refused tunnel
            fail_client(record, client_ptr, ready, o);
            return;
          }
          auto relay = std::make_shared<TunnelRelay>(client_ptr, stream);
          relay->attach();  // nothing the server sends is lost while SOCKS5 answers its client
          relay->on_bypass_exit(bypass_exit);
          auto start = [record, relay] {
            record->set_relay("tunnel");
            relay->start(finish_when_done<TunnelRelay::Result>(record),
                         count_bytes(record, /*forward_is_outgoing=*/true));
          };
          if (ready) {
            ready(OutboundOutcome{true}, client_ptr, start);
          } else {
            start();
          }
        };
        h.on_close = [record, client_ptr, ready, responded](uint32_t code) {
          if (*responded) return;  // the relay owns the stream by now
          OutboundOutcome o{false,
                            std::string("tunnel closed before a response: ") +
                                h2::error_code_name(code),
                            ResponseFlags::kConnectionFailure, false, true};
          fail_client(record, client_ptr, ready, o);
        };
        auto stream = conn->open_connect(authority, headers, std::move(h));
        if (!stream) {
          OutboundOutcome o{false, "HBONE connection refused a new stream",
                            ResponseFlags::kConnectionFailure, false, true};
          fail_client(record, client_ptr, ready, o);
          return;
        }
        *stream_holder = stream;
      });
}

}  // namespace sockmesh::proxy
