#include "proxy/inbound_plaintext.h"

#include "base/log.h"
#include "net/relay.h"
#include "net/sockets.h"
#include "policy/authorize.h"
#include "proxy/connection_record.h"
#include "proxy/context.h"
#include "proxy/dial.h"
#include "proxy/plain_relay.h"

namespace sockmesh::proxy {

using Tcp = boost::asio::ip::tcp;
using observe::ResponseFlags;

void InboundPlaintext::handle(Worker& worker, Tcp::socket socket) {
  boost::system::error_code ec;
  auto peer_ep = socket.remote_endpoint(ec);
  if (ec) return;
  auto dst = net::original_destination(socket);
  if (!dst) return;
  Endpoint client = net::from_asio(peer_ep);
  auto& ctx = ctx_;
  auto record = std::make_shared<ConnectionRecord>(ctx, worker, "inbound");
  record->set_path("plaintext");
  record->access().src_addr = client.to_string();
  record->access().dst_addr = dst->to_string();
  auto snap = ctx.store->get();
  ConnectionView view;
  view.source = snap->workload_by_ip(client.ip);
  const state::Workload* wl = ctx.local_workload(*snap, dst->ip);
  view.destination = wl;
  if (wl != nullptr) view.destination_principal = wl->identity();
  record->identify(observe::Reporter::kDestination, view);
  if (wl == nullptr) {
    record->finish("no workload with IP " + dst->ip.to_string() + " on this node",
                   ResponseFlags::kConnectionFailure);
    net::close_with_reset(socket);
    return;
  }
  if (ctx.is_proxy_port(dst->port) || ctx.is_own_listener(*dst)) {
    record->finish("destination is the proxy's own port", ResponseFlags::kConnectionFailure);
    net::close_with_reset(socket);
    return;
  }
  auto facts = policy::ConnectionFacts::make(client.ip, "", dst->ip, dst->port);
  auto verdict = ctx.admit(*snap, *wl, facts);
  if (!verdict.allowed) {
    SM_INFO("inbound") << "plaintext " << client.to_string() << " -> " << dst->to_string()
                       << " denied: " << verdict.reason;
    record->finish("not authorized: " + verdict.reason, ResponseFlags::kAuthorizationPolicyDenied);
    net::close_with_reset(socket);
    return;
  }
  net::DialOptions opts = ctx.dial_to_app(client.ip, dst->ip);
  auto client_sock = std::make_shared<Tcp::socket>(std::move(socket));
  std::string uid = wl->uid;
  dial(worker.io(), *dst, opts, ctx.config.connect_timeout,
       [&ctx, record, client_sock, facts, uid](DialResult r, Tcp::socket upstream) {
         if (!r.ok) {
           record->finish(r.error, ResponseFlags::kConnectionFailure);
           net::close_with_reset(*client_sock);
           return;
         }
         // The upstream socket is the app's peer; sockops paired the two when it connected.
         auto app_exit = ctx.bypass_exit(upstream.native_handle());
         auto relay =
             start_plain_relay(ctx, std::move(*client_sock), std::move(upstream), nullptr,
                               std::move(app_exit), finish_when_done<net::TcpRelay::Result>(record),
                               count_bytes(record, /*forward_is_outgoing=*/true));
         record->set_relay(relay.spliced ? "splice" : "copy");
         record->track(uid, facts, std::move(relay.abort));
       });
}

}  // namespace sockmesh::proxy
