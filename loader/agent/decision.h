#pragma once
// Whether a pod belongs to the mesh, as istio-cni decides it for ambient: a pure function of the
// pod's and its namespace's labels, the agent's excluded namespaces, and host networking.
#include <map>
#include <string>
#include <vector>

namespace sockmesh::agent {

using Labels = std::map<std::string, std::string>;

inline constexpr char kDataplaneModeLabel[] = "istio.io/dataplane-mode";
inline constexpr char kDataplaneModeAmbient[] = "ambient";
inline constexpr char kDataplaneModeNone[] = "none";

struct PodFacts {
  std::string namespace_name;
  const Labels* pod_labels = nullptr;        // nullptr: not known (no metadata for the pod)
  const Labels* namespace_labels = nullptr;  // nullptr: the namespace is not known
  bool host_network = false;
};

struct Decision {
  bool enroll = false;
  std::string reason;  // for logs and the plugin's message: "namespace default is ambient", ...
};

// In order: host-network pods never; excluded namespaces never; a pod labelled
// istio.io/dataplane-mode=none is left out; a pod labelled =ambient is in; otherwise the
// namespace's istio.io/dataplane-mode=ambient decides.
Decision decide(const PodFacts& pod, const std::vector<std::string>& excluded_namespaces);

// Whether labels say istio.io/dataplane-mode=ambient.
bool is_ambient(const Labels& labels);

// ambient.istio.io/dns-capture=false, as a label or an annotation of the pod, turns the capture of
// its DNS queries off (SM_WL_CAPTURE_DNS); any other value, or none, leaves it on.
inline constexpr char kDnsCaptureKey[] = "ambient.istio.io/dns-capture";
bool dns_capture_wanted(const Labels& labels, const Labels& annotations);

}  // namespace sockmesh::agent
