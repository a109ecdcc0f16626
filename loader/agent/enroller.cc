#include "loader/agent/enroller.h"

#include <dirent.h>
#include <net/if.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "base/log.h"
#include "loader/attach/netns.h"
#include "loader/attach/pod.h"
#include "loader/attach/probe_snat.h"
#include "loader/maps/node_addrs.h"

namespace sockmesh::agent {
namespace {

std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  closedir(d);
  return out;
}

}  // namespace

LoaderEnroller::LoaderEnroller(LoaderEnrollerOptions options) : options_(std::move(options)) {
  struct stat st {};
  if (stat(options_.host_netns.c_str(), &st) == 0) {
    host_dev_ = st.st_dev;
    host_ino_ = st.st_ino;
  } else {
    SM_WARN("agent") << "cannot read the node's netns " << options_.host_netns << ": "
                     << std::strerror(errno) << "; host-network pods cannot be told apart";
  }
}

maps::Status LoaderEnroller::enroll(const PodRecord& pod, const std::string& trust_domain) {
  loader::PodSpec spec;
  spec.netns_path = pod.netns_path;
  spec.ifname = pod.ifname;
  spec.ips = pod.ips;
  spec.identity.uid = pod.uid;
  spec.identity.namespace_name = pod.namespace_name;
  spec.identity.service_account = pod.service_account;
  spec.identity.trust_domain = trust_domain;
  spec.identity.capture_dns = pod.capture_dns;
  auto report = loader::enroll(options_.pin_root, spec);
  if (!report) {
    // enroll writes the records last: a failure before them leaves capture off. Undo the routing
    // and tc it may have set up, so that nothing is left half-done.
    auto undone = loader::unenroll(options_.pin_root, pod.netns_path, pod.ifname, pod.ips);
    if (!undone) {
      SM_WARN("agent") << "undoing a failed enroll of " << pod.who() << ": "
                       << undone.error().message;
    }
    return report.error();
  }
  refresh_probe_exemption(Trigger::kPodChange);
  return {};
}

void LoaderEnroller::refresh_probe_exemption(Trigger trigger) {
  if (!options_.exempt_probes) return;
  // Only from the node's own netns (this thread may have visited a pod's).
  struct stat st {};
  if (stat("/proc/thread-self/ns/net", &st) != 0 || st.st_dev != host_dev_ ||
      st.st_ino != host_ino_) {
    return;
  }
  std::lock_guard<std::mutex> lock(probe_mutex_);
  auto fail = [&](const std::string& why) {
    if (why == probe_error_) return;
    probe_error_ = why;
    SM_WARN("agent") << "kubelet probes are not exempt from capture (the policy applies to them): "
                     << why;
  };
  if (!probe_map_written_) {
    auto map = maps::NodeAddrMap::open(options_.pin_root);
    if (!map) return fail(map.error().message);
    auto changed = map->replace({loader::probe_snat_v4(), loader::probe_snat_v6()});
    if (!changed) return fail("updating " SM_MAP_NODE_ADDRS ": " + changed.error().message);
    probe_map_written_ = true;
  }
  // The kernel resolves the rule's cgroup path by itself; the id seen through a mount only
  // tells a kubelet cgroup made anew (a restart). A container may show no mount holding it.
  auto seen = loader::cgroup_id(options_.probe_cgroup, options_.cgroup_root);
  const uint64_t id = seen ? *seen : 1;  // 1: not visible here
  if (!seen && !probe_cgroup_unseen_logged_) {
    probe_cgroup_unseen_logged_ = true;
    SM_WARN("agent") << "kubelet probes: " << seen.error().message
                     << "; the SNAT rules name the cgroup anyway (the kernel resolves it), but a "
                        "kubelet cgroup made anew is not noticed until the agent restarts";
  }
  if (trigger == Trigger::kPodChange && probe_failed_id_ == id) return;  // the sweep retries
  auto enrolled = list();
  if (!enrolled) return fail("listing the enrolled pods: " + enrolled.error().message);
  std::set<IpAddress> pods;
  for (const auto& e : *enrolled) {
    if (e.record.enrolled) pods.insert(e.ip);
  }
  if (id == probe_cgroup_id_ && pods == probe_pods_) return;
  if (auto applied = loader::apply_probe_snat(options_.probe_cgroup, pods); !applied) {
    probe_cgroup_id_ = 0;  // written again next time
    probe_failed_id_ = id;
    return fail("SNAT rules in the node's netns: " + applied.error().message);
  }
  bool cgroup_changed = probe_cgroup_id_ != 0 && id != probe_cgroup_id_;
  probe_cgroup_id_ = id;
  probe_failed_id_.reset();
  probe_pods_ = std::move(pods);
  probe_error_.clear();
  SM_INFO("agent") << "kubelet probes: connections from cgroup " << options_.probe_cgroup
                   << (cgroup_changed ? " (made anew)" : "") << " to the " << probe_pods_.size()
                   << " enrolled pod address(es) are SNATed to "
                   << loader::probe_snat_v4().to_string() << " / "
                   << loader::probe_snat_v6().to_string()
                   << ", which capture exempts; connections from any other process on the node "
                      "are captured";
}

maps::Status LoaderEnroller::unenroll(const PodRecord& pod) {
  std::string netns = pod.netns_path.empty() ? "/nonexistent" : pod.netns_path;
  auto report = loader::unenroll(options_.pin_root, netns, pod.ifname, pod.ips);
  if (report) {
    refresh_probe_exemption(Trigger::kPodChange);
    return {};
  }
  // The netns exists but is not what enroll saw (its device is gone, say): at least switch
  // capture off by removing the records, which is what the tc programs look at.
  SM_WARN("agent") << "unenroll " << pod.who() << " in " << pod.netns_path << ": "
                   << report.error().message << "; removing its workload records only";
  auto workloads = maps::WorkloadMap::open(options_.pin_root);
  if (!workloads) return workloads.error();
  for (const auto& ip : pod.ips) {
    if (auto removed = workloads->remove(ip); !removed) return removed.error();
  }
  refresh_probe_exemption(Trigger::kPodChange);
  return {};
}

maps::Result<std::vector<EnrolledIp>> LoaderEnroller::list() {
  auto workloads = maps::WorkloadMapReader::open(options_.pin_root);
  if (!workloads) return workloads.error();
  auto all = workloads->list();
  if (!all) return all.error();
  std::vector<EnrolledIp> out;
  for (auto& [ip, record] : *all) out.push_back(EnrolledIp{ip, std::move(record)});
  return out;
}

bool LoaderEnroller::netns_exists(const std::string& path) {
  return !path.empty() && static_cast<bool>(loader::open_netns(path));
}

bool LoaderEnroller::is_host_netns(const std::string& path) {
  struct stat st {};
  return host_ino_ != 0 && stat(path.c_str(), &st) == 0 && st.st_dev == host_dev_ &&
         st.st_ino == host_ino_;
}

FoundNetns LoaderEnroller::find_netns(uint64_t cookie, uint32_t ifindex) {
  std::vector<std::string> candidates;
  for (const auto& dir : options_.netns_dirs) {
    for (const auto& name : dir_entries(dir)) candidates.push_back(dir + '/' += name);
  }
  for (const auto& pid : dir_entries(options_.proc_root)) {
    if (pid.find_first_not_of("0123456789") == std::string::npos) {
      candidates.push_back(options_.proc_root + "/" + pid + "/ns/net");
    }
  }
  std::set<std::pair<dev_t, ino_t>> seen;
  for (const auto& path : candidates) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || !seen.insert({st.st_dev, st.st_ino}).second) continue;
    auto scope = loader::NetnsScope::enter(path);
    if (!scope) continue;
    auto c = loader::current_netns_cookie();
    if (!c || *c != cookie) continue;
    char name[IF_NAMESIZE] = {};
    FoundNetns found{path, "eth0"};
    if (ifindex != 0 && if_indextoname(ifindex, name) != nullptr) found.ifname = name;
    return found;
  }
  return {};
}

}  // namespace sockmesh::agent
