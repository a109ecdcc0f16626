#pragma once
// Start-up checks that turn "Operation not permitted" into "needs CAP_BPF", and a verifier
// failure on an old kernel into "the kernel lacks bpf_sk_assign (5.7)".
#include <string>
#include <vector>

#include "loader/maps/result.h"

namespace sockmesh::loader {

using maps::Error;
using maps::Result;
using maps::Status;

enum class Capability { kNetAdmin = 12, kSysAdmin = 21, kBpf = 39 };

// Fails naming every missing capability of the calling thread's effective set. CAP_BPF is also
// satisfied by CAP_SYS_ADMIN (kernels before 5.8 know only the latter).
Status require_capabilities(const std::vector<Capability>& needed, const std::string& for_what);

// Probes program types, map types and helpers the datapath uses; fails naming the missing ones.
Status probe_kernel_features();
// What the kernel lacks for the sockmap bypass only (sockops, sk_msg and their helpers); empty
// when it has all. Not fatal: capture works without the bypass.
std::string probe_bypass_features();

// `dir` is a directory of a cgroup v2 hierarchy (checked before anything is pinned).
Status require_cgroup2_dir(const std::string& dir);

}  // namespace sockmesh::loader
