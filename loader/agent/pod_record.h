#pragma once
// The pods the agent has seen on this node and what it did to each, kept in a file so that a
// restarted agent knows which netns each enrolled pod lives in (the workload map only has a netns
// cookie) and which pods to re-decide when labels change.
#include <map>
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "loader/agent/handoff.h"
#include "loader/maps/result.h"

namespace sockmesh::agent {

enum class PodOrigin {
  kCni,         // seen through a CNI ADD
  kDiscovered,  // listed by the API, its netns found by scanning /proc (started before the agent)
  kAdopted,     // found enrolled in the workload map at start-up, with no record of our own
};

struct PodRecord {
  std::string uid;  // K8S_POD_UID (or "<namespace>/<name>" when the runtime does not pass it)
  std::string name;
  std::string namespace_name;
  std::string service_account = "default";
  std::string container_id;
  std::string netns_path;
  std::string ifname = "eth0";
  std::vector<IpAddress> ips;
  // Its DNS queries are captured (SM_WL_CAPTURE_DNS): off for a pod labelled or annotated
  // ambient.istio.io/dns-capture=false.
  bool capture_dns = true;
  bool enrolled = false;  // capture on and handed to the proxy
  // The pod is to be enrolled but its metadata (service account, labels) is not known yet:
  // never enrolled under a guessed identity; enrolled once the label source has it.
  bool metadata_pending = false;
  PodOrigin origin = PodOrigin::kCni;

  PodWorkload workload() const;
  std::string who() const { return namespace_name + "/" + name; }
  bool operator==(const PodRecord&) const = default;
};

using PodRecords = std::map<std::string, PodRecord>;  // by uid

// JSON ({"version": 1, "pods": [...]}). A missing file is an empty set; a corrupt one an error.
maps::Result<PodRecords> load_pod_records(const std::string& path);
maps::Status save_pod_records(const std::string& path, const PodRecords& pods);

}  // namespace sockmesh::agent
