#pragma once
// Labels from the Kubernetes API: namespaces (all) and the pods of this node (fieldSelector
// spec.nodeName), each kept by a Reflector on its own thread. The first view is published once
// both have listed; later ones on every change.
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "loader/agent/kube/api_client.h"
#include "loader/agent/kube/reflector.h"
#include "loader/agent/label_source.h"

namespace sockmesh::agent::kube {

// A Pod object's facts: metadata (uid, name, namespace, labels), spec (serviceAccountName,
// hostNetwork), status (podIPs, phase).
std::optional<PodMeta> pod_meta_of(const nlohmann::json& pod);

class KubernetesLabels final : public LabelSource {
 public:
  KubernetesLabels(const ClusterAccess& access, std::string node_name,
                   ReflectorOptions options = {});
  ~KubernetesLabels() override;

  std::string name() const override { return "kubernetes"; }
  void start(Listener listener) override;
  void stop() override;
  std::optional<PodMeta> fetch_pod(const std::string& namespace_name,
                                   const std::string& name) override;
  bool lists_node_pods() const override { return true; }

  const Reflector& namespaces() const { return *namespaces_; }
  const Reflector& pods() const { return *pods_; }

 private:
  void publish_locked();

  ApiClient client_;
  ApiClient fetch_client_;  // separate, so that stop() of the watches does not end fetches early
  const std::string node_name_;
  std::unique_ptr<Reflector> namespaces_;
  std::unique_ptr<Reflector> pods_;
  std::thread namespaces_thread_, pods_thread_;

  std::mutex mu_;
  Listener listener_;
  std::shared_ptr<LabelView> view_ = std::make_shared<LabelView>();
  bool namespaces_listed_ = false, pods_listed_ = false;
};

}  // namespace sockmesh::agent::kube
