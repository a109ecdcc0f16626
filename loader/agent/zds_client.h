#pragma once
// The node agent's side of the pod handoff (WorkloadHandoff over ZDS, see zds_protocol.h): it
// connects to the proxy's --zds-socket, sends each pod with its netns as SCM_RIGHTS and waits for
// the ack. It keeps the node's pods, so that when the proxy restarts (the connection drops) a
// background thread reconnects and replays them, then sends snapshot_sent.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loader/agent/handoff.h"
#include "loader/agent/zds_protocol.h"
#include "loader/maps/unique_fd.h"

namespace sockmesh::agent {

struct ZdsClientOptions {
  std::string socket_path;                      // the proxy's --zds-socket
  std::chrono::milliseconds ack_timeout{5000};  // per request, and for the proxy's hello
  std::chrono::milliseconds retry_min{50};      // reconnect back-off, doubling up to retry_max
  std::chrono::milliseconds retry_max{2000};
};

class ZdsClient : public WorkloadHandoff {
 public:
  explicit ZdsClient(ZdsClientOptions options);
  ~ZdsClient() override;
  ZdsClient(const ZdsClient&) = delete;
  ZdsClient& operator=(const ZdsClient&) = delete;

  maps::Status add(const PodWorkload& pod) override;
  maps::Status remove(const std::string& uid) override;
  maps::Status sync(const std::vector<PodWorkload>& all) override;

  // Whether a session with the proxy is up (its snapshot sent and acknowledged).
  bool connected() const;
  // Waits until a session is up whose number is at least `min_sessions` (1: any).
  bool wait_connected(std::chrono::milliseconds timeout, uint64_t min_sessions = 1);
  // Sessions established so far: each one replayed the snapshot to a (re)started proxy.
  uint64_t sessions() const;

 private:
  // All below run with mu_ held.
  maps::Status open_session();
  void close_session(const std::string& why);
  // Sends one request and waits for its ack. A transport failure closes the session.
  maps::Status request(const zds::Request& req, int attach_fd);
  // add with the netns attached, or keep when the netns cannot be opened (replay only).
  maps::Status send_pod(const PodWorkload& pod, bool keep_if_gone);
  bool peer_gone();
  void background();

  const ZdsClientOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, PodWorkload> pods_;           // the node's pods, by uid
  std::map<std::string, std::string> replay_errors_;  // nacks of the last replay, by uid
  maps::UniqueFd session_;
  bool synced_ = false;  // sync() was called once: sessions may be opened
  uint64_t sessions_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sockmesh::agent
