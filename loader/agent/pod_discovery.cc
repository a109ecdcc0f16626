#include "loader/agent/pod_discovery.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace sockmesh::agent {

bool cgroup_names_pod(const std::string& cgroup_text, const std::string& uid) {
  if (uid.empty()) return false;
  std::string underscored = uid;
  std::replace(underscored.begin(), underscored.end(), '-', '_');
  for (const std::string& spelling : {uid, underscored}) {
    const std::string needle = "pod" + spelling;
    for (size_t at = cgroup_text.find(needle); at != std::string::npos;
         at = cgroup_text.find(needle, at + 1)) {
      // The UID must end there: "/" (cgroupfs) or ".slice" (systemd), not run on into more hex.
      size_t end = at + needle.size();
      if (end == cgroup_text.size() || cgroup_text[end] == '/' || cgroup_text[end] == '.' ||
          cgroup_text[end] == '\n') {
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
