#pragma once
// Entering a pod's network namespace for the duration of a scope (tc, routes, sysctls there).
#include <cstdint>
#include <string>

#include "loader/maps/result.h"
#include "loader/maps/unique_fd.h"

namespace sockmesh::loader {

using maps::Error;
using maps::Result;
using maps::Status;
using maps::UniqueFd;

// Opens a netns file (/run/netns/<name>, /proc/<pid>/ns/net) and checks that it is one.
Result<UniqueFd> open_netns(const std::string& path);

// While alive, the calling thread is in another network namespace; the destructor moves it back.
// setns(CLONE_NEWNET) is per thread, so other threads of the process are unaffected.
class NetnsScope {
 public:
  static Result<NetnsScope> enter(const std::string& path);
  static Result<NetnsScope> enter(int netns_fd, const std::string& name);
  ~NetnsScope();
  NetnsScope(NetnsScope&& other) noexcept = default;
  NetnsScope& operator=(NetnsScope&&) = delete;
  NetnsScope(const NetnsScope&) = delete;

 private:
  explicit NetnsScope(UniqueFd original) : original_(std::move(original)) {}
  UniqueFd original_;
};

// The cookie of the calling thread's network namespace (SO_NETNS_COOKIE, kernel 5.14+), the same
// value BPF programs get from bpf_get_netns_cookie().
Result<uint64_t> current_netns_cookie();

}  // namespace sockmesh::loader
