#pragma once
// Fakes for the node agent's tests: a proxy handoff that records its calls, and an enroller whose
// "node" is a set of maps (netns paths that exist, the workload map) so that decisions and their
// ordering can be checked without root.
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "loader/agent/enroller.h"
#include "loader/agent/handoff.h"

namespace sockmesh::agent::testing {

// Every call, in order, as "add <uid>", "remove <uid>", "sync <uid>,<uid>".
class CallLog {
 public:
  void push(const std::string& call) {
    std::lock_guard lock(mu_);
    calls_.push_back(call);
  }
  std::vector<std::string> calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }
  void clear() {
    std::lock_guard lock(mu_);
    calls_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> calls_;
};

class FakeHandoff : public WorkloadHandoff {
 public:
  // `log` is shared with the enroller, so that the order across both is visible.
  explicit FakeHandoff(CallLog* log) : log_(log) {}

  maps::Status add(const PodWorkload& pod) override;
  maps::Status remove(const std::string& uid) override;
  maps::Status sync(const std::vector<PodWorkload>& all) override;

  // The pods the proxy has now.
  std::map<std::string, PodWorkload> pods() const;
  void fail_adds(bool fail) {
    std::lock_guard lock(mu_);
    fail_adds_ = fail;
  }

 private:
  CallLog* const log_;
  mutable std::mutex mu_;
  std::map<std::string, PodWorkload> pods_;
  bool fail_adds_ = false;
};

class FakeEnroller : public Enroller {
 public:
  explicit FakeEnroller(CallLog* log) : log_(log) {}

  maps::Status enroll(const PodRecord& pod, const std::string& trust_domain) override;
  maps::Status unenroll(const PodRecord& pod) override;
  maps::Result<std::vector<EnrolledIp>> list() override;
  bool netns_exists(const std::string& path) override;
  bool is_host_netns(const std::string& path) override { return path == host_netns; }
  FoundNetns find_netns(uint64_t cookie, uint32_t ifindex) override;

  // The node.
  std::string host_netns = "/proc/1/ns/net";
  void add_netns(const std::string& path, uint64_t cookie);
  void remove_netns(const std::string& path);
  void fail_enroll_of(const std::string& uid);  // enroll() fails for this pod
  std::map<IpAddress, maps::WorkloadRecord> workload_map() const;
  void put_record(const IpAddress& ip, const maps::WorkloadRecord& record);

 private:
  CallLog* const log_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> netns_;  // path -> cookie
  std::map<IpAddress, maps::WorkloadRecord> map_;
  std::set<std::string> failing_;
};

}  // namespace sockmesh::agent::testing
