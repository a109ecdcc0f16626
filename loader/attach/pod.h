#pragma once
// Enrolling a pod: inside its network namespace, the policy routing and accept_local that the
// bounce needs and the tc capture programs on its device; then its IPs in the workload map, which
// is what switches capture on. Unenrolling undoes exactly what enrolling changed.
#include <cstdint>
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "loader/maps/result.h"
#include "loader/maps/workload_map.h"

namespace sockmesh::loader {

using maps::Error;
using maps::Result;
using maps::Status;

struct PodSpec {
  std::string netns_path;  // /run/netns/<name> or /proc/<pid>/ns/net
  std::string ifname = "eth0";
  std::vector<IpAddress> ips;
  maps::WorkloadRecord identity;  // uid, namespace, service account, trust domain, capture flags
};

struct EnrollReport {
  int ifindex = 0;
  uint64_t netns_cookie = 0;
  std::vector<std::string> changes;  // empty when the pod was enrolled already
};

Result<EnrollReport> enroll(const std::string& pin_root, const PodSpec& pod);

struct UnenrollReport {
  std::vector<IpAddress> removed_ips;
  std::vector<std::string> changes;
  bool netns_gone = false;  // only map entries could be removed
};

// Removes the records of `ips` and of every IP enrolled from the same netns, detaches tc and
// restores routing and accept_local. If the netns is gone, removes the records of `ips` only.
Result<UnenrollReport> unenroll(const std::string& pin_root, const std::string& netns_path,
                                const std::string& ifname, const std::vector<IpAddress>& ips);

}  // namespace sockmesh::loader
