#include "proxy/proxy.h"

#include <ifaddrs.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>
#include <algorithm>
#include <future>
#include <set>

#include "base/log.h"
#include "net/sockets.h"
#include "proxy/pool.h"

namespace sockmesh::proxy {

using Tcp = boost::asio::ip::tcp;

int ProxyConfig::effective_workers() const {
  if (workers > 0) return workers;
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return std::max(2, static_cast<int>(cores / 4));
}

policy::Verdict ProxyContext::admit(const state::Snapshot& snap, const state::Workload& dst,
                                    const policy::ConnectionFacts& facts) const {
  auto verdict = policy::authorize(snap, dst, facts);
  if (verdict.dry_run) {
    SM_INFO("policy") << (facts.source_principal.empty() ? "plaintext" : facts.source_principal)
                      << " from " << facts.source_ip.to_string() << " -> "
                      << Endpoint{facts.destination_ip, facts.destination_port}.to_string() << ": "
                      << policy::dry_run_summary(verdict);
  }
  return verdict;
}

net::DialOptions ProxyContext::dial_to_app(const IpAddress& client, const IpAddress& app) const {
  net::DialOptions opts;
  if (config.preserve_source_ip) opts.source = client;
  opts.kept_source_ports = config.kept_source_ports;
  opts.mark = config.mark_to_app;
  opts.netns = pod_netns.find(app);
  return opts;
}

const state::Workload* ProxyContext::find_local(const state::Snapshot& snap,
                                                const IpAddress& ip) const {
  const state::Workload* w = snap.workload_by_ip(ip);
  if (w == nullptr || w->node != config.node_name) return nullptr;
  return w;
}

namespace {

// Whether `ip` is an address of this network namespace (loopback included).
bool is_local_address(const IpAddress& ip) {
  if (ip.is_loopback() || ip.is_unspecified()) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return true;  // cannot tell: treat as ours, refusing is the safe side
  bool found = false;
  for (ifaddrs* a = list; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    auto addr = IpAddress::from_sockaddr(a->ifa_addr);
    found = addr && *addr == ip;
  }
  freeifaddrs(list);
  return found;
}

}  // namespace

bool ProxyContext::is_own_listener(const Endpoint& dst) const {
  const std::optional<Endpoint>* listeners[] = {
      &config.admin,    &config.metrics,           &config.readiness,   &config.socks5,
      &config.outbound, &config.inbound_plaintext, &config.hbone_listen};
  for (const auto* l : listeners) {
    if (!l->has_value() || (*l)->port != dst.port) continue;
    if ((*l)->ip == dst.ip) return true;
    // The kernel's own rule: a wildcard listener takes connections to every local address.
    if ((*l)->ip.is_unspecified() && is_local_address(dst.ip)) return true;
  }
  return false;
}

bool ProxyContext::is_proxy_port(uint16_t port) const {
  return port == kOutboundPort || port == kInboundPlaintextPort || port == config.hbone_port ||
         port == kHbonePort || port == kSocks5Port;
}

Proxy::Proxy(ProxyConfig config, state::StateStore& store, CertificateSource certificates,
             std::shared_ptr<tls::MeshTls> tls, observe::Registry& metrics)
    : inbound_(ctx_), inbound_plaintext_(ctx_), outbound_(ctx_), socks5_(ctx_, outbound_) {
  ctx_.config = std::move(config);
  ctx_.store = &store;
  ctx_.tls = std::move(tls);
  ctx_.certificate_for = std::move(certificates);
  ctx_.metrics = &metrics;
  ctx_.hbone_limits = std::make_shared<ConnectionLimits>(
      ctx_.config.hbone_max_connections, ctx_.config.hbone_max_connections_per_source);
  ctx_.local_workload = [this](const state::Snapshot& s, const IpAddress& ip) {
    return ctx_.find_local(s, ip);
  };
  int n = ctx_.config.effective_workers();
  for (int i = 0; i < n; ++i) {
    auto w = std::make_unique<Worker>(i);
    w->set_pool(std::make_unique<HbonePool>(ctx_, *w));
    ctx_.workers.push_back(std::move(w));
  }
}

Proxy::~Proxy() { stop(); }

void Proxy::set_local_workload_lookup(LocalWorkloadLookup lookup) {
  ctx_.local_workload = std::move(lookup);
}

std::optional<std::string> Proxy::open(const std::string& role, const Endpoint& at,
                                       const net::ListenOptions& options,
                                       std::function<void(Worker&, Tcp::socket)> handler) {
  auto l = std::make_unique<Listener>(control_);
  l->role = role;
  l->handler = std::move(handler);
  if (auto err = net::listen(l->acceptor, at, options)) {
    return role + " listener on " + at.to_string() + ": " + *err;
  }
  boost::system::error_code ec;
  l->at = net::from_asio(l->acceptor.local_endpoint(ec));
  SM_INFO("proxy") << "listening: " << role << " on " << l->at.to_string()
                   << (options.transparent ? " (transparent)" : "");
  auto* raw = l.get();
  listeners_[role + "/" + at.to_string()] = std::move(l);
  accept_loop(*raw);
  return std::nullopt;
}

void Proxy::accept_loop(Listener& l) {
  Worker& w = ctx_.pick_worker();
  l.acceptor.async_accept(w.io(), [this, &l, &w](const boost::system::error_code& ec,
                                                 Tcp::socket socket) {
    if (ec == boost::asio::error::operation_aborted || !l.acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors or memory: say so, wait a little, and keep serving.
      SM_WARN("proxy") << l.role << " accept on " << l.at.to_string() << " failed: "
                       << ec.message();
      l.backoff.expires_after(std::chrono::milliseconds(100));
      l.backoff.async_wait([this, &l](const boost::system::error_code& e) {
        if (!e && l.acceptor.is_open()) accept_loop(l);
      });
      return;
    }
    // A captured app connection is reset, not ended, if this process dies before its relay
    // starts (the relays arm their sockets themselves; SOCKS5 ends its refusals with a reply).
    if (l.role == "outbound" || l.role == "inbound_plaintext") {
      net::reset_unless_closed_gracefully(socket);
    }
    boost::asio::post(w.io(), [&w, handler = l.handler, s = std::move(socket)]() mutable {
      handler(w, std::move(s));
    });
    accept_loop(l);
  });
}

std::function<void(Worker&, Tcp::socket)> Proxy::handler_for(const std::string& role) {
  if (role == "outbound") {
    return [this](Worker& w, Tcp::socket s) {
      boost::system::error_code ec;
      auto peer = s.remote_endpoint(ec);
      auto dst = net::original_destination(s);
      if (ec || !dst) return;
      outbound_.handle(w, std::move(s), net::from_asio(peer), *dst);
    };
  }
  if (role == "inbound_plaintext") {
    return [this](Worker& w, Tcp::socket s) { inbound_plaintext_.handle(w, std::move(s)); };
  }
  if (role == "hbone") {
    return [this](Worker& w, Tcp::socket s) { inbound_.handle(w, std::move(s)); };
  }
  return nullptr;
}

void Proxy::on_control(const std::function<void()>& f) {
  if (control_.get_executor().running_in_this_thread()) {
    f();
    return;
  }
  std::promise<void> done;
  boost::asio::post(control_, [&] {
    f();
    done.set_value();
  });
  done.get_future().wait();
}

// Listener keys of a pod: "pod:<uid>\0<role>"; a uid holds no NUL, so no pod's prefix is another's.
static std::string pod_key_prefix(const std::string& pod_uid) {
  return "pod:" + pod_uid + std::string(1, '\0');
}

std::optional<std::string> Proxy::adopt_listeners(const std::string& pod_uid,
                                                  std::vector<AdoptedListener> listeners) {
  auto close_all = [&] {
    for (auto& a : listeners) {
      if (a.fd >= 0) ::close(a.fd);
    }
  };
  if (stopped_ || !ready_ || ctx_.draining) {
    close_all();
    return "the proxy is not running";
  }
  std::optional<std::string> err;
  on_control([&] {
    close_pod_listeners(pod_uid);
    for (auto& a : listeners) {
      if (a.role == "dns_udp" || a.role == "dns_tcp") {
        if (!dns_) {
          err = "pod " + pod_uid + ": a DNS socket, but the DNS proxy is off";
          break;
        }
        dns::Binding b;
        b.tag = pod_uid;
        // Upstream queries (and transparent reply sockets) for the pod leave from its netns.
        b.open_socket = [netns = a.netns](int family, int type, std::string* error) {
          int fd = -1;
          int saved = 0;
          auto e = net::run_in(netns.get(), [&] {
            fd = ::socket(family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            saved = errno;
          });
          if (e) {
            *error = "entering the pod's netns: " + *e;
          } else if (fd < 0) {
            *error = std::string("socket() in the pod's netns: ") + std::strerror(saved);
          }
          return fd;
        };
        int fd = std::exchange(a.fd, -1);
        auto s = a.role == "dns_udp" ? dns_->serve_udp(fd, std::move(b))
                                     : dns_->serve_tcp(fd, std::move(b));
        if (!s) {
          err = "pod " + pod_uid + ": " + s.error().message;
          break;
        }
        continue;
      }
      auto handler = handler_for(a.role);
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      if (!handler || getsockname(a.fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
          (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)) {
        err = "pod " + pod_uid + ": not a TCP listener of a known role: " + a.role;
        break;
      }
      auto l = std::make_unique<Listener>(control_);
      l->role = a.role + " (pod " + pod_uid + ")";
      l->handler = std::move(handler);
      boost::system::error_code ec;
      l->acceptor.assign(ss.ss_family == AF_INET ? Tcp::v4() : Tcp::v6(), a.fd, ec);
      if (ec) {
        err = "pod " + pod_uid + ": adopting the " + a.role + " listener: " + ec.message();
        break;
      }
      a.fd = -1;  // the acceptor owns it now
      l->at = net::from_asio(l->acceptor.local_endpoint(ec));
      SM_INFO("proxy") << "listening: " << l->role << " on " << l->at.to_string() << " in the pod";
      auto* raw = l.get();
      listeners_[pod_key_prefix(pod_uid) + a.role + "/" + l->at.to_string()] = std::move(l);
      accept_loop(*raw);
    }
    if (err) close_pod_listeners(pod_uid);
  });
  close_all();  // whatever was not adopted
  return err;
}

void Proxy::release_listeners(const std::string& pod_uid) {
  if (stopped_ || !ready_) return;
  on_control([&] { close_pod_listeners(pod_uid); });
}

void Proxy::close_pod_listeners(const std::string& pod_uid) {
  if (dns_) dns_->close_tag(pod_uid);
  std::string prefix = pod_key_prefix(pod_uid);
  std::vector<std::unique_ptr<Listener>> closing;
  for (auto it = listeners_.lower_bound(prefix);
       it != listeners_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    SM_INFO("proxy") << "closing " << it->second->role << " on " << it->second->at.to_string();
    closing.push_back(std::move(it->second));
    it = listeners_.erase(it);
  }
  retire(std::move(closing));
}

void Proxy::retire(std::vector<std::unique_ptr<Listener>> listeners) {
  if (listeners.empty()) return;
  for (auto& l : listeners) {
    boost::system::error_code ec;
    l->acceptor.close(ec);
    l->backoff.cancel();
  }
  // Accept and backoff completions already queued still look at their Listener (accept_loop holds
  // it by reference), and cancel() cannot recall them: free it behind them. Two hops, because a
  // completion that runs before the first hop may queue one more (an accept on the closed
  // acceptor), and that one lands behind the first hop but ahead of the second.
  auto closed = std::make_shared<std::vector<std::unique_ptr<Listener>>>(std::move(listeners));
  boost::asio::post(control_,
                    [this, closed] { boost::asio::post(control_, [closed] { closed->clear(); }); });
}

std::optional<std::string> Proxy::start() {
  for (auto& w : ctx_.workers) w->start();
  guard_ = std::make_unique<
      boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>(
      control_.get_executor());
  control_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "sm-control");
    control_.run();
  });
  auto opened = std::make_shared<std::promise<std::optional<std::string>>>();
  auto result = opened->get_future();
  boost::asio::post(control_, [this, opened] {
    const auto& c = ctx_.config;
    net::ListenOptions plain;
    net::ListenOptions transparent;
    transparent.transparent = true;
    transparent.mark = c.mark;
    std::optional<std::string> err;
    if (!err && c.socks5 && c.socks5_clients.empty()) {
      SM_WARN("proxy") << "SOCKS5 on " << c.socks5->to_string()
                       << " refuses every client: --socks5-clients grants no source address a "
                          "workload";
    }
    if (!err && c.socks5) {
      err = open("socks5", *c.socks5, plain,
                 [this](Worker& w, Tcp::socket s) { socks5_.handle(w, std::move(s)); });
    }
    if (!err && c.outbound) {
      err = open("outbound", *c.outbound, transparent, handler_for("outbound"));
    }
    if (!err && c.inbound_plaintext) {
      err = open("inbound_plaintext", *c.inbound_plaintext, transparent,
                 handler_for("inbound_plaintext"));
    }
    if (!err && c.hbone_listen) err = open("hbone", *c.hbone_listen, plain, handler_for("hbone"));
    if (!err && c.dns_proxy) err = start_dns();
    // In-pod mode: HBONE listeners come with the pods (ZDS), not from the config.
    if (!err && !c.hbone_listen && c.zds_socket.empty()) reconcile_hbone_listeners();
    opened->set_value(err);
  });
  auto err = result.get();
  if (err) return err;
  ctx_.store->subscribe([this](const state::SnapshotPtr&, const state::SnapshotPtr& next) {
    if (stopped_) return;
    if (!ctx_.config.hbone_listen && ctx_.config.zds_socket.empty()) {
      boost::asio::post(control_, [this] { reconcile_hbone_listeners(); });
    }
    recheck_policies(next);
  });
  ready_ = true;
  return std::nullopt;
}

std::optional<std::string> Proxy::start_dns() {
  const auto& c = ctx_.config;
  dns::ServerOptions o;
  o.upstreams = c.dns_upstreams.empty() ? dns::nameservers_from_resolv_conf() : c.dns_upstreams;
  o.upstream_timeout = c.dns_upstream_timeout;
  o.upstream_mark = c.mark;
  if (o.upstreams.empty()) {
    SM_WARN("dns") << "no upstream resolvers (none given and none in /etc/resolv.conf): names "
                      "outside the mesh get SERVFAIL";
  }
  std::string upstreams;
  for (const auto& u : o.upstreams) upstreams += (upstreams.empty() ? "" : ",") + u.to_string();
  dns_ = dns::Server::create(
      control_, std::move(o), [store = ctx_.store] { return store->get(); }, *ctx_.metrics);
  SM_INFO("dns") << "DNS proxy on; upstreams " << (upstreams.empty() ? "none" : upstreams);
  if (!c.zds_socket.empty()) return std::nullopt;  // the sockets come with the pods
  // Shared mode: one UDP socket and one TCP listener at dns_listen, in the proxy's netns.
  for (int type : {SOCK_DGRAM, SOCK_STREAM}) {
    std::string error;
    int fd = dns::open_dns_socket(type, c.dns_listen, false, c.mark, &error);
    if (fd < 0) return error;
    auto s = type == SOCK_DGRAM ? dns_->serve_udp(fd) : dns_->serve_tcp(fd);
    if (!s) return s.error().message;
  }
  return std::nullopt;
}

void Proxy::reconcile_hbone_listeners() {
  if (ctx_.draining) return;
  auto snap = ctx_.store->get();
  std::set<std::string> wanted;
  for (const auto& w : snap->workloads()) {
    if (w.node != ctx_.config.node_name) continue;
    for (const auto& ip : w.ips) {
      Endpoint at{ip, ctx_.config.hbone_port};
      std::string key = "hbone/" + at.to_string();
      wanted.insert(key);
      if (listeners_.count(key) != 0) continue;
      if (auto err = open("hbone", at, net::ListenOptions{}, handler_for("hbone"))) {
        SM_ERROR("proxy") << *err;
      }
    }
  }
  std::vector<std::unique_ptr<Listener>> closing;
  for (auto it = listeners_.begin(); it != listeners_.end();) {
    if (it->second->role == "hbone" && wanted.count(it->first) == 0) {
      SM_INFO("proxy") << "closing hbone listener on " << it->second->at.to_string()
                       << ": workload left this node";
      closing.push_back(std::move(it->second));
      it = listeners_.erase(it);
    } else {
      ++it;
    }
  }
  retire(std::move(closing));
}

void Proxy::recheck_policies(const state::SnapshotPtr& snap) {
  for (auto& w : ctx_.workers) {
    boost::asio::post(w->io(), [this, worker = w.get(), snap] {
      std::vector<std::pair<std::function<void(const std::string&)>, std::string>> revoked;
      for (auto& [id, live] : worker->live()) {
        const state::Workload* dst = snap->workload_by_uid(live.destination_uid);
        if (dst == nullptr) {
          // A pod known from the node's workload map rather than the config file.
          dst = ctx_.local_workload(*snap, live.facts.destination_ip);
          if (dst != nullptr && dst->uid != live.destination_uid) dst = nullptr;
        }
        if (dst == nullptr) {
          revoked.emplace_back(live.abort, "destination workload was removed");
          continue;
        }
        auto verdict = policy::authorize(*snap, *dst, live.facts);
        if (!verdict.allowed) {
          revoked.emplace_back(live.abort, "policy now denies: " + verdict.reason);
        }
      }
      for (auto& [abort, reason] : revoked) {
        SM_INFO("policy") << "closing live connection: " << reason;
        abort(reason);
      }
    });
  }
}

std::vector<std::pair<std::string, Endpoint>> Proxy::listening() {
  if (control_.get_executor().running_in_this_thread()) {
    std::vector<std::pair<std::string, Endpoint>> out;
    for (auto& [_, l] : listeners_) out.emplace_back(l->role, l->at);
    return out;
  }
  std::promise<std::vector<std::pair<std::string, Endpoint>>> p;
  auto f = p.get_future();
  boost::asio::post(control_, [this, &p] {
    std::vector<std::pair<std::string, Endpoint>> out;
    for (auto& [_, l] : listeners_) out.emplace_back(l->role, l->at);
    p.set_value(std::move(out));
  });
  return f.get();
}

int64_t Proxy::active_connections() {
  int64_t n = 0;
  for (auto& w : ctx_.workers) n += w->active().load();
  return n;
}

Proxy::ConnectionList Proxy::connections(std::chrono::milliseconds wait, size_t limit) {
  ConnectionList out;
  // Shared with the posted tasks: a worker that answers after `wait` writes into it harmlessly.
  using Answer = std::promise<std::vector<ConnectionSummary>>;
  std::vector<std::pair<std::shared_ptr<Answer>, std::future<std::vector<ConnectionSummary>>>> asked;
  for (auto& w : ctx_.workers) {
    auto answer = std::make_shared<Answer>();
    asked.emplace_back(answer, answer->get_future());
    boost::asio::post(w->io(), [worker = w.get(), answer] {
      std::vector<ConnectionSummary> mine;
      mine.reserve(worker->records().size());
      for (const ConnectionRecord* r : worker->records()) mine.push_back(r->summary());
      answer->set_value(std::move(mine));
    });
  }
  auto until = std::chrono::steady_clock::now() + wait;
  for (auto& [_, f] : asked) {
    if (f.wait_until(until) != std::future_status::ready) {
      ++out.unanswered_workers;
      continue;
    }
    for (auto& c : f.get()) out.connections.push_back(std::move(c));
  }
  out.total = out.connections.size();
  // Oldest first: the long-lived connections an operator usually looks for.
  std::sort(out.connections.begin(), out.connections.end(),
            [](const ConnectionSummary& a, const ConnectionSummary& b) {
              return a.access.started < b.access.started;
            });
  if (out.connections.size() > limit) out.connections.resize(limit);
  return out;
}

void Proxy::drain(std::chrono::milliseconds deadline) {
  if (stopped_) return;
  ctx_.draining = true;
  ready_ = false;
  SM_INFO("proxy") << "draining: no new connections; waiting up to " << deadline.count()
                   << " ms for " << active_connections() << " active connection(s)";
  std::promise<void> closed;
  boost::asio::post(control_, [this, &closed] {
    for (auto& [_, l] : listeners_) {
      boost::system::error_code ec;
      l->acceptor.close(ec);
    }
    closed.set_value();
  });
  closed.get_future().wait();
  for (auto& w : ctx_.workers) {
    boost::asio::post(w->io(), [worker = w.get()] {
      worker->drain_all();
      worker->pool().shutdown_all();
    });
  }
  auto until = std::chrono::steady_clock::now() + deadline;
  while (active_connections() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  int64_t left = active_connections();
  if (left > 0) {
    SM_WARN("proxy") << "drain deadline reached; closing " << left << " connection(s)";
    for (auto& w : ctx_.workers) {
      boost::asio::post(w->io(), [worker = w.get()] {
        std::vector<std::function<void(const std::string&)>> aborts;
        for (auto& [_, live] : worker->live()) aborts.push_back(live.abort);
        for (auto& a : aborts) a("proxy shutting down");
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } else {
    SM_INFO("proxy") << "drained: all connections finished";
  }
  stop();
}

void Proxy::stop() {
  if (stopped_.exchange(true)) return;
  ready_ = false;
  guard_.reset();
  control_.stop();
  if (control_thread_.joinable()) control_thread_.join();
  listeners_.clear();
  for (auto& w : ctx_.workers) w->stop();
}

}  // namespace sockmesh::proxy
