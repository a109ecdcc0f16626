#include "loader/agent/pod_discovery.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

namespace sockmesh::agent {

namespace {

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  while (!path.empty()) {
    auto slash = path.find('/');
    auto part = path.substr(0, slash);
    if (!part.empty()) parts.push_back(part);
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return parts;
}

bool is_qos(std::string_view s) { return s == "besteffort" || s == "burstable"; }

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// cgroupfs driver: .../kubepods/pod<uid> or .../kubepods/<qos>/pod<uid>.
bool cgroupfs_names_pod(const std::vector<std::string_view>& parts, size_t i,
                        std::string_view uid) {
  if (parts[i] != "pod" + std::string(uid)) return false;
  if (i >= 1 && parts[i - 1] == "kubepods") return true;
  return i >= 2 && is_qos(parts[i - 1]) && parts[i - 2] == "kubepods";
}

// systemd driver: a slice's name spells its ancestry ("a-b.slice" lives in "a.slice"), so the pod
// is <parent>-pod<uid>.slice right inside <parent>.slice, where the parent is kubepods or its QoS
// slice, under any prefix the kubelet's cgroup root adds (kind: kubelet-kubepods...).
bool systemd_names_pod(const std::vector<std::string_view>& parts, size_t i, std::string_view uid) {
  if (i == 0) return false;
  std::string_view parent = parts[i - 1];
  if (!ends_with(parent, ".slice")) return false;
  std::string_view stem = parent.substr(0, parent.size() - 6);
  if (parts[i] != std::string(stem) + "-pod" + std::string(uid) + ".slice") return false;
  if (stem == "kubepods" || ends_with(stem, "-kubepods")) return true;
  for (std::string_view qos : {"-besteffort", "-burstable"}) {
    if (!ends_with(stem, qos)) continue;
    std::string_view pods = stem.substr(0, stem.size() - qos.size());
    if ((pods == "kubepods" || ends_with(pods, "-kubepods")) && i >= 2 &&
        parts[i - 2] == std::string(pods) + ".slice") {
      return true;
    }
  }
  return false;
}

}  // namespace

bool cgroup_names_pod(const std::string& cgroup_text, const std::string& uid) {
  if (uid.empty()) return false;
  // Only the characters a Kubernetes UID has: nothing in it can be a separator below.
  if (uid.find_first_not_of("0123456789abcdefABCDEF-") != std::string::npos) return false;
  std::string underscored = uid;
  std::replace(underscored.begin(), underscored.end(), '-', '_');
  std::string_view text = cgroup_text;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    // "<hierarchy>:<controllers>:<path>"; the path may itself hold ':'.
    auto c1 = line.find(':');
    auto c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    auto parts = split_path(line.substr(c2 + 1));
    for (size_t i = 0; i < parts.size(); ++i) {
      if (cgroupfs_names_pod(parts, i, uid) || systemd_names_pod(parts, i, underscored)) {
        return true;
      }
    }
  }
  return false;
}

ProcPodNetnsFinder::ProcPodNetnsFinder(std::string proc_root, const std::string& host_netns)
    : proc_root_(std::move(proc_root)) {
  struct stat st {};
  if (stat(host_netns.c_str(), &st) == 0) {
    host_dev_ = st.st_dev;
    host_ino_ = st.st_ino;
  }
}

std::string ProcPodNetnsFinder::find(const std::string& uid) {
  DIR* d = opendir(proc_root_.c_str());
  if (d == nullptr) return "";
  std::string found;
  while (dirent* e = readdir(d)) {
    std::string pid = e->d_name;
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cgroup(proc_root_ + "/" + pid + "/cgroup");
    if (!cgroup) continue;
    std::stringstream text;
    text << cgroup.rdbuf();
    if (!cgroup_names_pod(text.str(), uid)) continue;
    std::string netns = proc_root_ + "/" + pid + "/ns/net";
    struct stat st {};
    if (stat(netns.c_str(), &st) != 0) continue;
    if (st.st_dev == host_dev_ && st.st_ino == host_ino_) continue;
    found = netns;
    break;
  }
  closedir(d);
  return found;
}

}  // namespace sockmesh::agent
