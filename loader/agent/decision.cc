#include "loader/agent/decision.h"

#include <algorithm>

namespace sockmesh::agent {
namespace {

const std::string* mode_of(const Labels* labels) {
  if (labels == nullptr) return nullptr;
  auto it = labels->find(kDataplaneModeLabel);
  return it == labels->end() ? nullptr : &it->second;
}

}  // namespace

bool dns_capture_wanted(const Labels& labels, const Labels& annotations) {
  for (const Labels* m : {&labels, &annotations}) {
    auto it = m->find(kDnsCaptureKey);
    if (it != m->end() && it->second == "false") return false;
  }
  return true;
}

bool is_ambient(const Labels& labels) {
  const std::string* mode = mode_of(&labels);
  return mode != nullptr && *mode == kDataplaneModeAmbient;
}

Decision decide(const PodFacts& pod, const std::vector<std::string>& excluded_namespaces) {
  if (pod.host_network) return {false, "host-network pods are never enrolled"};
  if (std::find(excluded_namespaces.begin(), excluded_namespaces.end(), pod.namespace_name) !=
      excluded_namespaces.end()) {
    return {false, "namespace " + pod.namespace_name + " is excluded"};
  }
  if (const std::string* mode = mode_of(pod.pod_labels)) {
    if (*mode == kDataplaneModeNone) {
      return {false, std::string("the pod is labelled ") + kDataplaneModeLabel + "=none"};
    }
    if (*mode == kDataplaneModeAmbient) {
      return {true, std::string("the pod is labelled ") + kDataplaneModeLabel + "=ambient"};
    }
  }
  if (const std::string* mode = mode_of(pod.namespace_labels);
      mode != nullptr && *mode == kDataplaneModeAmbient) {
    return {true,
            "namespace " + pod.namespace_name + " is labelled " + kDataplaneModeLabel + "=ambient"};
  }
  if (pod.namespace_labels == nullptr) {
    return {false, "namespace " + pod.namespace_name + " is not known"};
  }
  return {false, "neither namespace " + pod.namespace_name + " nor the pod is labelled " +
                     kDataplaneModeLabel + "=ambient"};
}

}  // namespace sockmesh::agent
