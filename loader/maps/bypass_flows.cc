#include "loader/maps/bypass_flows.h"

#include <linux/bpf.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/log.h"
#include "loader/maps/workload_map.h"

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71  // asm-generic/socket.h, kernel 5.14+
#endif

namespace sockmesh::maps {
namespace {

// The bypass maps' value is the socket cookie (what a userspace lookup returns).
constexpr MapShape kBypassShape{BPF_MAP_TYPE_SOCKHASH, sizeof(sm_flow_key), sizeof(uint64_t)};
constexpr MapShape kStackFlowsShape{BPF_MAP_TYPE_LRU_HASH, sizeof(sm_flow_key), sizeof(uint32_t)};
constexpr uint32_t kPinnedValue = 1;

Result<Endpoint> endpoint_of(int fd, bool local) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  auto* sa = reinterpret_cast<sockaddr*>(&ss);
  int rc = local ? getsockname(fd, sa, &len) : getpeername(fd, sa, &len);
  if (rc != 0) return Error::from_errno(errno, local ? "getsockname" : "getpeername");
  auto e = Endpoint::from_sockaddr(sa);
  if (!e) return Error{EAFNOSUPPORT, "not an IPv4 or IPv6 socket"};
  return *e;
}

// Whether the loader that installed this pin root knew sm_bypass_proxy.
bool proxy_map_pinned(const std::string& pin_root) {
  std::string path = pin_root + "/" + SM_MAP_BYPASS_PROXY;
  return access(path.c_str(), F_OK) == 0;
}

}  // namespace

sm_flow_key FlowKey::to_kernel() const {
  sm_flow_key raw{};  // `reserved` and any padding zero: the kernel hashes every byte
  raw.netns = netns;
  raw.local = maps::to_kernel(local.ip);
  raw.remote = maps::to_kernel(remote.ip);
  raw.local_port = local.port;
  raw.remote_port = remote.port;
  return raw;
}

std::string FlowKey::to_string() const {
  return "netns " + std::to_string(netns) + " " + local.to_string() + " -> " + remote.to_string();
}

Result<FlowKey> flow_of_socket(int fd) {
  FlowKey key;
  socklen_t len = sizeof(key.netns);
  if (getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, &key.netns, &len) != 0) {
    return Error::from_errno(errno, "reading SO_NETNS_COOKIE of a socket");
  }
  auto local = endpoint_of(fd, true);
  if (!local) return local.error();
  auto remote = endpoint_of(fd, false);
  if (!remote) return remote.error();
  key.local = *local;
  key.remote = *remote;
  return key;
}

Result<FlowKey> app_flow_of_proxy_socket(int fd) {
  auto own = flow_of_socket(fd);
  if (!own) return own.error();
  return own->reversed();
}

Result<BypassFlows> BypassFlows::open(const std::string& pin_root) {
  auto bypass = PinnedMap::open(pin_root, SM_MAP_BYPASS, Access::kReadWrite, kBypassShape);
  if (!bypass) return bypass.error();
  std::optional<PinnedMap> proxy;
  if (proxy_map_pinned(pin_root)) {
    auto opened = PinnedMap::open(pin_root, SM_MAP_BYPASS_PROXY, Access::kReadOnly, kBypassShape);
    if (!opened) return opened.error();
    proxy = std::move(opened).value();
  }
  auto stack = PinnedMap::open(pin_root, SM_MAP_STACK_FLOWS, Access::kReadWrite, kStackFlowsShape);
  if (!stack) return stack.error();
  return BypassFlows(pin_root, std::move(bypass).value(), std::move(proxy),
                     std::move(stack).value());
}

bool BypassFlows::still_pinned() const {
  if (!bypass_.still_pinned() || !stack_flows_.still_pinned()) return false;
  return proxy_ ? proxy_->still_pinned() : !proxy_map_arrived();
}

bool BypassFlows::proxy_map_arrived() const { return !proxy_ && proxy_map_pinned(pin_root_); }

BypassMap BypassFlows::map_of(const FlowKey& socket) const {
  sm_flow_key key = socket.to_kernel();
  uint64_t cookie = 0;
  const std::pair<const PinnedMap*, BypassMap> maps[] = {
      {proxy_ ? &*proxy_ : nullptr, BypassMap::kProxy}, {&bypass_, BypassMap::kApps}};
  for (auto [map, which] : maps) {
    if (map == nullptr) continue;
    int err = map->lookup(&key, &cookie);
    if (err == 0) return which;
    if (err == -ENOENT) continue;
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      SM_WARN("maps") << "bypass map lookup failed, treating the socket as not in that map: map="
                      << map->path() << " flow=" << socket.to_string()
                      << " error=" << std::strerror(-err);
    }
  }
  return BypassMap::kNone;
}

Status BypassFlows::pin_to_stack(const FlowKey& app) const {
  sm_flow_key key = app.to_kernel();
  int err = stack_flows_.update(&key, &kPinnedValue, BPF_ANY);
  if (err != 0) return Error::from_errno(-err, "pinning " + app.to_string() + " in " + path());
  return {};
}

Status BypassFlows::release_app_socket(const FlowKey& app) const {
  sm_flow_key key = app.to_kernel();
  int err = bypass_.remove(&key);
  if (err != 0 && err != -ENOENT) {
    return Error::from_errno(-err, "removing " + app.to_string() + " from " + bypass_.path());
  }
  return {};
}

bool BypassFlows::pinned(const FlowKey& app) const {
  sm_flow_key key = app.to_kernel();
  uint32_t value = 0;
  return stack_flows_.lookup(&key, &value) == 0;
}

}  // namespace sockmesh::maps
