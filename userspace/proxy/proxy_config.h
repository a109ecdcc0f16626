#pragma once
// Run-time settings of one proxy process (command-line flags and environment), as opposed to
// the mesh state (workloads, services, policies) that comes from the local config file.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "base/ip_address.h"
#include "h2/connection.h"

namespace sockmesh::proxy {

// Ports as Istio's ztunnel uses them.
inline constexpr uint16_t kOutboundPort = 15001;
inline constexpr uint16_t kInboundPlaintextPort = 15006;
inline constexpr uint16_t kHbonePort = 15008;
inline constexpr uint16_t kSocks5Port = 15080;
inline constexpr uint16_t kAdminPort = 15000;
inline constexpr uint16_t kMetricsPort = 15020;
inline constexpr uint16_t kReadinessPort = 15021;

// Sockets the proxy opens towards applications and peers carry this mark, so that capture (tc or
// iptables) lets them pass instead of capturing the proxy's own traffic.
inline constexpr uint32_t kProxyMark = 0x539;

struct ProxyConfig {
  std::string node_name = "node-a";
  std::string config_file;  // empty: the embedded default
  std::string state_dir = "/var/lib/sockmesh";
  std::string certs_dir;  // mounted certificates; empty: the built-in CA
  std::string trust_domain = "cluster.local";
  int workers = 0;  // 0: max(2, 25% of cores)
  std::chrono::milliseconds config_poll{1000};

  std::optional<Endpoint> admin = Endpoint::parse("127.0.0.1:15000");
  std::optional<Endpoint> metrics = Endpoint::parse("0.0.0.0:15020");
  std::optional<Endpoint> readiness = Endpoint::parse("0.0.0.0:15021");
  std::optional<Endpoint> socks5;                  // off unless set
  std::optional<Endpoint> outbound;                // transparent, e.g. 0.0.0.0:15001
  std::optional<Endpoint> inbound_plaintext;       // transparent, e.g. 0.0.0.0:15006
  // HBONE: by default one listener on <ip>:15008 for each IP of each local workload; with
  // hbone_listen set, one listener there instead (e.g. 0.0.0.0:15008 inside a pod netns).
  std::optional<Endpoint> hbone_listen;
  uint16_t hbone_port = kHbonePort;

  bool preserve_source_ip = true;
  uint32_t mark = kProxyMark;
  std::chrono::milliseconds drain_timeout{5000};
  std::chrono::milliseconds pool_idle_timeout{30000};
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds handshake_timeout{10000};
  uint32_t max_streams_per_connection = 100;
  h2::Settings h2;

  int effective_workers() const;
};

}  // namespace sockmesh::proxy
