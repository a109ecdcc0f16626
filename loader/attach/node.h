#pragma once
// The node-wide part of sockmesh: programs loaded, maps and programs pinned under one bpffs
// directory, sockops attached to a cgroup v2 and sk_msg to the bypass SOCKHASH. All state lives in
// pins, so a restarted or upgraded loader adopts what it finds and live connections never notice.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loader/maps/result.h"
#include "sockmesh/consts.h"

namespace sockmesh::loader {

using maps::Error;
using maps::Result;
using maps::Status;

struct InstallOptions {
  std::string pin_root = SM_PIN_ROOT_DEFAULT;
  std::string cgroup;      // cgroup v2 directory for sockops; empty: the cgroup2 mount's root
  bool bypass = true;      // sockmap bypass of the app <-> proxy hop
  bool fail_open = false;  // pass SYNs uncaptured when the proxy's listener is missing
  // sockops marks enrolled apps' sockets, connecting or accepted (SM_MARK_APP_ROUTE), routing
  // them with a lo-sized MTU; false: they keep the pod's own routes (and eth0-sized segments)
  bool app_route = true;
  // Fault injection for tests: behave as if the kernel refused the bypass programs.
  bool refuse_bypass_for_test = false;
};

struct InstallReport {
  std::vector<std::string> changes;  // empty when everything was in place already
  // Why the sockmap bypass is not in place (the kernel refused part of it); empty when it is.
  // Capture works without it: app <-> proxy bytes then take the TCP/IP stack.
  std::string bypass_unavailable;
};

// Loads, pins and attaches. Idempotent: what is pinned and identical is kept; a program that
// differs (new build, other knobs) replaces its pin, and the sockops link and sk_msg attachment
// move to it. Pods enrolled earlier keep running the tc programs they were attached with until
// they are enrolled again.
Result<InstallReport> install(const InstallOptions& options);

// Detaches sockops and sk_msg and removes every pin under `pin_root`. Refuses while workloads are
// enrolled (unenroll them first, or their tc programs would keep running on orphaned maps),
// unless `force`.
Status uninstall(const std::string& pin_root, bool force);

struct PinnedProgram {
  std::string name;
  uint32_t id = 0;
  std::string tag;  // hex
};

struct NodeStatus {
  bool installed = false;
  std::vector<PinnedProgram> programs;
  std::optional<uint64_t> sockops_cgroup_id;  // cgroup the sockops link is attached to
  uint32_t sockops_link_id = 0;
  bool sk_msg_attached = false;
  std::vector<std::string> map_names;  // pinned maps present
};

Result<NodeStatus> node_status(const std::string& pin_root);

// The cgroup id (inode number on cgroup v2) of a cgroup directory.
Result<uint64_t> cgroup_id_of(const std::string& cgroup_dir);

// Pinned program paths, for enroll.
std::string program_pin(const std::string& pin_root, const std::string& program);
std::string link_pin(const std::string& pin_root, const std::string& link);

inline constexpr char kProgTcEgress[] = "sm_tc_egress";
inline constexpr char kProgTcIngress[] = "sm_tc_ingress";
inline constexpr char kProgSockops[] = "sm_sockops";
inline constexpr char kProgSkMsg[] = "sm_sk_msg";
inline constexpr char kLinkSockops[] = SM_PIN_LINK_SOCKOPS;

}  // namespace sockmesh::loader
