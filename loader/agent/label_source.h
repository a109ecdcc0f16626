#pragma once
// Where the agent learns namespace and pod labels: the Kubernetes API in a cluster
// (kube/kubernetes_labels.h), the local config file on a single machine (local_config_labels.h).
// A source publishes immutable views; the agent re-decides every pod it knows on each new view.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "loader/agent/decision.h"

namespace sockmesh::agent {

// What the agent needs to know of a pod besides what the CNI event says.
struct PodMeta {
  std::string uid;
  std::string name;
  std::string namespace_name;
  std::string service_account = "default";
  Labels labels;
  Labels annotations;  // Kubernetes only (the config file has labels only)
  bool host_network = false;
  std::vector<IpAddress> ips;  // status.podIPs (Kubernetes), workloadIps (local config)
  bool running = true;         // false once the pod has terminated (phase Succeeded/Failed)

  bool operator==(const PodMeta&) const = default;
};

struct LabelView {
  std::map<std::string, Labels> namespaces;  // by name
  std::map<std::string, PodMeta> pods;       // by "namespace/name"

  bool operator==(const LabelView&) const = default;

  static std::string key(const std::string& namespace_name, const std::string& name) {
    return namespace_name + "/" + name;
  }
  const PodMeta* pod(const std::string& namespace_name, const std::string& name) const {
    auto it = pods.find(key(namespace_name, name));
    return it == pods.end() ? nullptr : &it->second;
  }
  const Labels* namespace_labels(const std::string& name) const {
    auto it = namespaces.find(name);
    return it == namespaces.end() ? nullptr : &it->second;
  }
};

using LabelViewPtr = std::shared_ptr<const LabelView>;

class LabelSource {
 public:
  using Listener = std::function<void(LabelViewPtr)>;
  virtual ~LabelSource() = default;

  // "kubernetes" or "local-config": for logs and the plugin's hints.
  virtual std::string name() const = 0;
  // Starts delivering views to `listener`, on the source's own thread; the first call comes once
  // the source has a complete view (the initial list, the file read once). Called once.
  virtual void start(Listener listener) = 0;
  virtual void stop() = 0;
  // A pod that is not in the latest view, asked for directly (a pod's CNI ADD often comes before
  // the watch reports the pod). nullopt when the source cannot say more.
  virtual std::optional<PodMeta> fetch_pod(const std::string& namespace_name,
                                           const std::string& name) {
    (void)namespace_name;
    (void)name;
    return std::nullopt;
  }
  // Whether pods known to the source but never seen through CNI (started before the agent)
  // should be looked for on this node: true for the API, whose pods are this node's.
  virtual bool lists_node_pods() const { return false; }
};

}  // namespace sockmesh::agent
