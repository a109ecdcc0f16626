#pragma once
// The node agent's side of the pod handoff (WorkloadHandoff over ZDS, see zds_protocol.h), the
// server as in Istio: the agent listens on a Unix SOCK_SEQPACKET socket, the proxy connects and
// says hello, and the agent sends it every pod (its netns as SCM_RIGHTS) followed by
// snapshot_sent, then each add and del as they happen, waiting for each ack. The agent keeps the
// node's pods, so that a proxy that restarts (its connection ends, a new one arrives) gets the
// whole snapshot again.
//
// More than one proxy may be connected at a time (an old and a new one during an upgrade), as with
// Istio's agent: the newest connection gets adds and the snapshot; every connection gets dels.
// Older connections are not closed, so that two proxies do not keep displacing each other.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loader/agent/handoff.h"
#include "loader/agent/unix_listener.h"
#include "loader/agent/zds_protocol.h"
#include "loader/maps/result.h"
#include "loader/maps/unique_fd.h"

namespace sockmesh::agent {

// Istio's path, where ztunnel connects by default.
inline constexpr const char* kDefaultZdsSocket = "/var/run/ztunnel/ztunnel.sock";

struct ZdsServerOptions {
  std::string socket_path = kDefaultZdsSocket;
  std::chrono::milliseconds ack_timeout{5000};    // per request
  std::chrono::milliseconds hello_timeout{1000};  // a proxy says hello as soon as it connects
  // Connections served per accept round: each may cost a hello timeout under the agent's lock.
  int max_accepts_per_round = 4;
  // How long sync() and add() wait for a proxy to connect when none is: a running proxy that
  // lost its agent reconnects within its back-off (2 s at most), and an agent that has just
  // started must not fail the pods it enrolls in that gap.
  std::chrono::milliseconds connect_wait{3000};
};

class ZdsServer : public WorkloadHandoff {
 public:
  // Binds and listens. A leftover socket file is replaced; one that another process still serves
  // (a second agent on the node) is an error, and is left alone.
  static maps::Result<std::unique_ptr<ZdsServer>> listen(ZdsServerOptions options);
  ~ZdsServer() override;
  ZdsServer(const ZdsServer&) = delete;
  ZdsServer& operator=(const ZdsServer&) = delete;

  maps::Status add(const PodWorkload& pod) override;
  maps::Status remove(const std::string& uid) override;
  maps::Status sync(const std::vector<PodWorkload>& all) override;

  // Whether a proxy is connected and has the snapshot (sent and acknowledged).
  bool connected() const;
  // Waits until a session is up whose number is at least `min_sessions` (1: any).
  bool wait_connected(std::chrono::milliseconds timeout, uint64_t min_sessions = 1);
  // Sessions established so far: each one sent the snapshot to a (re)started proxy.
  uint64_t sessions() const;

 private:
  struct Session {
    maps::UniqueFd fd;
    uint64_t number = 0;
  };
  ZdsServer(ZdsServerOptions options, UnixListener listener);

  // All below run with mu_ held.
  // Accepts every connection waiting in the backlog and gives each the snapshot.
  void accept_pending();
  // With no session: waits up to connect_wait for a proxy to connect (mu_ released meanwhile).
  void wait_for_proxy(std::unique_lock<std::mutex>& lock);
  // Reads the proxy's hello, then sends every pod and snapshot_sent.
  maps::Status open_session(maps::UniqueFd fd);
  void close_session(size_t index, const std::string& why);
  // Sends one request on sessions_[index] and waits for its ack. A transport failure closes that
  // session (the index is then gone).
  maps::Status request(size_t index, const zds::Request& req, int attach_fd);
  // add with the netns attached, or keep when the netns cannot be opened (snapshot only).
  maps::Status send_pod(size_t index, const PodWorkload& pod, bool keep_if_gone);
  bool peer_gone(int fd);
  void background();

  const ZdsServerOptions options_;
  UnixListener listener_;
  bool accept_failing_ = false;  // accept() fails with other than EAGAIN (EMFILE...): back off
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, PodWorkload> pods_;           // the node's pods, by uid
  std::map<std::string, std::string> replay_errors_;  // nacks of the last snapshot, by uid
  std::vector<Session> sessions_;                     // oldest first; back() is the newest
  bool synced_ = false;  // sync() was called once: connections may be served
  uint64_t session_count_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sockmesh::agent
