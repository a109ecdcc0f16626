#include "proxy/pool.h"

#include <boost/asio/connect.hpp>
#include <algorithm>

#include "base/log.h"
#include "net/sockets.h"
#include "proxy/context.h"

namespace sockmesh::proxy {

PoolKey PoolKey::make(std::string source_identity, IpAddress source_ip,
                      std::string destination_identity, Endpoint destination,
                      std::vector<std::string> acceptable) {
  std::sort(acceptable.begin(), acceptable.end());
  acceptable.erase(std::unique(acceptable.begin(), acceptable.end()), acceptable.end());
  return PoolKey{std::move(source_identity), source_ip, std::move(destination_identity),
                 destination, std::move(acceptable)};
}

std::string PoolKey::to_string() const {
  std::string s = source_identity + "@" + source_ip.to_string() + " -> " + destination_identity +
                  "@" + destination.to_string();
  // The workload's own identity alone is the common case; say more only when it is not.
  if (acceptable_identities.size() != 1 || acceptable_identities[0] != destination_identity) {
    s += " accepting [";
    for (size_t i = 0; i < acceptable_identities.size(); ++i) {
      s += (i == 0 ? "" : " ") + acceptable_identities[i];
    }
    s += "]";
  }
  return s;
}

size_t PoolKeyHash::operator()(const PoolKey& k) const {
  size_t h = std::hash<std::string>()(k.source_identity);
  h = h * 31 + std::hash<std::string>()(k.destination_identity);
  h = h * 31 + std::hash<IpAddress>()(k.source_ip);
  h = h * 31 + std::hash<IpAddress>()(k.destination.ip) + k.destination.port;
  for (const auto& id : k.acceptable_identities) h = h * 31 + std::hash<std::string>()(id);
  return h;
}

HbonePool::HbonePool(ProxyContext& ctx, Worker& worker)
    : ctx_(ctx),
      worker_(worker),
      idle_timer_(worker.io()),
      pooled_gauge_(&ctx.metrics->gauge("sockmesh_pool_connections",
                                        "HBONE connections held in the outbound pools")),
      opened_counter_(&ctx.metrics->counter("sockmesh_pool_connections_opened_total",
                                            "HBONE connections opened by the outbound pools")),
      identity_mismatch_counter_(&ctx.metrics->counter(
          "sockmesh_pool_identity_mismatch_total",
          "HBONE connections refused because the server presented an identity this "
          "destination does not accept")) {
  arm_idle_sweep();
}

HbonePool::~HbonePool() {
  shut_down_ = true;
  idle_timer_.cancel();
}

size_t HbonePool::connections() const {
  size_t n = 0;
  for (auto& [_, v] : conns_) n += v.size();
  return n;
}

std::shared_ptr<h2::H2Connection> HbonePool::find_usable(const PoolKey& key) {
  auto it = conns_.find(key);
  if (it == conns_.end()) return nullptr;
  for (auto& c : it->second) {
    size_t limit = std::min<size_t>(c->stream_limit(), ctx_.config.max_streams_per_connection);
    if (c->usable() && c->active_streams() < limit) return c;
  }
  return nullptr;
}

void HbonePool::acquire(const PoolKey& key, Callback cb) {
  if (shut_down_) {
    Failure f{"proxy is draining", observe::ResponseFlags::kConnectionFailure};
    cb(nullptr, &f);
    return;
  }
  if (auto conn = find_usable(key)) {
    cb(conn, nullptr);
    return;
  }
  auto& waiters = waiters_[key];
  waiters.push_back(std::move(cb));
  if (waiters.size() == 1) connect(key);
}

struct HbonePool::Connecting {
  PoolKey key;
  std::unique_ptr<h2::TlsStream> tls;
  tls::PeerCheck check;
  identity::CertifiedKeyPtr cert;
  boost::asio::steady_timer deadline;
  bool done = false;
  Connecting(boost::asio::io_context& io) : deadline(io) {}
};

void HbonePool::connect(const PoolKey& key) {
  auto cert = ctx_.certificate_for(key.source_identity);
  if (!cert) {
    failed(key, Failure{"no certificate for " + key.source_identity + ": " + cert.error().message,
                        observe::ResponseFlags::kIdentityError});
    return;
  }
  auto c = std::make_shared<Connecting>(worker_.io());
  c->key = key;
  c->cert = *cert;
  c->tls = std::make_unique<h2::TlsStream>(worker_.io(), ctx_.tls->client());
  auto& socket = c->tls->next_layer();
  bool source_kept = false;
  net::DialOptions dial;
  if (ctx_.config.preserve_source_ip) dial.source = key.source_ip;
  dial.mark = ctx_.config.mark;
  dial.netns = ctx_.pod_netns.find(key.source_ip);  // in-pod mode: leave from the source pod
  if (auto err = net::prepare_dial(socket, key.destination, dial, &source_kept)) {
    failed(key, Failure{"socket for " + key.destination.to_string() + ": " + *err});
    return;
  }
  if (ctx_.config.preserve_source_ip && !source_kept) {
    SM_DEBUG("pool") << "could not bind HBONE connection to source " << key.source_ip.to_string();
  }
  if (auto err = tls::MeshTls::use_certificate(c->tls->native_handle(), *c->cert)) {
    failed(key, Failure{*err, observe::ResponseFlags::kTlsFailure});
    return;
  }
  tls::MeshTls::attach_peer_check(c->tls->native_handle(), &c->check);
  c->deadline.expires_after(ctx_.config.connect_timeout + ctx_.config.handshake_timeout);
  c->deadline.async_wait([c](const boost::system::error_code& ec) {
    if (ec || c->done) return;
    boost::system::error_code ignored;
    c->tls->next_layer().close(ignored);  // the pending operation fails with operation_aborted
  });
  socket.async_connect(
      net::to_asio(key.destination), [this, c](const boost::system::error_code& ec) {
        if (ec) {
          c->done = true;
          c->deadline.cancel();
          failed(c->key, Failure{"connect to " + c->key.destination.to_string() + ": " +
                                     (ec == boost::asio::error::operation_aborted
                                          ? std::string("timed out")
                                          : ec.message())});
          return;
        }
        c->tls->async_handshake(
            boost::asio::ssl::stream_base::client, [this, c](const boost::system::error_code& hec) {
              c->done = true;
              c->deadline.cancel();
              SSL* ssl = c->tls->native_handle();
              if (hec) {
                failed(c->key, Failure{"TLS handshake with " + c->key.destination.to_string() +
                                           ": " + tls::MeshTls::describe_failure(ssl, hec.message()),
                                       observe::ResponseFlags::kTlsFailure});
                return;
              }
              tls::MeshTls::attach_peer_check(ssl, nullptr);
              if (tls::MeshTls::negotiated_alpn(ssl) != "h2") {
                failed(c->key, Failure{"peer " + c->key.destination.to_string() +
                                           " did not negotiate ALPN h2",
                                       observe::ResponseFlags::kHttp2HandshakeFailure});
                return;
              }
              auto peer = tls::MeshTls::peer_identity(ssl);
              std::string got = peer ? peer->to_string() : "(none)";
              const auto& acceptable = c->key.acceptable_identities;
              if (!std::binary_search(acceptable.begin(), acceptable.end(), got)) {
                std::string want;
                for (const auto& e : acceptable) want += (want.empty() ? "" : " or ") + e;
                identity_mismatch_counter_->inc();
                failed(c->key, Failure{"server " + c->key.destination.to_string() +
                                           " presented identity " + got + ", expected " + want,
                                       observe::ResponseFlags::kTlsFailure});
                return;
              }
              auto conn = std::make_shared<h2::H2Connection>(
                  std::move(c->tls), h2::H2Connection::Role::kClient, ctx_.config.h2);
              connected(c->key, conn);
            });
      });
}

void HbonePool::connected(const PoolKey& key, std::shared_ptr<h2::H2Connection> conn) {
  if (!conn->start()) {
    failed(key, Failure{"HTTP/2 session failed to start",
                        observe::ResponseFlags::kHttp2HandshakeFailure});
    return;
  }
  opened_counter_->inc();
  pooled_gauge_->inc();
  SM_DEBUG("pool") << "connected " << key.to_string();
  std::weak_ptr<h2::H2Connection> weak = conn;
  conn->set_close_handler([this, key, weak](const std::string& reason) {
    pooled_gauge_->dec();
    SM_DEBUG("pool") << "connection closed " << key.to_string() << ": " << reason;
    auto it = conns_.find(key);
    if (it == conns_.end()) return;
    auto locked = weak.lock();
    std::erase_if(it->second, [&](const auto& c) { return c == locked || c->closed(); });
    if (it->second.empty()) conns_.erase(it);
  });
  conns_[key].push_back(conn);
  auto waiters = std::move(waiters_[key]);
  waiters_.erase(key);
  // Hand out streams; waiters beyond this connection's limit go round again and open another.
  for (auto& cb : waiters) {
    if (auto c = find_usable(key)) {
      cb(c, nullptr);
    } else {
      acquire(key, std::move(cb));
    }
  }
}

void HbonePool::failed(const PoolKey& key, const Failure& failure) {
  SM_WARN("pool") << "HBONE connection " << key.to_string() << " failed: " << failure.reason;
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  auto waiters = std::move(it->second);
  waiters_.erase(it);
  for (auto& cb : waiters) cb(nullptr, &failure);
}

void HbonePool::shutdown_all() {
  shut_down_ = true;
  idle_timer_.cancel();
  // A connection may close at once, and its close handler edits conns_: not while iterating it.
  std::vector<std::shared_ptr<h2::H2Connection>> all;
  for (auto& [_, v] : conns_) all.insert(all.end(), v.begin(), v.end());
  for (auto& c : all) c->shutdown_gracefully();
}

void HbonePool::arm_idle_sweep() {
  auto period = std::min<std::chrono::milliseconds>(ctx_.config.pool_idle_timeout / 2,
                                                    std::chrono::milliseconds(1000));
  if (period.count() <= 0) period = std::chrono::milliseconds(100);
  idle_timer_.expires_after(period);
  idle_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || shut_down_) return;
    sweep_idle();
    arm_idle_sweep();
  });
}

void HbonePool::sweep_idle() {
  auto now = std::chrono::steady_clock::now();
  // Collected first: a connection may close at once (its GOAWAY written straight away), and its
  // close handler edits conns_.
  std::vector<std::shared_ptr<h2::H2Connection>> idle;
  for (auto& [key, v] : conns_) {
    for (auto& c : v) {
      if (c->usable() && c->active_streams() == 0 &&
          now - c->idle_since() >= ctx_.config.pool_idle_timeout) {
        SM_DEBUG("pool") << "releasing idle connection " << key.to_string();
        idle.push_back(c);
      }
    }
  }
  for (auto& c : idle) c->shutdown_gracefully();
}

}  // namespace sockmesh::proxy
