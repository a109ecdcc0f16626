#pragma once
// What sockmesh-cni reads: the runtime's environment (CNI_*), the network configuration on stdin
// with the previous plugin's result, and the Kubernetes pod named in CNI_ARGS.
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cni/plugin/cni_error.h"

namespace sockmesh::cni {

// The CNI spec versions this plugin speaks: those of the reference plugins (0.1.0 to 1.0.0).
inline const std::vector<std::string> kSupportedVersions = {"0.1.0", "0.2.0", "0.3.0",
                                                            "0.3.1", "0.4.0", "1.0.0"};
bool version_supported(std::string_view version);
// a < b for dotted CNI versions ("0.3.1" < "0.4.0").
bool version_less(std::string_view a, std::string_view b);

// The CNI_* variables a runtime sets.
struct CniEnv {
  std::string command;                         // CNI_COMMAND
  std::string container_id;                    // CNI_CONTAINERID
  std::string netns;                           // CNI_NETNS
  std::string ifname;                          // CNI_IFNAME
  std::string args;                            // CNI_ARGS
  std::string path;                            // CNI_PATH
  std::map<std::string, std::string> present;  // which were set at all (name -> value)

  static CniEnv from_process();
  static CniEnv from_map(const std::map<std::string, std::string>& vars);
};

// K8S_POD_* from CNI_ARGS ("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=n;...").
struct PodArgs {
  std::string namespace_name;
  std::string name;
  std::string uid;
  bool is_kubernetes_pod() const { return !namespace_name.empty() && !name.empty(); }
};
PodArgs parse_cni_args(std::string_view args);

// The plugin's entry in the .conflist (names follow istio-cni's snake_case).
struct NetConf {
  std::string cni_version;
  std::string name;
  std::string type;
  std::string agent_socket;                     // "agent_socket"
  std::string namespace_hints;                  // "namespace_hints"
  std::vector<std::string> exclude_namespaces;  // "exclude_namespaces"
  int agent_timeout_ms = 10000;                 // "agent_timeout_ms"
  std::string kubeconfig;                       // "kubeconfig" (written by sockmesh-install-cni)
  // prevResult exactly as received (key order kept), printed back on success.
  std::optional<nlohmann::ordered_json> prev_result;

  bool excludes(const std::string& pod_namespace) const;
};

// Parses stdin. Fails with kDecodingFailure (not JSON, wrong types), kIncompatibleVersion (a
// cniVersion this plugin does not speak) or kInvalidNetworkConfig.
struct NetConfResult {
  std::optional<NetConf> conf;
  std::optional<CniError> error;
};
NetConfResult parse_netconf(std::string_view stdin_text);

// The pod's own addresses in a result: `ips` entries whose `interface` is the pod side (has a
// `sandbox`, or is CNI_IFNAME), or every entry when none says; `ip4`/`ip6` for results of
// 0.1.0/0.2.0. Prefix lengths are dropped. Fails with kDecodingFailure on a malformed address.
struct PodIpsResult {
  std::vector<std::string> ips;
  std::optional<CniError> error;
};
PodIpsResult pod_ips(const nlohmann::ordered_json& result, const std::string& ifname);

}  // namespace sockmesh::cni
