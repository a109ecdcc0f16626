#pragma once
// Local workloads as the node's BPF workload map knows them: the loader writes a record (uid,
// namespace, service account, trust domain) for every IP of each pod it enrolls, so a pod enrolled
// here is local to this proxy whatever the config file says, and its record picks the certificate
// (the destination IP of an accepted HBONE connection, the client IP of a captured one).
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "loader/maps/workload_map.h"
#include "state/snapshot.h"

namespace sockmesh::proxy {

class EnrolledWorkloads {
 public:
  // `pin_root`: where the loader pinned its maps. The map is opened on first use and, while it is
  // missing (sockmesh not installed yet), tried again at most every `retry`.
  EnrolledWorkloads(std::string pin_root, std::string node_name,
                    std::chrono::milliseconds retry = std::chrono::seconds(5));

  // Whether the map is open (tries to open it if the last try is older than `retry`).
  bool available();

  // The workload enrolled with `ip`, or nullptr when the map is absent or has no enrolled record
  // for it. One map lookup (a syscall) per call, so that a re-enrolled pod is seen at once. When
  // the snapshot has a workload with that IP and the same identity, that one is returned (it knows
  // the services, labels and protocol); otherwise one built from the record, cached per IP.
  // The pointer stays valid for at least a minute after the record changes.
  const state::Workload* find(const state::Snapshot& snapshot, const IpAddress& ip);

 private:
  struct Cached {
    maps::WorkloadRecord record;
    std::shared_ptr<const state::Workload> workload;
  };
  using Clock = std::chrono::steady_clock;

  bool open_locked();
  void retire_locked(std::shared_ptr<const state::Workload> w);

  const std::string pin_root_;
  const std::string node_name_;
  const std::chrono::milliseconds retry_;
  std::mutex mu_;
  std::optional<maps::WorkloadMapReader> reader_;
  Clock::time_point next_try_{};
  Clock::time_point next_pin_check_{};  // is the open map still the pinned one?
  bool logged_missing_ = false;
  std::map<IpAddress, Cached> by_ip_;
  // Workloads replaced in the cache, kept alive a while for callers still holding the pointer.
  std::deque<std::pair<Clock::time_point, std::shared_ptr<const state::Workload>>> retired_;
};

}  // namespace sockmesh::proxy
