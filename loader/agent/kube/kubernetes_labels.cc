#include "loader/agent/kube/kubernetes_labels.h"

#include "base/log.h"

namespace sockmesh::agent::kube {
namespace {

using Json = nlohmann::json;

// metadata.labels, or another string map of metadata (`field`: "annotations").
Labels labels_of(const Json& object, const char* field = "labels") {
  Labels out;
  auto meta = object.find("metadata");
  if (meta == object.end()) return out;
  auto labels = meta->find(field);
  if (labels == meta->end() || !labels->is_object()) return out;
  for (const auto& [k, v] : labels->items()) {
    if (v.is_string()) out[k] = v.get<std::string>();
  }
  return out;
}

}  // namespace

std::optional<PodMeta> pod_meta_of(const Json& pod) {
  try {
    PodMeta meta;
    const Json& m = pod.at("metadata");
    meta.uid = m.value("uid", "");
    meta.name = m.at("name").get<std::string>();
    meta.namespace_name = m.at("namespace").get<std::string>();
    meta.labels = labels_of(pod);
    meta.annotations = labels_of(pod, "annotations");
    if (auto spec = pod.find("spec"); spec != pod.end() && spec->is_object()) {
      meta.service_account = spec->value("serviceAccountName", "default");
      if (meta.service_account.empty()) meta.service_account = "default";
      meta.host_network = spec->value("hostNetwork", false);
    }
    if (auto status = pod.find("status"); status != pod.end() && status->is_object()) {
      std::string phase = status->value("phase", "");
      meta.running = phase != "Succeeded" && phase != "Failed";
      if (auto ips = status->find("podIPs"); ips != status->end() && ips->is_array()) {
        for (const auto& entry : *ips) {
          if (auto ip = IpAddress::parse(entry.value("ip", ""))) meta.ips.push_back(*ip);
        }
      } else if (auto ip = IpAddress::parse(status->value("podIP", ""))) {
        meta.ips.push_back(*ip);
      }
    }
    if (m.contains("deletionTimestamp") && !m["deletionTimestamp"].is_null()) {
      meta.running = false;
    }
    return meta;
  } catch (const Json::exception& e) {
    SM_WARN("kube") << "a pod object without the expected fields: " << e.what();
    return std::nullopt;
  }
}

KubernetesLabels::KubernetesLabels(const ClusterAccess& access, std::string node_name,
                                   ReflectorOptions options)
    : client_(access),
      fetch_client_(access, std::chrono::seconds(5)),
      node_name_(std::move(node_name)) {
  namespaces_ = std::make_unique<Reflector>(
      &client_, "/api/v1/namespaces", "",
      [this](const Reflector::Objects& objects) {
        std::lock_guard lock(mu_);
        auto view = std::make_shared<LabelView>(*view_);
        view->namespaces.clear();
        for (const auto& [key, ns] : objects) view->namespaces[key] = labels_of(ns);
        view_ = std::move(view);
        namespaces_listed_ = true;
        publish_locked();
      },
      options);
  pods_ = std::make_unique<Reflector>(
      &client_, "/api/v1/pods", "fieldSelector=" + url_encode("spec.nodeName=" + node_name_),
      [this](const Reflector::Objects& objects) {
        std::lock_guard lock(mu_);
        auto view = std::make_shared<LabelView>(*view_);
        view->pods.clear();
        for (const auto& [key, pod] : objects) {
          if (auto meta = pod_meta_of(pod)) view->pods[key] = std::move(*meta);
        }
        view_ = std::move(view);
        pods_listed_ = true;
        publish_locked();
      },
      options);
}

KubernetesLabels::~KubernetesLabels() { stop(); }

void KubernetesLabels::publish_locked() {
  if (!namespaces_listed_ || !pods_listed_ || !listener_) return;
  listener_(view_);
}

void KubernetesLabels::start(Listener listener) {
  {
    std::lock_guard lock(mu_);
    listener_ = std::move(listener);
  }
  SM_INFO("kube") << "watching namespaces and the pods of node " << node_name_ << " at "
                  << client_.access().server;
  namespaces_thread_ = std::thread([this] { namespaces_->run(); });
  pods_thread_ = std::thread([this] { pods_->run(); });
}

void KubernetesLabels::stop() {
  namespaces_->stop();
  pods_->stop();
  fetch_client_.stop();
  if (namespaces_thread_.joinable()) namespaces_thread_.join();
  if (pods_thread_.joinable()) pods_thread_.join();
  std::lock_guard lock(mu_);
  listener_ = nullptr;
}

std::optional<PodMeta> KubernetesLabels::fetch_pod(const std::string& namespace_name,
                                                   const std::string& name) {
  auto response = fetch_client_.get("/api/v1/namespaces/" + url_encode(namespace_name) + "/pods/" +
                                    url_encode(name));
  if (!response || response->status != 200) {
    SM_WARN("kube") << "get pod " << namespace_name << "/" << name << ": "
                    << (response ? "HTTP " + std::to_string(response->status)
                                 : response.error().message);
    return std::nullopt;
  }
  Json pod = Json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  if (pod.is_discarded()) return std::nullopt;
  return pod_meta_of(pod);
}

}  // namespace sockmesh::agent::kube
