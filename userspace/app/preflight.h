#pragma once
// What the proxy needs from the kernel for the configuration it was given, checked at start-up so
// that a missing capability is named once, clearly, before anything is half set up (instead of
// an error on the first pod or the first connection).
//   in-pod mode (--zds-socket): CAP_SYS_ADMIN (setns into pod namespaces) and CAP_NET_ADMIN
//     (IP_TRANSPARENT listeners, SO_MARK on every socket): required.
//   transparent listeners (--outbound, --inbound-plaintext): CAP_NET_ADMIN: required.
//   source IP preservation: CAP_NET_ADMIN: without it the proxy dials from its own address.
//   the pinned workload map (--bpf-pin-root): CAP_BPF or CAP_SYS_ADMIN: without it, identities
//     come from the config file only.
#include <cstdint>
#include <string>
#include <vector>

#include "proxy/proxy_config.h"

namespace sockmesh::app {

struct PreflightFinding {
  bool fatal = false;
  std::string message;
};

// The effective capability set of this process (bit n = capability n), from capget(2).
uint64_t effective_capabilities();

// Pure: what is missing for `config` given the effective set `caps`.
std::vector<PreflightFinding> check_capabilities(const proxy::ProxyConfig& config, uint64_t caps);

}  // namespace sockmesh::app
