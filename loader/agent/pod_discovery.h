#pragma once
// Finding the network namespace of a running pod that the agent never saw through CNI (it started
// before the agent, or while the agent was down), the way istio-cni does: a process of the pod
// has the pod's UID in its cgroup path, and its /proc/<pid>/ns/net is the pod's netns.
//
//   cgroupfs driver: 0::/kubepods/besteffort/pod<uid>/<container>
//   systemd driver:  0::/kubepods.slice/kubepods-besteffort.slice/
//                        kubepods-besteffort-pod<uid with _ for ->.slice/cri-containerd-<id>.scope
#include <sys/types.h>

#include <string>

namespace sockmesh::agent {

// Whether a /proc/<pid>/cgroup text puts the process in the pod `uid`: the pod's cgroup at its
// place in the kubepods layout (either driver, with or without a QoS level, under any cgroup
// root), not merely "pod<uid>" somewhere in a path that any process could make for itself.
bool cgroup_names_pod(const std::string& cgroup_text, const std::string& uid);

class PodNetnsFinder {
 public:
  virtual ~PodNetnsFinder() = default;
  // "/proc/<pid>/ns/net" of a process of the pod that is not in `host_netns`; empty if none.
  virtual std::string find(const std::string& uid) = 0;
};

class ProcPodNetnsFinder : public PodNetnsFinder {
 public:
  // `host_netns` is read once, here: the agent's own netns by default (it runs with the node's
  // network); processes there belong to host-network pods.
  explicit ProcPodNetnsFinder(std::string proc_root = "/proc",
                              const std::string& host_netns = "/proc/self/ns/net");
  std::string find(const std::string& uid) override;

 private:
  std::string proc_root_;
  dev_t host_dev_ = 0;
  ino_t host_ino_ = 0;
};

}  // namespace sockmesh::agent
