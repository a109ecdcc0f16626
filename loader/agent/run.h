#pragma once
// `sockmesh-loader run`: the node agent as a daemon. Installs the datapath (idempotent), restores
// and reconciles what it enrolled before, starts its label source, serves the CNI plugin's events
// and sweeps pods whose netns vanished, until SIGTERM or SIGINT.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "loader/agent/handoff.h"
#include "loader/attach/node.h"

namespace sockmesh::agent {

struct RunOptions {
  loader::InstallOptions install;  // pin root, cgroup, bypass, fail-open
  bool skip_install = false;       // the datapath is installed by someone else
  std::string run_dir = "/var/run/sockmesh";
  std::string socket_path;           // default <run_dir>/cni.sock
  std::string labels_from = "auto";  // kubernetes | config | auto (kubernetes when configured)
  std::string config_path;           // config: the local config file; empty: embedded default
  std::string kubeconfig;            // kubernetes: a kubeconfig; empty: in-cluster
  std::string node_name;             // kubernetes: this node (default $NODE_NAME, hostname)
  std::vector<std::string> excluded_namespaces = {"kube-system"};
  std::string trust_domain = "cluster.local";
  bool exempt_probes = true;  // the kubelet's probes from the node reach pods uncaptured
  std::string probe_cgroup = "system.slice/kubelet.service";  // the kubelet's cgroup (v2)
  // "<namespace>/<daemonset>": at SIGTERM, ask the API whether this DaemonSet is still there; if
  // it is gone or being deleted (an uninstall, not an upgrade), unenroll every pod and remove the
  // datapath. Empty: the datapath always stays (a restarted agent adopts it).
  std::string uninstall_when_removed;
  std::chrono::milliseconds sweep_interval{10000};
  std::chrono::milliseconds config_poll{1000};
};

// Returns the exit status: 0 after a signal, 1 when start-up failed.
int run_agent(const RunOptions& options, std::unique_ptr<WorkloadHandoff> handoff);

}  // namespace sockmesh::agent
