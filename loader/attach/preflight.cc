#include "loader/attach/preflight.h"

#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "loader/attach/skeleton.h"

namespace sockmesh::loader {
namespace {

const char* capability_name(Capability c) {
  switch (c) {
    case Capability::kNetAdmin:
      return "CAP_NET_ADMIN";
    case Capability::kSysAdmin:
      return "CAP_SYS_ADMIN";
    case Capability::kBpf:
      return "CAP_BPF";
  }
  return "?";
}

bool has_capability(const __user_cap_data_struct (&data)[2], int cap) {
  return (data[cap / 32].effective & (1u << (cap % 32))) != 0;
}

}  // namespace

Status require_capabilities(const std::vector<Capability>& needed, const std::string& for_what) {
  __user_cap_header_struct header{};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  header.pid = 0;
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0) {
    return Error::from_errno(errno, "reading this process's capabilities");
  }
  std::string missing;
  for (Capability c : needed) {
    int cap = static_cast<int>(c);
    bool ok =
        has_capability(data, cap) ||
        (c == Capability::kBpf && has_capability(data, static_cast<int>(Capability::kSysAdmin)));
    if (!ok) missing += std::string(missing.empty() ? "" : ", ") + capability_name(c);
  }
  if (!missing.empty()) return Error{EPERM, for_what + " needs " + missing + " (run as root)"};
  return {};
}

Status probe_kernel_features() {
  route_libbpf_logs();
  struct ProgProbe {
    bpf_prog_type type;
    const char* name;
  };
  struct HelperProbe {
    bpf_prog_type type;
    bpf_func_id helper;
    const char* name;
  };
  std::string missing;
  auto note = [&](const std::string& what) { missing += (missing.empty() ? "" : "; ") + what; };
  if (libbpf_probe_bpf_prog_type(BPF_PROG_TYPE_SCHED_CLS, nullptr) != 1) {
    note("tc programs (sched_cls)");
  }
  if (libbpf_probe_bpf_map_type(BPF_MAP_TYPE_SOCKHASH, nullptr) != 1) note("SOCKHASH maps (4.18)");
  if (libbpf_probe_bpf_map_type(BPF_MAP_TYPE_LRU_HASH, nullptr) != 1) note("LRU hash maps");
  for (auto h :
       {HelperProbe{BPF_PROG_TYPE_SCHED_CLS, BPF_FUNC_sk_assign, "bpf_sk_assign (5.7)"},
        HelperProbe{BPF_PROG_TYPE_SCHED_CLS, BPF_FUNC_skc_lookup_tcp, "bpf_skc_lookup_tcp (5.2)"},
        HelperProbe{BPF_PROG_TYPE_SCHED_CLS, BPF_FUNC_redirect, "bpf_redirect"}}) {
    if (libbpf_probe_bpf_helper(h.type, h.helper, nullptr) != 1) note(h.name);
  }
  // Not probeable by helper: a SOCKHASH lookup that returns a socket to tc (5.8).
  utsname u{};
  if (uname(&u) == 0) {
    char* end = nullptr;
    long major = std::strtol(u.release, &end, 10);
    long minor = (end != nullptr && *end == '.') ? std::strtol(end + 1, nullptr, 10) : 0;
    if (major < 5 || (major == 5 && minor < 8)) {
      note(std::string("kernel ") + u.release + " < 5.8 (sockets from SOCKHASH lookups in tc)");
    }
  }
  // CO-RE: the programs' relocations are resolved against the kernel's own BTF at load.
  if (access("/sys/kernel/btf/vmlinux", R_OK) != 0) {
    note("BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF=y)");
  }
  if (!missing.empty()) return Error{ENOTSUP, "the kernel lacks: " + missing};
  return {};
}

std::string probe_bypass_features() {
  route_libbpf_logs();
  std::string missing;
  auto note = [&](const char* what) { missing += (missing.empty() ? "" : "; ") + std::string(what); };
  if (libbpf_probe_bpf_prog_type(BPF_PROG_TYPE_SOCK_OPS, nullptr) != 1) {
    note("sockops programs (4.13)");
  }
  if (libbpf_probe_bpf_prog_type(BPF_PROG_TYPE_SK_MSG, nullptr) != 1) {
    note("sk_msg programs (4.17)");
  } else if (libbpf_probe_bpf_helper(BPF_PROG_TYPE_SK_MSG, BPF_FUNC_msg_redirect_hash, nullptr) !=
             1) {
    note("bpf_msg_redirect_hash (4.18)");
  }
  if (libbpf_probe_bpf_prog_type(BPF_PROG_TYPE_SOCK_OPS, nullptr) == 1 &&
      libbpf_probe_bpf_helper(BPF_PROG_TYPE_SOCK_OPS, BPF_FUNC_sock_hash_update, nullptr) != 1) {
    note("bpf_sock_hash_update (4.18)");
  }
  return missing;
}

Status require_cgroup2_dir(const std::string& dir) {
  struct statfs fs {};
  if (statfs(dir.c_str(), &fs) != 0) return Error::from_errno(errno, "cgroup " + dir);
  if (fs.f_type != CGROUP2_SUPER_MAGIC) {
    return Error{EINVAL, "cgroup " + dir +
                             " is not on cgroup v2 (sockops attaches to a cgroup v2 directory; "
                             "find the cgroup2 mount in /proc/mounts)"};
  }
  return {};
}

}  // namespace sockmesh::loader
