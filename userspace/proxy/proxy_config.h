#pragma once
// Run-time settings of one proxy process (command-line flags and environment), as opposed to
// the mesh state (workloads, services, policies) that comes from the local config file.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "h2/connection.h"
#include "net/sockets.h"
#include "sockmesh/consts.h"  // the kernel ABI: marks the BPF programs test, the pin root

namespace sockmesh::proxy {

// Ports as Istio's ztunnel uses them.
inline constexpr uint16_t kOutboundPort = 15001;
inline constexpr uint16_t kInboundPlaintextPort = 15006;
inline constexpr uint16_t kHbonePort = 15008;
inline constexpr uint16_t kSocks5Port = 15080;
inline constexpr uint16_t kAdminPort = 15000;
inline constexpr uint16_t kMetricsPort = 15020;
inline constexpr uint16_t kReadinessPort = 15021;

// A SOCKS5 client source address and the workload (by uid) it speaks for. Anything on the host
// can pick any 127.x source, so this is a grant by the operator, not a proof.
struct Socks5Client {
  IpAddress source;
  std::string workload_uid;
};

struct ProxyConfig {
  std::string node_name = "node-a";
  std::string config_file;  // empty: the embedded default
  std::string state_dir = "/var/lib/sockmesh";
  std::string certs_dir;  // mounted certificates; empty: the built-in CA
  std::string trust_domain = "cluster.local";
  // Istio's CA (istio.v1.auth.IstioCertificateService): when set, workload certificates come
  // from there and win over certs_dir and the built-in CA. "https://host:port".
  std::string ca_address;
  // Roots that verify the CA's server certificate and the chains it returns; the mesh bundle.
  std::string ca_root_ca = "./var/run/secrets/istio/root-cert.pem";
  // Bearer token for the control plane (CA and xDS), read again for every call.
  std::string token_file = "./var/run/secrets/tokens/istio-token";
  std::string cluster_id = "Kubernetes";
  // validity_duration asked of the CA.
  std::chrono::seconds secret_ttl{86400};
  // CreateCertificate calls in flight at once.
  uint32_t ca_max_requests = 8;
  int workers = 0;  // 0: max(2, 25% of cores)
  std::chrono::milliseconds config_poll{1000};
  // How often certificates are checked for renewal and mounted files (certificates and
  // root-cert.pem) for changes.
  std::chrono::milliseconds certificate_check{10000};

  std::optional<Endpoint> admin = Endpoint::parse("127.0.0.1:15000");
  std::optional<Endpoint> metrics = Endpoint::parse("0.0.0.0:15020");
  std::optional<Endpoint> readiness = Endpoint::parse("0.0.0.0:15021");
  // Limits of each of the three HTTP listeners above (observe::HttpLimits).
  size_t http_max_connections = 32;
  std::chrono::milliseconds http_request_timeout{10000};
  size_t http_max_request_bytes = 16384;
  std::optional<Endpoint> socks5;                  // off unless set
  // Who may use the SOCKS5 entry, and as which workload; a source not listed is refused.
  std::vector<Socks5Client> socks5_clients;
  std::optional<Endpoint> outbound;                // transparent, e.g. 0.0.0.0:15001
  std::optional<Endpoint> inbound_plaintext;       // transparent, e.g. 0.0.0.0:15006
  // HBONE: by default one listener on <ip>:15008 for each IP of each local workload; with
  // hbone_listen set, one listener there instead (e.g. 0.0.0.0:15008 inside a pod netns).
  std::optional<Endpoint> hbone_listen;
  uint16_t hbone_port = kHbonePort;

  bool preserve_source_ip = true;
  // Plain TCP relays (passthrough, inbound plaintext) move bytes with splice(2) where the sockmap
  // bypass allows it (see proxy/plain_relay.h); false: always copy through user space.
  bool splice_passthrough = true;
  // An outbound connection whose destination is a workload this proxy serves (on this node) is
  // authorized as the inbound side would and dialled straight into the server pod, instead of
  // through HBONE to the proxy's own 15008 (serve_same_node in proxy/outbound.cc). false: always
  // the tunnel.
  bool same_node_fast_path = true;
  // The source ports of those dials (the client's port is not kept: see net/source_port.h).
  net::PortRange kept_source_ports;
  // SO_MARK of the proxy's sockets, as bpf/include/sockmesh/consts.h defines them: tc never
  // captures a packet carrying SM_MARK_PROXY, and sockops puts sockets with SM_MARK_LOCAL_HOP
  // into the bypass map. `mark`: listeners, upstream and HBONE sockets; `mark_to_app`: the
  // sockets to a local application (the inbound hop).
  uint32_t mark = SM_MARK_PROXY_UPSTREAM;
  uint32_t mark_to_app = SM_MARK_PROXY_TO_APP;
  // In-pod mode: the node agent hands pods over this Unix socket (ZDS) and the proxy opens its
  // 15001/15006/15008 listeners inside each pod's netns. Empty: off.
  std::string zds_socket;
  // The DNS proxy (userspace/dns): answers the mesh's names and forwards the rest upstream. In
  // in-pod mode each pod gets UDP and TCP sockets on 15053 (tc sends its port-53 queries there);
  // otherwise it listens on dns_listen (UDP and TCP).
  bool dns_proxy = false;
  std::vector<Endpoint> dns_upstreams;  // empty: the nameservers of /etc/resolv.conf
  Endpoint dns_listen{*IpAddress::parse("127.0.0.1"), 15053};
  std::chrono::milliseconds dns_upstream_timeout{5000};
  // Where the loader pinned the maps: the workload map (identities of enrolled pods) and the
  // listener map (where the in-pod listeners are registered for tc).
  std::string bpf_pin_root = SM_PIN_ROOT_DEFAULT;
  std::chrono::milliseconds drain_timeout{5000};
  std::chrono::milliseconds pool_idle_timeout{30000};
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds handshake_timeout{10000};
  // CONNECT streams one pooled HBONE connection carries at once (ztunnel's default).
  uint32_t max_streams_per_connection = 100;
  // HBONE (15008) connections held at once, in total and from one source IP; checked at accept,
  // before the TLS handshake. 0: no limit.
  uint32_t hbone_max_connections = 16384;
  uint32_t hbone_max_connections_per_source = 2048;
  // An HBONE connection without an open stream for this long is closed (GOAWAY); 0: never.
  // ztunnel's POOL_UNUSED_RELEASE_TIMEOUT default.
  std::chrono::milliseconds hbone_idle_timeout{300000};
  h2::Settings h2;

  int effective_workers() const;
};

}  // namespace sockmesh::proxy
