#pragma once
// The workload map: who owns each pod IP (uid, namespace, service account, trust domain) and how
// it is enrolled. The loader writes it; the proxy reads it to choose a certificate (the
// destination IP of an accepted HBONE connection, the client IP of a captured outbound one).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/ip_address.h"
#include "loader/maps/pinned_map.h"
#include "loader/maps/result.h"
#include "sockmesh/consts.h"
#include "sockmesh/maps.h"

namespace sockmesh::maps {

// One workload record, as C++ sees it (struct sm_workload in the kernel).
struct WorkloadRecord {
  std::string uid;
  std::string namespace_name;
  std::string service_account;
  std::string trust_domain = "cluster.local";
  bool enrolled = true;
  bool capture_inbound = true;
  bool capture_dns = true;    // SM_WL_CAPTURE_DNS: its DNS queries go to the proxy's 15053
  uint32_t ifindex = 0;       // the pod's device, inside its netns
  uint64_t netns_cookie = 0;  // SO_NETNS_COOKIE of the pod's netns
  uint32_t loader_flags = 0;  // SM_WL_SET_ACCEPT_LOCAL, SM_WL_MADE_CLSACT: the loader's notes

  // spiffe://<trust domain>/ns/<namespace>/sa/<service account>
  std::string spiffe_id() const;

  // The kernel's layout. Fails when a string does not fit its field or holds a NUL.
  Result<sm_workload> to_kernel() const;
  static WorkloadRecord from_kernel(const sm_workload& raw);

  bool operator==(const WorkloadRecord&) const = default;
};

// Key of the workload and listener maps: the 16 bytes of IpAddress (IPv4-mapped for IPv4).
sm_ip to_kernel(const IpAddress& ip);
IpAddress from_kernel(const sm_ip& ip);

// Read-only view, for the proxy. Opening fails when the map is not pinned (sockmesh not
// installed); the proxy then falls back to its configuration file.
class WorkloadMapReader {
 public:
  static Result<WorkloadMapReader> open(const std::string& pin_root = SM_PIN_ROOT_DEFAULT);

  // The record of `ip`, or nullopt when the IP is not in the map. Never fails otherwise: an
  // unexpected kernel error is logged once and read as "absent".
  std::optional<WorkloadRecord> lookup(const IpAddress& ip) const;
  // Every record. Entries that vanish while listing are skipped.
  Result<std::vector<std::pair<IpAddress, WorkloadRecord>>> list() const;

  const PinnedMap& map() const { return map_; }

 protected:
  explicit WorkloadMapReader(PinnedMap map) : map_(std::move(map)) {}
  PinnedMap map_;
};

// Read-write access, for the loader.
class WorkloadMap : public WorkloadMapReader {
 public:
  static Result<WorkloadMap> open(const std::string& pin_root = SM_PIN_ROOT_DEFAULT);

  // Adds or replaces the record of `ip`.
  Status enroll(const IpAddress& ip, const WorkloadRecord& record);
  // Removes the record of `ip`; true if there was one.
  Result<bool> remove(const IpAddress& ip);

 private:
  explicit WorkloadMap(PinnedMap map) : WorkloadMapReader(std::move(map)) {}
};

}  // namespace sockmesh::maps
