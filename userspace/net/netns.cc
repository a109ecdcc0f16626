#include "net/netns.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/errno_text.h"
#include "base/log.h"

namespace sockmesh::net {
namespace {

// The netns this thread runs in when it is not inside a pod: opened on the thread's first use.
int home_netns() {
  thread_local int fd = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  return fd;
}

}  // namespace

std::shared_ptr<const Netns> Netns::adopt(int fd, std::string* error) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    *error = errno_text("fstat of the netns descriptor");
    ::close(fd);
    return nullptr;
  }
  int type = ioctl(fd, NS_GET_NSTYPE);
  if (type >= 0 && type != CLONE_NEWNET) {
    *error = "the descriptor is a namespace, but not a network namespace";
    ::close(fd);
    return nullptr;
  }
  if (type < 0) {
    // Kernels before 4.11 lack NS_GET_NSTYPE: at least insist on a namespace file.
    struct statfs fs {};
    if (fstatfs(fd, &fs) != 0 || (fs.f_type != NSFS_MAGIC && fs.f_type != PROC_SUPER_MAGIC)) {
      *error = "the descriptor is not a namespace";
      ::close(fd);
      return nullptr;
    }
  }
  return std::shared_ptr<const Netns>(new Netns(fd, st.st_dev, st.st_ino));
}

Netns::~Netns() { ::close(fd_); }

std::string Netns::to_string() const { return "netns:[" + std::to_string(ino_) + "]"; }

std::optional<std::string> run_in(const Netns* ns, const std::function<void()>& f) {
  if (ns == nullptr) {
    f();
    return std::nullopt;
  }
  int home = home_netns();
  if (home < 0) return errno_text("opening /proc/thread-self/ns/net");
  if (setns(ns->fd(), CLONE_NEWNET) != 0) {
    return errno_text("entering " + ns->to_string() + " (setns needs CAP_SYS_ADMIN)");
  }
  f();
  if (setns(home, CLONE_NEWNET) != 0) {
    SM_ERROR("net") << errno_text("returning from " + ns->to_string() + " to the proxy's netns")
                    << ": aborting rather than serving from a pod's namespace";
    std::abort();
  }
  return std::nullopt;
}

void NetnsByIp::set(const IpAddress& ip, std::shared_ptr<const Netns> ns) {
  std::lock_guard lock(mu_);
  by_ip_[ip] = std::move(ns);
}

void NetnsByIp::erase(const IpAddress& ip, const Netns* ns) {
  std::lock_guard lock(mu_);
  auto it = by_ip_.find(ip);
  if (it != by_ip_.end() && it->second.get() == ns) by_ip_.erase(it);
}

std::shared_ptr<const Netns> NetnsByIp::find(const IpAddress& ip) const {
  std::lock_guard lock(mu_);
  auto it = by_ip_.find(ip);
  return it == by_ip_.end() ? nullptr : it->second;
}

size_t NetnsByIp::size() const {
  std::lock_guard lock(mu_);
  return by_ip_.size();
}

}  // namespace sockmesh::net
