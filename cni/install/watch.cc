#include "cni/install/watch.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>

namespace sockmesh::cni::install {

DirectoryWatch::DirectoryWatch(std::vector<std::string> dirs)
    : dirs_(std::move(dirs)), watches_(dirs_.size(), -1) {
  fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  add_missing_watches();
}

DirectoryWatch::~DirectoryWatch() {
  if (fd_ >= 0) close(fd_);
}

void DirectoryWatch::add_missing_watches() {
  if (fd_ < 0) return;
  for (size_t i = 0; i < dirs_.size(); ++i) {
    if (watches_[i] >= 0) continue;
    watches_[i] = inotify_add_watch(fd_, dirs_[i].c_str(),
                                    IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM |
                                        IN_CLOSE_WRITE | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF);
  }
}

void DirectoryWatch::drain() {
  alignas(inotify_event) char buf[8192];
  for (;;) {
    ssize_t n = read(fd_, buf, sizeof(buf));
    if (n <= 0) break;
    for (ssize_t at = 0; at < n;) {
      auto* event = reinterpret_cast<inotify_event*>(buf + at);
      if (event->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF)) {
        for (auto& w : watches_) {
          if (w == event->wd) w = -1;  // the directory went away; re-added when it is back
        }
      }
      at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
    }
  }
}

bool DirectoryWatch::wait(std::chrono::milliseconds timeout, std::chrono::milliseconds settle,
                          int stop_fd) {
  add_missing_watches();
  pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_fd, POLLIN, 0}};
  int n = poll(fds, stop_fd >= 0 ? 2 : 1, static_cast<int>(timeout.count()));
  if (n <= 0 || (stop_fd >= 0 && (fds[1].revents & POLLIN))) return false;
  // Let a burst of writes (a CNI writing several files, our own temp + rename) finish.
  do {
    drain();
    fds[0].revents = 0;
  } while (poll(fds, 1, static_cast<int>(settle.count())) > 0 && (fds[0].revents & POLLIN));
  return true;
}

}  // namespace sockmesh::cni::install
