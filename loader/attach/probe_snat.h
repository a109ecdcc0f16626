#pragma once
// Kubelet probes from the node. The kubelet's connections to an enrolled pod (those of the
// processes in one cgroup v2, --probe-cgroup) are SNATed in the node's netns to the probe address,
// 169.254.7.127 or fd16:9254:7127:1337:ffff:ffff:ffff:ffff (istio-cni's two), and capture exempts
// exactly those two (SM_MAP_NODE_ADDRS). Any other process on the node keeps its own address and
// is captured like any client, so the policy applies to it.
//
// The rules are iptables' (table nat, chain SOCKMESH-PROBES, jumped to first from POSTROUTING;
// one rule per enrolled pod address, `-m cgroup --path <cgroup>`), written in one transaction with
// iptables-restore / ip6tables-restore, which must be in PATH. The kernel resolves the cgroup's
// path when the rule is written: a cgroup made anew (the kubelet's unit restarted) needs the
// rules written again, so callers compare cgroup_id() and apply again when it changed.
#include <cstdint>
#include <set>
#include <string>

#include "base/ip_address.h"
#include "loader/maps/result.h"

namespace sockmesh::loader {

inline constexpr const char* kProbeChain = "SOCKMESH-PROBES";
IpAddress probe_snat_v4();  // 169.254.7.127
IpAddress probe_snat_v6();  // fd16:9254:7127:1337:ffff:ffff:ffff:ffff

// The iptables-restore (--noflush) input that makes SOCKMESH-PROBES hold exactly one SNAT rule per
// address of `pods` of the family (v6 or not), and, when `add_jump`, jumps to it from POSTROUTING.
std::string probe_snat_rules(const std::string& cgroup, const std::set<IpAddress>& pods, bool v6,
                             bool add_jump);

// The inode of the cgroup v2 directory <mount>/<cgroup> (its id): the cgroup2 mount that holds
// the directory `inside` (the agent's --cgroup, on the host's hierarchy), else the first cgroup2
// mount of /proc/self/mounts.
maps::Result<uint64_t> cgroup_id(const std::string& cgroup, const std::string& inside = "");

// The kernel resolves `-m cgroup --path` in the cgroup namespace of the process writing the rule.
// An agent in a container has a namespace of its own (its cgroup is its root), where the
// kubelet's cgroup has no path. With the host's PID namespace, /proc/1/ns/cgroup is the host's:
// the calling thread (call it first in main, so every thread and child inherits it) moves there.
// Returns whether it moved; the same namespace already, or no /proc/1 of the host, is no error.
maps::Result<bool> join_host_cgroup_namespace(const std::string& init_ns = "/proc/1/ns/cgroup");

// Writes the rules of both families in the calling thread's netns. A family with no pod address
// gets an empty chain (written only when ip(6)tables works at all).
maps::Status apply_probe_snat(const std::string& cgroup, const std::set<IpAddress>& pods);

}  // namespace sockmesh::loader
