#include "loader/agent/unix_listener.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "loader/agent/files.h"

namespace sockmesh::agent {

using maps::Error;
using maps::UniqueFd;

maps::Result<UnixListener> UnixListener::open(const Options& options) {
  const std::string& path = options.path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return Error{ENAMETOOLONG, options.what + " socket path '" + path + "' is empty or too long"};
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (auto slash = path.rfind('/'); slash != std::string::npos && slash > 0) {
    // The directory may be a fresh host path (Istio's /var/run/ztunnel).
    if (auto s = make_dirs(path.substr(0, slash)); !s) return s.error();
  }
  // Two agents starting at once could both find the file stale, and the second would unlink the
  // first one's fresh socket: the probe, unlink and bind happen under a lock on a sibling file,
  // held for as long as the listener lives.
  const std::string lock_path = path + ".lock";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock) return Error::from_errno(errno, "opening " + lock_path);
  if (flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return Error{EADDRINUSE, "another process serves " + options.what + " on " + path +
                                   " (it holds " + lock_path +
                                   "; a second node agent?); not taking it over"};
    }
    return Error::from_errno(errno, "locking " + lock_path);
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return Error{EEXIST, path + " exists and is not a socket"};
    // Only a refused connection proves the file stale: a full backlog answers EAGAIN, and a
    // socket of another type (EPROTOTYPE) is someone else's too.
    UniqueFd probe(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!probe) return Error::from_errno(errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
    if (connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 ||
        errno == EAGAIN || errno == EPROTOTYPE) {
      return Error{EADDRINUSE, "another process serves " + options.what + " on " + path +
                                   " (a second node agent?); not taking it over"};
    }
    if (errno != ECONNREFUSED) return Error::from_errno(errno, "probing " + path);
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Error::from_errno(errno, "removing the stale socket " + path);
    }
  }
  int type = SOCK_SEQPACKET | SOCK_CLOEXEC | (options.non_blocking ? SOCK_NONBLOCK : 0);
  UniqueFd fd(socket(AF_UNIX, type, 0));
  if (!fd) return Error::from_errno(errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
  // Created 0600 from the start (no window in which anyone could connect), and set again in
  // case the umask was stricter than that.
  mode_t old_mask = umask(0077);
  int rc = bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  int bind_errno = errno;
  umask(old_mask);
  if (rc != 0) return Error::from_errno(bind_errno, "binding the " + options.what + " socket " + path);
  struct stat bound {};
  if (lstat(path.c_str(), &bound) != 0) {
    int e = errno;
    unlink(path.c_str());  // just bound by us, and the lock keeps others away
    return Error::from_errno(e, "stat " + path);
  }
  UnixListener listener;
  listener.path_ = path;
  listener.dev_ = bound.st_dev;
  listener.ino_ = bound.st_ino;
  listener.lock_ = std::move(lock);
  listener.fd_ = std::move(fd);  // from here on, close() removes the file on failure
  if (chmod(path.c_str(), 0600) != 0) return Error::from_errno(errno, "chmod 0600 " + path);
  if (::listen(listener.fd_.get(), options.backlog) != 0) {
    return Error::from_errno(errno, "listen on " + path);
  }
  return listener;
}

UnixListener::UnixListener(UnixListener&& other) noexcept { *this = std::move(other); }

UnixListener& UnixListener::operator=(UnixListener&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::move(other.fd_);
    lock_ = std::move(other.lock_);
    path_ = std::move(other.path_);
    dev_ = std::exchange(other.dev_, 0);
    ino_ = std::exchange(other.ino_, 0);
  }
  return *this;
}

void UnixListener::close() {
  if (!fd_) return;
  fd_.reset();
  struct stat st {};
  if (lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) {
    unlink(path_.c_str());
  }
  lock_.reset();  // the lock file stays: removing it would let two processes lock two files
}

}  // namespace sockmesh::agent
