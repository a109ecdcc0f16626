#pragma once
// A Unix SOCK_SEQPACKET listener at a well-known path (the ZDS socket, the CNI event socket),
// owned the way a node daemon must own it:
//  - a socket file that another process still answers on, or whose lock file (<path>.lock,
//    flock) another process holds, is left alone: a second agent on the node fails to start
//    instead of silently cutting the first one's clients off;
//  - a socket file nobody answers on (an agent that crashed) is replaced;
//  - at exit the file is removed only if it is still the one this listener bound, so that an
//    agent that is shutting down never removes its successor's socket.
#include <sys/types.h>

#include <string>

#include "loader/maps/result.h"
#include "loader/maps/unique_fd.h"

namespace sockmesh::agent {

class UnixListener {
 public:
  struct Options {
    std::string path;
    std::string what;  // named in errors and logs: "ZDS", "CNI events"
    int backlog = 16;
    bool non_blocking = false;  // accepting end only; accepted sockets are the caller's
  };

  // Creates the parent directories (0755), checks for a live owner, binds with mode 0600 (only
  // root may talk to the agent) and listens.
  static maps::Result<UnixListener> open(const Options& options);

  UnixListener() = default;
  UnixListener(UnixListener&& other) noexcept;
  UnixListener& operator=(UnixListener&& other) noexcept;
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;
  ~UnixListener() { close(); }

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  explicit operator bool() const { return static_cast<bool>(fd_); }

  // Stops listening and removes the socket file if it is still ours.
  void close();

 private:
  maps::UniqueFd fd_;
  maps::UniqueFd lock_;  // flock on <path>.lock, held while listening
  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace sockmesh::agent
