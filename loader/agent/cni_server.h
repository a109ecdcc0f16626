#pragma once
// The agent's end of the plugin's event socket (cni/event/pod_event.h): a Unix SOCK_SEQPACKET
// listener, one request and one reply per connection. Each connection is served on its own
// thread, so that a slow enrollment does not hold up other pods' events; the agent serialises
// what must be serialised.
#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cni/event/pod_event.h"
#include "loader/agent/unix_listener.h"
#include "loader/maps/result.h"
#include "loader/maps/unique_fd.h"

namespace sockmesh::agent {

class CniEventServer {
 public:
  using Handler = std::function<cni::AgentReply(const cni::PodEvent&)>;
  // Called when the reply could not be delivered (the plugin's deadline passed and it left).
  using LostHandler = std::function<void(const cni::PodEvent&)>;

  CniEventServer(std::string socket_path, Handler handler, LostHandler lost);
  ~CniEventServer();
  CniEventServer(const CniEventServer&) = delete;
  CniEventServer& operator=(const CniEventServer&) = delete;

  // Creates the directory, replaces a stale socket file (but not one another agent answers on),
  // listens (mode 0600) and starts serving.
  maps::Status start();
  // The same on a socket claimed earlier with claim(): the agent claims its socket before it
  // changes anything on the node, so that a second agent stops before doing harm.
  static maps::Result<UnixListener> claim(const std::string& socket_path);
  maps::Status start(UnixListener listener);
  // Stops accepting, waits for the connections being served, removes the socket file if it is
  // still the one this server bound.
  void stop();

  const std::string& socket_path() const { return path_; }
  uint64_t served() const { return served_.load(); }

 private:
  void accept_loop();
  void serve(maps::UniqueFd connection);

  const std::string path_;
  Handler handler_;
  LostHandler lost_;
  UnixListener listener_;
  maps::UniqueFd wakeup_;  // eventfd that ends accept_loop
  std::thread acceptor_;
  std::mutex mu_;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Worker> workers_;
  std::atomic<uint64_t> served_{0};
  bool started_ = false;
};

}  // namespace sockmesh::agent
