#include "loader/attach/netns.h"

#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/log.h"

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif

namespace sockmesh::loader {

Result<UniqueFd> open_netns(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    int err = errno;
    if (err == ENOENT) {
      return Error{err, "network namespace " + path + " does not exist (the pod is gone?)"};
    }
    return Error::from_errno(err, "opening network namespace " + path);
  }
  int type = ioctl(fd.get(), NS_GET_NSTYPE);
  if (type >= 0 && type != CLONE_NEWNET) {
    return Error{EINVAL, path + " is a namespace, but not a network namespace"};
  }
  if (type < 0 && errno == ENOTTY) {
    return Error{EINVAL, path +
                             " is not a namespace file (expected /run/netns/<name> or "
                             "/proc/<pid>/ns/net)"};
  }
  return fd;
}

Result<NetnsScope> NetnsScope::enter(const std::string& path) {
  auto fd = open_netns(path);
  if (!fd) return fd.error();
  return enter(fd->get(), path);
}

Result<NetnsScope> NetnsScope::enter(int netns_fd, const std::string& name) {
  UniqueFd original(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!original) return Error::from_errno(errno, "opening this thread's network namespace");
  if (setns(netns_fd, CLONE_NEWNET) != 0) {
    int err = errno;
    if (err == EPERM) {
      return Error{
          err, "entering network namespace " + name + ": permission denied (needs CAP_SYS_ADMIN)"};
    }
    return Error::from_errno(err, "entering network namespace " + name);
  }
  return NetnsScope(std::move(original));
}

NetnsScope::~NetnsScope() {
  if (!original_) return;  // moved from
  if (setns(original_.get(), CLONE_NEWNET) != 0) {
    // Continuing would run the rest of the program in a pod's namespace.
    SM_ERROR("loader") << "cannot return to the original network namespace: "
                       << std::strerror(errno);
    std::abort();
  }
}

Result<uint64_t> current_netns_cookie() {
  UniqueFd sock(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock) sock.reset(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock) return Error::from_errno(errno, "creating a socket to read the netns cookie");
  uint64_t cookie = 0;
  socklen_t len = sizeof(cookie);
  if (getsockopt(sock.get(), SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &len) != 0) {
    int err = errno;
    if (err == ENOPROTOOPT) {
      return Error{err, "the kernel has no SO_NETNS_COOKIE (needs 5.14 or later)"};
    }
    return Error::from_errno(err, "reading SO_NETNS_COOKIE");
  }
  return cookie;
}

}  // namespace sockmesh::loader
