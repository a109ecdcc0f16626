#pragma once
// Network namespaces of enrolled pods, held open by descriptor (handed over by the node agent),
// and creating sockets inside them: a socket belongs to the netns its creating thread was in at
// socket() time and stays there, so a thread enters the pod's netns, creates the socket and
// returns. setns(CLONE_NEWNET) affects only the calling thread.
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "base/ip_address.h"

namespace sockmesh::net {

class Netns {
 public:
  // Takes ownership of `fd` (closed on failure too). Fails when it is not a network namespace.
  static std::shared_ptr<const Netns> adopt(int fd, std::string* error);
  ~Netns();
  Netns(const Netns&) = delete;
  Netns& operator=(const Netns&) = delete;

  int fd() const { return fd_; }
  // Two descriptors name the same namespace when device and inode agree.
  bool same_as(const Netns& other) const { return dev_ == other.dev_ && ino_ == other.ino_; }
  // "netns:[4026532841]", as /proc/<pid>/ns/net reads.
  std::string to_string() const;

 private:
  Netns(int fd, dev_t dev, ino_t ino) : fd_(fd), dev_(dev), ino_(ino) {}
  int fd_;
  dev_t dev_;
  ino_t ino_;
};

// Runs `f` with the calling thread inside `ns` (nullptr: where it is), then moves the thread back.
// Returns an error when the thread cannot enter (missing CAP_SYS_ADMIN); `f` then did not run.
// Failing to move back would leave the thread in a pod's netns: the process aborts instead.
std::optional<std::string> run_in(const Netns* ns, const std::function<void()>& f);

// Which netns each enrolled pod IP lives in, so that sockets towards or on behalf of a pod are
// created there. Thread-safe; one short lock per lookup.
class NetnsByIp {
 public:
  void set(const IpAddress& ip, std::shared_ptr<const Netns> ns);
  // Removes the entry of `ip` if it still refers to `ns` (a newer pod may own the IP by now).
  void erase(const IpAddress& ip, const Netns* ns);
  std::shared_ptr<const Netns> find(const IpAddress& ip) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<IpAddress, std::shared_ptr<const Netns>> by_ip_;
};

}  // namespace sockmesh::net
