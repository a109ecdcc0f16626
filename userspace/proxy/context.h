#pragma once
// What every role of the proxy shares: settings, the mesh state, certificates, TLS contexts,
// metrics and the worker threads. Members are either immutable after start-up or thread-safe.
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "identity/certificate.h"
#include "net/netns.h"
#include "net/sockets.h"
#include "observe/metrics.h"
#include "policy/authorize.h"
#include "proxy/bypass_pinning.h"
#include "proxy/connection_limits.h"
#include "proxy/enrolled_workloads.h"
#include "proxy/proxy_config.h"
#include "proxy/worker.h"
#include "state/store.h"
#include "tls/mesh_tls.h"

namespace sockmesh::proxy {

// Finds the local workload that owns an IP: the mesh state's view, optionally overridden by the
// node's BPF workload map (which knows which pods are enrolled here).
using LocalWorkloadLookup =
    std::function<const state::Workload*(const state::Snapshot&, const IpAddress&)>;
// The certificate to present for an identity (issued or loaded on demand, cached).
using CertificateSource =
    std::function<identity::Result<identity::CertifiedKeyPtr>(const std::string& spiffe_id)>;

struct ProxyContext {
  ProxyConfig config;
  state::StateStore* store = nullptr;
  std::shared_ptr<tls::MeshTls> tls;
  CertificateSource certificate_for;
  LocalWorkloadLookup local_workload;
  // In-pod mode: the netns of each pod IP handed over by the node agent (ZDS), where the sockets
  // to and from that pod are created. Empty otherwise.
  net::NetnsByIp pod_netns;
  observe::Registry* metrics = nullptr;
  // Pins an app's bypassed flow to the TCP stack when the proxy stops reading it; null: never.
  std::shared_ptr<BypassPinning> bypass_pinning;
  std::vector<std::unique_ptr<Worker>> workers;
  // Caps on inbound HBONE connections (config.hbone_max_connections*).
  std::shared_ptr<ConnectionLimits> hbone_limits;
  std::atomic<uint64_t> next_worker{0};
  std::atomic<bool> draining{false};

  Worker& pick_worker() {
    return *workers[next_worker.fetch_add(1, std::memory_order_relaxed) % workers.size()];
  }
  // The default lookup: a workload in the snapshot whose node is this proxy's node.
  const state::Workload* find_local(const state::Snapshot& snap, const IpAddress& ip) const;
  bool is_proxy_port(uint16_t port) const;
  // True when `dst` reaches one of this proxy's own configured listeners (admin, metrics,
  // readiness, SOCKS5, outbound, inbound plaintext, a single HBONE listener), whatever their
  // ports: the same address, or any address of this host for a wildcard listener.
  bool is_own_listener(const Endpoint& dst) const;
  // Authorizes a new connection to the local workload `dst` (policy::authorize) and logs what the
  // dry-run policies that apply would have decided. Every admission path calls it: inbound HBONE,
  // inbound plaintext and the same-node fast path.
  policy::Verdict admit(const state::Snapshot& snap, const state::Workload& dst,
                        const policy::ConnectionFacts& facts) const;
  // How the proxy dials an app for `client` (inbound HBONE, inbound plaintext, the same-node fast
  // path): the client's IP as the source when it is preserved, the kept source ports, the to-app
  // mark that sockops pairs with the app, and in in-pod mode the app's own netns.
  net::DialOptions dial_to_app(const IpAddress& client, const IpAddress& app) const;
  // For a socket towards an app, right after accept or connect: what its relay runs to send the
  // app's flow back to the TCP stack (BypassPinning::exit_handler), or nullptr.
  BypassExit bypass_exit(int fd) const {
    return bypass_pinning ? bypass_pinning->exit_handler(fd) : nullptr;
  }
};

}  // namespace sockmesh::proxy
