#include "app/options.h"

#include <charconv>
#include <cstdlib>
#include <functional>
#include <map>

#include "dns/server.h"

namespace sockmesh::app {
namespace {

using Setter = std::function<std::optional<std::string>(const std::string&, Options*)>;

std::optional<std::string> parse_endpoint(const std::string& v, std::optional<Endpoint>* out) {
  if (v == "off" || v == "none" || v.empty()) {
    out->reset();
    return std::nullopt;
  }
  auto e = Endpoint::parse(v);
  if (!e) {
    // Port 0 is allowed here (pick a free port), which Endpoint::parse refuses.
    auto colon = v.rfind(':');
    if (colon != std::string::npos && v.substr(colon + 1) == "0") {
      auto ip = IpAddress::parse(v.front() == '[' ? v.substr(1, colon - 2) : v.substr(0, colon));
      if (ip) {
        *out = Endpoint{*ip, 0};
        return std::nullopt;
      }
    }
    return "expected ip:port, got '" + v + "'";
  }
  *out = *e;
  return std::nullopt;
}

std::optional<std::string> parse_int(const std::string& v, long long min, long long max,
                                     long long* out) {
  long long n = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || p != v.data() + v.size() || n < min || n > max) {
    return "expected a whole number from " + std::to_string(min) + " to " + std::to_string(max) +
           ", got '" + v + "'";
  }
  *out = n;
  return std::nullopt;
}

std::optional<std::string> parse_bool(const std::string& v, bool* out) {
  if (v == "true" || v == "1" || v == "yes") {
    *out = true;
  } else if (v == "false" || v == "0" || v == "no") {
    *out = false;
  } else {
    return "expected true or false, got '" + v + "'";
  }
  return std::nullopt;
}

// Go-style durations as Istio's settings use them: "24h", "1h30m", "20s", "500ms"; a bare number
// is seconds.
std::optional<std::string> parse_duration(const std::string& v, std::chrono::milliseconds* out) {
  long long plain = 0;
  auto [pp, pec] = std::from_chars(v.data(), v.data() + v.size(), plain);
  if (pec == std::errc() && pp == v.data() + v.size() && plain >= 0) {
    *out = std::chrono::seconds(plain);
    return std::nullopt;
  }
  std::chrono::milliseconds total{0};
  const char* p = v.data();
  const char* end = v.data() + v.size();
  if (p == end) return "expected a duration such as 24h, 30m or 20s, got ''";
  while (p < end) {
    long long n = 0;
    auto [q, ec] = std::from_chars(p, end, n);
    if (ec != std::errc() || q == p || n < 0 || n > 1000000000) {
      return "expected a duration such as 24h, 30m or 20s, got '" + v + "'";
    }
    p = q;
    std::string_view rest(p, static_cast<size_t>(end - p));
    if (rest.substr(0, 2) == "ms") {
      total += std::chrono::milliseconds(n);
      p += 2;
    } else if (!rest.empty() && (rest[0] == 'h' || rest[0] == 'm' || rest[0] == 's')) {
      total += rest[0] == 'h'   ? std::chrono::milliseconds(std::chrono::hours(n))
               : rest[0] == 'm' ? std::chrono::milliseconds(std::chrono::minutes(n))
                                : std::chrono::milliseconds(std::chrono::seconds(n));
      ++p;
    } else {
      return "expected a duration such as 24h, 30m or 20s, got '" + v + "'";
    }
  }
  *out = total;
  return std::nullopt;
}

Setter endpoint(std::optional<Endpoint> proxy::ProxyConfig::*field) {
  return [field](const std::string& v, Options* o) { return parse_endpoint(v, &(o->proxy.*field)); };
}

Setter millis(std::chrono::milliseconds proxy::ProxyConfig::*field) {
  return [field](const std::string& v, Options* o) -> std::optional<std::string> {
    long long n = 0;
    if (auto err = parse_int(v, 0, 86400000, &n)) return err;
    o->proxy.*field = std::chrono::milliseconds(n);
    return std::nullopt;
  };
}

Setter count(uint32_t proxy::ProxyConfig::*field) {
  return [field](const std::string& v, Options* o) -> std::optional<std::string> {
    long long n = 0;
    if (auto err = parse_int(v, 0, 100000000, &n)) return err;
    o->proxy.*field = static_cast<uint32_t>(n);
    return std::nullopt;
  };
}

Setter text(std::string proxy::ProxyConfig::*field) {
  return [field](const std::string& v, Options* o) -> std::optional<std::string> {
    o->proxy.*field = v;
    return std::nullopt;
  };
}

Setter xds_text(std::string XdsSettings::*field) {
  return [field](const std::string& v, Options* o) -> std::optional<std::string> {
    o->xds.*field = v;
    return std::nullopt;
  };
}

// A setting that the xDS client and the CA client share (one flag, one variable).
Setter shared_text(std::string proxy::ProxyConfig::*proxy_field, std::string XdsSettings::*xds_field) {
  return [proxy_field, xds_field](const std::string& v, Options* o) -> std::optional<std::string> {
    o->proxy.*proxy_field = v;
    o->xds.*xds_field = v;
    return std::nullopt;
  };
}

Setter kube_text(std::string KubeCsrSettings::*field) {
  return [field](const std::string& v, Options* o) -> std::optional<std::string> {
    o->kube.*field = v;
    return std::nullopt;
  };
}

const std::map<std::string, std::pair<Setter, const char*>>& flags() {
  static const std::map<std::string, std::pair<Setter, const char*>> f = {
      {"node", {text(&proxy::ProxyConfig::node_name), "this node's name (workloads whose node matches are local)"}},
      {"config", {text(&proxy::ProxyConfig::config_file), "local config YAML (ztunnel format); default: embedded"}},
      {"state-dir", {text(&proxy::ProxyConfig::state_dir), "where the built-in CA keeps its root (default /var/lib/sockmesh)"}},
      {"certs-dir", {text(&proxy::ProxyConfig::certs_dir), "mounted certificates instead of the built-in CA"}},
      {"trust-domain", {text(&proxy::ProxyConfig::trust_domain), "mesh trust domain (default cluster.local; env TRUST_DOMAIN)"}},
      {"ca-address", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                        o->proxy.ca_address = v;
                        o->ca_address_given = true;
                        return std::nullopt;
                      }, "Istio's CA, https://host:port: workload certificates from there, winning over --certs-dir and the built-in CA; '' = off (default: the --xds-address when that is set, else off; env CA_ADDRESS)"}},
      {"ca-provider", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                         static const std::map<std::string, CaProvider> names = {
                             {"auto", CaProvider::kAuto},       {"", CaProvider::kAuto},
                             {"istio", CaProvider::kIstio},     {"kubernetes", CaProvider::kKubernetes},
                             {"files", CaProvider::kFiles},     {"builtin", CaProvider::kBuiltin}};
                         auto it = names.find(v);
                         if (it == names.end()) {
                           return "expected auto, istio, kubernetes, files or builtin, got '" + v + "'";
                         }
                         o->ca_provider = it->second;
                         return std::nullopt;
                       }, "where workload certificates come from: auto (Istio's CA if --ca-address is set, else --certs-dir if set, else the built-in CA), istio, kubernetes (the CSR API, --k8s-signer-name), files, builtin (default auto)"}},
      {"k8s-api-server", {kube_text(&KubeCsrSettings::api_server), "Kubernetes API server for --ca-provider kubernetes, https://host:port (default: in a pod, https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)"}},
      {"k8s-api-ca", {kube_text(&KubeCsrSettings::api_ca), "PEM roots for the Kubernetes API server's certificate; '' = the system's (default /var/run/secrets/kubernetes.io/serviceaccount/ca.crt)"}},
      {"k8s-token-file", {kube_text(&KubeCsrSettings::token_file), "bearer token for the Kubernetes API, read for every request; '' = none (default /var/run/secrets/kubernetes.io/serviceaccount/token)"}},
      {"k8s-signer-name", {kube_text(&KubeCsrSettings::signer_name), "signerName of the CertificateSigningRequests (--ca-provider kubernetes), e.g. example.com/istio-workloads (default: unset)"}},
      {"k8s-csr-timeout", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                             std::chrono::milliseconds d{0};
                             if (auto e = parse_duration(v, &d)) return e;
                             if (d < std::chrono::seconds(1)) return "must be at least 1s, got '" + v + "'";
                             o->kube.approval_timeout = d;
                             return std::nullopt;
                           }, "how long a CertificateSigningRequest may wait for approval and its certificate, e.g. 60s (default 60s)"}},
      {"ca-root-ca", {text(&proxy::ProxyConfig::ca_root_ca), "PEM roots for the CA's server certificate and the chains it signs; the mesh's trust bundle, re-read every --certificate-check-ms (default ./var/run/secrets/istio/root-cert.pem; env CA_ROOT_CA)"}},
      {"xds-token-file", {shared_text(&proxy::ProxyConfig::token_file, &XdsSettings::token_file), "bearer token sent to istiod (xDS and CA), read for every call and connection; '' = none (default ./var/run/secrets/tokens/istio-token; env AUTH_TOKEN)"}},
      {"cluster-id", {shared_text(&proxy::ProxyConfig::cluster_id, &XdsSettings::cluster_id), "clusterid sent to istiod (xDS and CA) (default Kubernetes; env CLUSTER_ID)"}},
      {"secret-ttl", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                        std::chrono::milliseconds d{0};
                        if (auto e = parse_duration(v, &d)) return e;
                        if (d < std::chrono::seconds(1)) return "must be at least 1s, got '" + v + "'";
                        o->proxy.secret_ttl = std::chrono::duration_cast<std::chrono::seconds>(d);
                        return std::nullopt;
                      }, "certificate lifetime asked of the CA, e.g. 24h, 20s (default 24h; env SECRET_TTL)"}},
      {"ca-max-requests", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                             long long n = 0;
                             if (auto e = parse_int(v, 1, 1024, &n)) return e;
                             o->proxy.ca_max_requests = static_cast<uint32_t>(n);
                             return std::nullopt;
                           }, "certificate requests to the CA in flight at once (default 8)"}},
      {"workers", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                     long long n = 0;
                     if (auto e = parse_int(v, 0, 256, &n)) return e;
                     o->proxy.workers = static_cast<int>(n);
                     return std::nullopt;
                   }, "worker threads; 0 = max(2, 25% of cores)"}},
      {"admin", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                   // As ztunnel: the admin API (log levels, config dump) is reachable from this
                   // host only; scrapers and probes use 15020 and 15021.
                   if (auto e = parse_endpoint(v, &o->proxy.admin)) return e;
                   if (o->proxy.admin && !o->proxy.admin->ip.is_loopback()) {
                     std::string refused = o->proxy.admin->to_string();
                     o->proxy.admin = Endpoint::parse("127.0.0.1:15000");
                     return "the admin listener binds a loopback address only (127.0.0.0/8 or "
                            "::1), got " + refused;
                   }
                   return std::nullopt;
                 }, "admin address, loopback only (default 127.0.0.1:15000; 'off')"}},
      {"http-max-connections", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                                  long long n = 0;
                                  if (auto e = parse_int(v, 1, 4096, &n)) return e;
                                  o->proxy.http_max_connections = static_cast<size_t>(n);
                                  return std::nullopt;
                                }, "open connections per admin/metrics/readiness listener (default 32)"}},
      {"http-request-timeout-ms", {millis(&proxy::ProxyConfig::http_request_timeout), "admin/metrics/readiness: a request must arrive, and its answer be taken, in this (default 10000)"}},
      {"http-max-request-bytes", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                                    long long n = 0;
                                    if (auto e = parse_int(v, 1024, 1 << 20, &n)) return e;
                                    o->proxy.http_max_request_bytes = static_cast<size_t>(n);
                                    return std::nullopt;
                                  }, "admin/metrics/readiness: largest request head, and body (default 16384)"}},
      {"metrics", {endpoint(&proxy::ProxyConfig::metrics), "metrics address (default 0.0.0.0:15020)"}},
      {"readiness", {endpoint(&proxy::ProxyConfig::readiness), "readiness address (default 0.0.0.0:15021)"}},
      {"socks5", {endpoint(&proxy::ProxyConfig::socks5), "SOCKS5 address, e.g. 127.0.0.1:15080 (default off)"}},
      {"socks5-clients",
       {[](const std::string& v, Options* o) -> std::optional<std::string> {
          o->proxy.socks5_clients.clear();
          size_t start = 0;
          while (start <= v.size() && !v.empty()) {
            size_t comma = v.find(',', start);
            std::string item =
                v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
            auto eq = item.find('=');
            auto ip = eq == std::string::npos ? std::nullopt : IpAddress::parse(item.substr(0, eq));
            if (!ip || eq + 1 >= item.size()) {
              return "expected SOURCE_IP=WORKLOAD_UID[,...], got '" + item + "'";
            }
            o->proxy.socks5_clients.push_back({*ip, item.substr(eq + 1)});
            if (comma == std::string::npos) break;
            start = comma + 1;
          }
          return std::nullopt;
        },
        "SOCKS5 clients as SOURCE_IP=WORKLOAD_UID[,...]: a client from SOURCE_IP acts as that "
        "local workload; every other source is refused (default: none)"}},
      {"outbound", {endpoint(&proxy::ProxyConfig::outbound), "transparent outbound listener, e.g. 0.0.0.0:15001"}},
      {"inbound-plaintext", {endpoint(&proxy::ProxyConfig::inbound_plaintext), "transparent inbound plaintext listener, e.g. 0.0.0.0:15006"}},
      {"hbone-listen", {endpoint(&proxy::ProxyConfig::hbone_listen), "one HBONE listener here instead of <workload ip>:15008 each"}},
      {"hbone-port", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                        long long n = 0;
                        if (auto e = parse_int(v, 1, 65535, &n)) return e;
                        o->proxy.hbone_port = static_cast<uint16_t>(n);
                        return std::nullopt;
                      }, "HBONE port (default 15008)"}},
      {"preserve-source-ip", {[](const std::string& v, Options* o) {
                                return parse_bool(v, &o->proxy.preserve_source_ip);
                              }, "apps see the client's IP (default true)"}},
      {"splice-passthrough", {[](const std::string& v, Options* o) {
                                return parse_bool(v, &o->proxy.splice_passthrough);
                              }, "relay plain TCP (passthrough, inbound plaintext) with splice(2), copying only where the sockmap bypass needs it (default true)"}},
      {"same-node-fast-path", {[](const std::string& v, Options* o) {
                                 return parse_bool(v, &o->proxy.same_node_fast_path);
                               }, "a connection between two workloads this proxy serves is authorized here and relayed straight to the server pod, without HBONE to itself (default true)"}},
      {"kept-source-ports", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                               auto dash = v.find('-');
                               long long low = 0, high = 0;
                               if (dash == std::string::npos) return "expected LOW-HIGH, got '" + v + "'";
                               if (auto e = parse_int(v.substr(0, dash), 1, 65535, &low)) return e;
                               if (auto e = parse_int(v.substr(dash + 1), low, 65535, &high)) return e;
                               o->proxy.kept_source_ports = {static_cast<uint16_t>(low), static_cast<uint16_t>(high)};
                               return std::nullopt;
                             }, "source ports of dials that keep the client's IP, LOW-HIGH (default 1024-32767: off clients' ephemeral ranges)"}},
      {"dns-proxy", {[](const std::string& v, Options* o) {
                       if (v == "on" || v == "off") {
                         o->proxy.dns_proxy = v == "on";
                         return std::optional<std::string>();
                       }
                       return parse_bool(v, &o->proxy.dns_proxy);
                     }, "on or off: answer the mesh's names (services and their short forms, workload hostnames) and forward the rest; in-pod mode on 15053 in each pod, else on --dns-listen (default off)"}},
      {"dns-upstream", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                          std::string error;
                          auto u = dns::parse_upstreams(v, &error);
                          if (!u) return error;
                          o->proxy.dns_upstreams = std::move(*u);
                          return std::nullopt;
                        }, "IP[:PORT],... resolvers the DNS proxy forwards to (default: the nameservers of /etc/resolv.conf)"}},
      {"dns-listen", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                        std::optional<Endpoint> e;
                        if (auto err = parse_endpoint(v, &e)) return err;
                        if (!e) return std::string("an address is required");
                        o->proxy.dns_listen = *e;
                        return std::nullopt;
                      }, "where the DNS proxy listens (UDP and TCP) outside in-pod mode (default 127.0.0.1:15053)"}},
      {"dns-upstream-timeout", {[](const std::string& v, Options* o) {
                                  return parse_duration(v, &o->proxy.dns_upstream_timeout);
                                }, "how long an upstream resolver may take before the client gets SERVFAIL (default 5s, as ztunnel)"}},
      {"zds-socket", {text(&proxy::ProxyConfig::zds_socket), "in-pod mode: connect to the node agent's ZDS socket here and take pods from it (Istio's: /var/run/ztunnel/ztunnel.sock; default off)"}},
      {"bpf-pin-root", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                          o->proxy.bpf_pin_root = v == "off" || v == "none" ? "" : v;
                          return std::nullopt;
                        }, "sockmesh's pinned maps: identities of enrolled pods, in-pod listeners (default " SM_PIN_ROOT_DEFAULT "; 'off')"}},
      {"drain-timeout-ms", {millis(&proxy::ProxyConfig::drain_timeout), "how long SIGTERM waits for connections (default 5000)"}},
      {"pool-idle-timeout-ms", {millis(&proxy::ProxyConfig::pool_idle_timeout), "idle pooled HBONE connections close after this (default 30000)"}},
      {"pool-max-streams-per-connection",
       {[](const std::string& v, Options* o) -> std::optional<std::string> {
          long long n = 0;  // 0 would leave the pool no connection it may use
          if (auto e = parse_int(v, 1, 65535, &n)) return e;
          o->proxy.max_streams_per_connection = static_cast<uint32_t>(n);
          return std::nullopt;
        },
        "CONNECT streams one pooled HBONE connection carries at once; one more opens another "
        "connection (default 100, as ztunnel; the peer's SETTINGS_MAX_CONCURRENT_STREAMS may "
        "lower it)"}},
      {"hbone-idle-timeout-ms", {millis(&proxy::ProxyConfig::hbone_idle_timeout), "an inbound HBONE connection with no stream closes after this (default 300000, as ztunnel's pool; 0 = never)"}},
      {"hbone-max-connections", {count(&proxy::ProxyConfig::hbone_max_connections), "inbound HBONE connections held at once; more are closed at accept (default 16384; 0 = no cap)"}},
      {"hbone-max-connections-per-source", {count(&proxy::ProxyConfig::hbone_max_connections_per_source), "inbound HBONE connections from one source IP (default 2048; 0 = no cap)"}},
      {"connect-timeout-ms", {millis(&proxy::ProxyConfig::connect_timeout), "TCP connect deadline (default 5000)"}},
      {"handshake-timeout-ms", {millis(&proxy::ProxyConfig::handshake_timeout), "TLS and SOCKS5 handshake deadline (default 10000)"}},
      {"certificate-check-ms",
       {[](const std::string& v, Options* o) -> std::optional<std::string> {
          long long n = 0;  // 0 would spin the renewal thread
          if (auto e = parse_int(v, 100, 86400000, &n)) return e;
          o->proxy.certificate_check = std::chrono::milliseconds(n);
          return std::nullopt;
        },
        "how often certificates are renewed and mounted files (root-cert.pem included) re-read "
        "(default 10000)"}},
      {"config-poll-ms", {millis(&proxy::ProxyConfig::config_poll), "how often the config file is checked (default 1000)"}},
      {"xds-address", {xds_text(&XdsSettings::address), "istiod's Delta xDS address, e.g. https://istiod.istio-system.svc:15012; when set, workloads, services and policies come from it instead of --config (default: unset)"}},
      {"xds-root-ca", {xds_text(&XdsSettings::root_ca), "PEM roots istiod's certificate must chain to (default ./var/run/secrets/istio/root-cert.pem)"}},
      {"xds-max-message-bytes",
       {[](const std::string& v, Options* o) -> std::optional<std::string> {
          return parse_int(v, 65536, 1ll << 30, &o->xds.max_message_bytes);
        },
        "the largest Delta xDS response accepted; a bigger one ends the stream with "
        "RESOURCE_EXHAUSTED (default 33554432)"}},
      {"pod-name", {xds_text(&XdsSettings::pod_name), "this proxy's pod name, for istiod's node id (default: unset)"}},
      {"pod-namespace", {xds_text(&XdsSettings::pod_namespace), "this proxy's namespace, for istiod's node id (default: unset)"}},
      {"instance-ip", {xds_text(&XdsSettings::instance_ip), "this proxy's pod IP, for istiod's node id (default: unset)"}},
      {"log-level", {[](const std::string& v, Options* o) -> std::optional<std::string> {
                       o->log_level = v;
                       return std::nullopt;
                     }, "trace, debug, info, warn, error (default info)"}},
  };
  return f;
}

// ztunnel's environment variables for the same settings, so that ztunnel's DaemonSet
// environment configures sockmesh. Read before SOCKMESH_<FLAG>, which is read before flags.
const std::map<std::string, std::string>& ztunnel_env() {
  static const std::map<std::string, std::string> e = {
      {"xds-address", "XDS_ADDRESS"},     {"xds-root-ca", "XDS_ROOT_CA"},
      {"ca-address", "CA_ADDRESS"},       {"ca-root-ca", "CA_ROOT_CA"},
      {"xds-token-file", "AUTH_TOKEN"},   {"cluster-id", "CLUSTER_ID"},
      {"secret-ttl", "SECRET_TTL"},       {"trust-domain", "TRUST_DOMAIN"},
      {"node", "NODE_NAME"},              {"pod-name", "POD_NAME"},
      {"pod-namespace", "POD_NAMESPACE"}, {"instance-ip", "INSTANCE_IP"},
      {"config", "LOCAL_XDS_PATH"},
      {"pool-max-streams-per-connection", "POOL_MAX_STREAMS_PER_CONNECTION"},
      {"workers", "ZTUNNEL_WORKER_THREADS"},
      // ztunnel reads DNS_CAPTURE from its proxy metadata, i.e. ISTIO_META_DNS_CAPTURE.
      {"dns-proxy", "ISTIO_META_DNS_CAPTURE"},
  };
  return e;
}

}  // namespace

const char* ca_provider_name(CaProvider p) {
  switch (p) {
    case CaProvider::kAuto:
      return "auto";
    case CaProvider::kIstio:
      return "istio";
    case CaProvider::kKubernetes:
      return "kubernetes";
    case CaProvider::kFiles:
      return "files";
    case CaProvider::kBuiltin:
      return "builtin";
  }
  return "auto";
}

std::optional<std::string> parse_options(const std::vector<std::string>& args, Options* out) {
  // Environment first (ztunnel's names, then SOCKMESH_<FLAG>), flags override.
  for (const auto& [name, env] : ztunnel_env()) {
    auto it = flags().find(name);
    if (it == flags().end()) continue;
    if (const char* v = std::getenv(env.c_str())) {
      if (auto err = it->second.first(v, out)) return env + ": " + *err;
    }
  }
  for (const auto& [name, entry] : flags()) {
    std::string env = "SOCKMESH_";
    for (char c : name) env.push_back(c == '-' ? '_' : static_cast<char>(std::toupper(c)));
    if (const char* v = std::getenv(env.c_str())) {
      if (auto err = entry.first(v, out)) return env + ": " + *err;
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      out->help = true;
      continue;
    }
    if (a == "--print-default-config") {
      out->print_default_config = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) return "unexpected argument '" + a + "'";
    std::string name = a.substr(2);
    std::string value;
    auto eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else {
      if (i + 1 >= args.size()) return "--" + name + " needs a value";
      value = args[++i];
    }
    auto it = flags().find(name);
    if (it == flags().end()) return "unknown flag --" + name + " (see --help)";
    if (auto err = it->second.first(value, out)) return "--" + name + ": " + *err;
  }
  // As ztunnel: Istio's CA is at istiod's address unless told otherwise.
  if (!out->ca_address_given && !out->xds.address.empty()) {
    out->proxy.ca_address = out->xds.address;
  }
  return std::nullopt;
}

std::string usage() {
  std::string u =
      "sockmesh-proxy: the node's HBONE proxy (mTLS HTTP/2 CONNECT on 15008).\n\n"
      "usage: sockmesh-proxy [--flag value]...\n\n";
  for (const auto& [name, entry] : flags()) {
    u += "  --" + name + std::string(name.size() < 22 ? 22 - name.size() : 1, ' ') + entry.second +
         "\n";
  }
  u += "  --print-default-config  print the embedded default config (YAML) and exit\n";
  u += "\nEvery flag can also be set as SOCKMESH_<FLAG> (e.g. SOCKMESH_NODE=node-b).\n";
  u += "ztunnel's variables are read too (SOCKMESH_<FLAG> and the flag win):\n";
  for (const auto& [name, env] : ztunnel_env()) {
    u += "  " + env + std::string(env.size() < 22 ? 24 - env.size() : 1, ' ') + "--" + name + "\n";
  }
  return u;
}

}  // namespace sockmesh::app
