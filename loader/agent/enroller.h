#pragma once
// The agent's hands on the node: enrolling and unenrolling a pod with the loader (tc in its
// netns, routing, workload records), reading the workload map, and questions about network
// namespaces. An interface, so that the agent's decisions can be tested without root.
#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "loader/agent/pod_record.h"
#include "loader/maps/result.h"
#include "loader/maps/workload_map.h"

namespace sockmesh::agent {

struct EnrolledIp {
  IpAddress ip;
  maps::WorkloadRecord record;
};

struct FoundNetns {
  std::string path;    // empty: not found
  std::string ifname;  // the device with the record's ifindex, inside that netns
};

class Enroller {
 public:
  virtual ~Enroller() = default;
  // Capture on: tc in the pod's netns, routing, then its records. Idempotent.
  virtual maps::Status enroll(const PodRecord& pod, const std::string& trust_domain) = 0;
  // Capture off: records first, then tc and routing as they were. When the netns is gone, only
  // the records of pod.ips. Idempotent.
  virtual maps::Status unenroll(const PodRecord& pod) = 0;
  // The workload map's records.
  virtual maps::Result<std::vector<EnrolledIp>> list() = 0;
  // Whether `path` is a network namespace that still exists.
  virtual bool netns_exists(const std::string& path) = 0;
  // Whether `path` is the node's own network namespace (a host-network pod).
  virtual bool is_host_netns(const std::string& path) = 0;
  // The netns whose cookie is `cookie` (and the name of device `ifindex` in it), among the
  // runtime's netns directories and the processes' namespaces.
  virtual FoundNetns find_netns(uint64_t cookie, uint32_t ifindex) = 0;
};

struct LoaderEnrollerOptions {
  std::string pin_root;
  // The node's own netns. The agent runs with the node's network (hostNetwork), so by default its
  // own netns, read once at construction (later its threads visit pods' namespaces).
  std::string host_netns = "/proc/self/ns/net";
  // Where runtimes bind-mount pod namespaces (containerd, CRI-O: /var/run/netns/cni-...).
  std::vector<std::string> netns_dirs = {"/run/netns", "/var/run/netns"};
  // The kubelet's probes reach pods uncaptured: capture exempts the probe SNAT addresses
  // (SM_MAP_NODE_ADDRS), and connections from `probe_cgroup` (cgroup v2, relative to its mount)
  // to enrolled pods are SNATed to them in the node's netns (loader/attach/probe_snat.h). Off:
  // nothing is exempt, probes are captured like any other connection.
  bool exempt_probes = true;
  std::string probe_cgroup = "system.slice/kubelet.service";
  std::string cgroup_root;  // the host's cgroup v2 hierarchy (--cgroup); empty: found in mounts
  std::string proc_root = "/proc";
};

// The real thing: loader::enroll/unenroll on the pinned maps under `pin_root`.
class LoaderEnroller : public Enroller {
 public:
  explicit LoaderEnroller(LoaderEnrollerOptions options);

  maps::Status enroll(const PodRecord& pod, const std::string& trust_domain) override;
  maps::Status unenroll(const PodRecord& pod) override;
  maps::Result<std::vector<EnrolledIp>> list() override;
  bool netns_exists(const std::string& path) override;
  bool is_host_netns(const std::string& path) override;
  FoundNetns find_netns(uint64_t cookie, uint32_t ifindex) override;

  // When exempt_probes: the probe addresses in SM_MAP_NODE_ADDRS, and the SNAT rules for the
  // enrolled pods written again when the pods or the probe cgroup (a restarted kubelet) changed.
  // Called after each enroll and unenroll (kPodChange), and periodically (kSweep). Logs what
  // changed, and a failure once until it changes. After a failed write of the rules, only the
  // sweep or a probe cgroup that became visible tries again: a pod change alone would run the
  // same failing iptables-restore once per pod.
  enum class Trigger { kPodChange, kSweep };
  void refresh_probe_exemption(Trigger trigger = Trigger::kSweep);

 private:
  LoaderEnrollerOptions options_;
  std::mutex probe_mutex_;  // the agent's threads: CNI events, the sweep
  bool probe_map_written_ = false;
  uint64_t probe_cgroup_id_ = 0;             // of the rules last written; 0: none
  std::optional<uint64_t> probe_failed_id_;  // the cgroup id seen when writing them last failed
  bool probe_cgroup_unseen_logged_ = false;
  std::set<IpAddress> probe_pods_;
  std::string probe_error_;  // the last failure logged
  dev_t host_dev_ = 0;
  ino_t host_ino_ = 0;
};

}  // namespace sockmesh::agent
