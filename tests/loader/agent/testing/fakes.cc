#include "testing/fakes.h"

#include <cerrno>

namespace sockmesh::agent::testing {

maps::Status FakeHandoff::add(const PodWorkload& pod) {
  log_->push("add " + pod.uid);
  std::lock_guard lock(mu_);
  if (fail_adds_) return maps::Error{ECONNREFUSED, "the proxy is not there (fake)"};
  pods_[pod.uid] = pod;
  return {};
}

maps::Status FakeHandoff::remove(const std::string& uid) {
  log_->push("remove " + uid);
  std::lock_guard lock(mu_);
  pods_.erase(uid);
  return {};
}

maps::Status FakeHandoff::sync(const std::vector<PodWorkload>& all) {
  std::string uids;
  std::lock_guard lock(mu_);
  pods_.clear();
  for (const auto& p : all) {
    uids += (uids.empty() ? "" : ",") + p.uid;
    pods_[p.uid] = p;
  }
  log_->push("sync " + uids);
  return {};
}

std::map<std::string, PodWorkload> FakeHandoff::pods() const {
  std::lock_guard lock(mu_);
  return pods_;
}

maps::Status FakeEnroller::enroll(const PodRecord& pod, const std::string& trust_domain) {
  log_->push("enroll " + pod.uid);
  std::lock_guard lock(mu_);
  if (failing_.count(pod.uid) != 0) return maps::Error{ENODEV, "no such device (fake)"};
  auto netns = netns_.find(pod.netns_path);
  if (netns == netns_.end()) return maps::Error{ENOENT, "netns " + pod.netns_path + " is gone"};
  for (const auto& ip : pod.ips) {
    maps::WorkloadRecord r;
    r.uid = pod.uid;
    r.namespace_name = pod.namespace_name;
    r.service_account = pod.service_account;
    r.trust_domain = trust_domain;
    r.capture_dns = pod.capture_dns;
    r.netns_cookie = netns->second;
    r.ifindex = 2;
    map_[ip] = r;
  }
  return {};
}

maps::Status FakeEnroller::unenroll(const PodRecord& pod) {
  log_->push("unenroll " + pod.uid);
  std::lock_guard lock(mu_);
  for (const auto& ip : pod.ips) map_.erase(ip);
  // Like the loader: every IP enrolled from the same netns goes too.
  auto netns = netns_.find(pod.netns_path);
  if (netns != netns_.end()) {
    for (auto it = map_.begin(); it != map_.end();) {
      it = it->second.netns_cookie == netns->second ? map_.erase(it) : std::next(it);
    }
  }
  return {};
}

maps::Result<std::vector<EnrolledIp>> FakeEnroller::list() {
  std::lock_guard lock(mu_);
  std::vector<EnrolledIp> out;
  for (const auto& [ip, r] : map_) out.push_back(EnrolledIp{ip, r});
  return out;
}

bool FakeEnroller::netns_exists(const std::string& path) {
  std::lock_guard lock(mu_);
  return netns_.count(path) != 0 || path == host_netns;
}

FoundNetns FakeEnroller::find_netns(uint64_t cookie, uint32_t) {
  std::lock_guard lock(mu_);
  for (const auto& [path, c] : netns_) {
    if (c == cookie) return FoundNetns{path, "eth0"};
  }
  return {};
}

void FakeEnroller::add_netns(const std::string& path, uint64_t cookie) {
  std::lock_guard lock(mu_);
  netns_[path] = cookie;
}

void FakeEnroller::remove_netns(const std::string& path) {
  std::lock_guard lock(mu_);
  netns_.erase(path);
}

void FakeEnroller::fail_enroll_of(const std::string& uid) {
  std::lock_guard lock(mu_);
  failing_.insert(uid);
}

std::map<IpAddress, maps::WorkloadRecord> FakeEnroller::workload_map() const {
  std::lock_guard lock(mu_);
  return map_;
}

void FakeEnroller::put_record(const IpAddress& ip, const maps::WorkloadRecord& record) {
  std::lock_guard lock(mu_);
  map_[ip] = record;
}

}  // namespace sockmesh::agent::testing
