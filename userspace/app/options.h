#pragma once
// Command-line flags of sockmesh-proxy. Every flag also reads an environment variable
// (SOCKMESH_<FLAG> in upper case with '_' for '-'), flags winning, so that a DaemonSet can set
// them either way. Some flags also read ztunnel's variable for the same setting (XDS_ADDRESS,
// NODE_NAME, ...), so ztunnel's DaemonSet environment works unchanged; SOCKMESH_<FLAG> wins over
// ztunnel's name, and the flag over both.
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "proxy/proxy_config.h"

namespace sockmesh::app {

// The control plane (istiod over Delta xDS). An empty address means no xDS: the local config
// file, or the embedded default, is the one source of mesh state.
struct XdsSettings {
  std::string address;
  std::string root_ca = "./var/run/secrets/istio/root-cert.pem";
  std::string token_file = "./var/run/secrets/tokens/istio-token";
  std::string cluster_id = "Kubernetes";
  std::string pod_name;
  std::string pod_namespace;
  std::string instance_ip;
  // The largest Delta response accepted; gRPC's own default is 4 MiB, which a big mesh's first
  // push (every workload and service) passes.
  long long max_message_bytes = 32ll << 20;
};

// Where workload certificates come from (--ca-provider). kAuto: Istio's CA when a CA address is
// set, else mounted certificates (--certs-dir) when set, else the built-in CA. The others pick
// one issuer by name; the settings it needs must be there.
enum class CaProvider { kAuto, kIstio, kKubernetes, kFiles, kBuiltin };
const char* ca_provider_name(CaProvider p);

// The Kubernetes CSR API issuer (--ca-provider kubernetes). An empty api_server means in-cluster:
// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
struct KubeCsrSettings {
  std::string api_server;
  std::string api_ca = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::string token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string signer_name;
  std::chrono::milliseconds approval_timeout{60000};
};

struct Options {
  proxy::ProxyConfig proxy;
  XdsSettings xds;
  CaProvider ca_provider = CaProvider::kAuto;
  KubeCsrSettings kube;
  // --ca-address (or CA_ADDRESS) was given, perhaps as '': then it is not taken from the xDS
  // address. '' keeps --certs-dir or the built-in CA while xDS is on.
  bool ca_address_given = false;
  std::string log_level = "info";
  bool help = false;
  bool print_default_config = false;
};

// Parses argv (without argv[0]). Returns an error message naming the flag on bad input.
std::optional<std::string> parse_options(const std::vector<std::string>& args, Options* out);
std::string usage();

}  // namespace sockmesh::app
