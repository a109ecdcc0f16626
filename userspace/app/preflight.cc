#include "app/preflight.h"

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace sockmesh::app {
namespace {

#ifndef CAP_BPF
constexpr int CAP_BPF = 39;
#endif

bool has(uint64_t caps, int cap) { return (caps >> cap) & 1U; }

}  // namespace

uint64_t effective_capabilities() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return 0;
  return static_cast<uint64_t>(data[0].effective) |
         (static_cast<uint64_t>(data[1].effective) << 32);
}

std::vector<PreflightFinding> check_capabilities(const proxy::ProxyConfig& config, uint64_t caps) {
  std::vector<PreflightFinding> out;
  const bool net_admin = has(caps, CAP_NET_ADMIN);
  const bool sys_admin = has(caps, CAP_SYS_ADMIN);
  if (!config.zds_socket.empty()) {
    std::string missing;
    if (!sys_admin) missing += "CAP_SYS_ADMIN (to enter pod network namespaces)";
    if (!net_admin) {
      missing += std::string(missing.empty() ? "" : " and ") +
                 "CAP_NET_ADMIN (transparent listeners, socket marks)";
    }
    if (!missing.empty()) {
      out.push_back({true, "in-pod mode (--zds-socket) needs " + missing +
                               "; run the proxy privileged, as its DaemonSet does"});
    }
  }
  if ((config.outbound || config.inbound_plaintext) && !net_admin) {
    out.push_back({true,
                   "transparent listeners (--outbound, --inbound-plaintext) need CAP_NET_ADMIN "
                   "(IP_TRANSPARENT)"});
  }
  if (config.preserve_source_ip && !net_admin && out.empty()) {
    out.push_back({false,
                   "without CAP_NET_ADMIN the source IP is not preserved: apps will see the "
                   "proxy's address (set --preserve-source-ip false to silence this)"});
  }
  if (config.bpf_pin_root != "off" && !config.bpf_pin_root.empty() &&
      access(config.bpf_pin_root.c_str(), F_OK) == 0 && !has(caps, CAP_BPF) && !sys_admin) {
    out.push_back({false, "without CAP_BPF the pinned workload map under " +
                              config.bpf_pin_root +
                              " cannot be read: identities come from the config file only"});
  }
  return out;
}

}  // namespace sockmesh::app
