#pragma once
// In-pod mode: the node agent hands each enrolled pod to the proxy over a Unix SOCK_SEQPACKET
// socket (ZDS, see loader/agent/zds_protocol.h), with the pod's network namespace attached. As in
// Istio, the agent serves the socket and the proxy connects (again and again: whenever the
// connection ends, it reconnects, and the agent sends its whole snapshot). For each pod the proxy
// opens its listeners inside that netns (15001 and 15006 transparent, 15008), serves them like
// its own, and registers them in the pinned listener map under every pod IP so that tc hands
// captured SYNs to them. del closes them; snapshot_sent closes every pod the agent did not
// mention on that connection. Each message is acked once it took effect, or with an error.
// Pods stay served while the agent is away.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "loader/agent/zds_protocol.h"
#include "loader/maps/listener_map.h"
#include "loader/maps/unique_fd.h"
#include "net/netns.h"

namespace sockmesh::observe {
class Gauge;
}

namespace sockmesh::proxy {

class Proxy;

struct ZdsOptions {
  std::string socket_path;  // --zds-socket: where the node agent serves ZDS
  std::string pin_root;     // --bpf-pin-root; empty: do not register listeners for tc
  // Reconnect back-off, doubling from retry_min up to retry_max while the agent is away.
  std::chrono::milliseconds retry_min{20};
  std::chrono::milliseconds retry_max{2000};
  // A pod whose add failed (nacked) is tried again this often until it works, the agent deletes
  // it, or a snapshot leaves it out (as ztunnel retries its pending pods).
  std::chrono::milliseconds retry_failed_add{5000};
};

class ZdsClient {
 public:
  ZdsClient(Proxy& proxy, ZdsOptions options);
  ~ZdsClient();
  ZdsClient(const ZdsClient&) = delete;
  ZdsClient& operator=(const ZdsClient&) = delete;

  // Starts the thread that connects to the agent and serves its requests; it is also the thread
  // that enters pods' namespaces to create their listeners.
  std::optional<std::string> start();
  // Disconnects. Pods' listeners stay with the proxy (its drain closes them). Call before the
  // proxy drains: adoption needs the proxy's control thread.
  void stop();

  size_t pods() const { return pod_count_.load(); }
  // True once a node agent has sent its first full snapshot: until then the proxy does not know
  // which pods it must serve, so it is not ready (as ztunnel).
  bool synced() const { return synced_.load(); }

 private:
  struct Registration {
    IpAddress ip;
    maps::ListenerKind kind;
    uint64_t cookie;
  };
  struct Pod {
    zds::AddWorkload info;
    std::shared_ptr<const net::Netns> netns;
    std::vector<Registration> registered;
  };
  // An add that failed, kept with its own copy of the netns descriptor to try again.
  struct Failed {
    zds::AddWorkload info;
    maps::UniqueFd netns;
    int attempts = 1;
  };
  // What one agent connection has said so far.
  struct Session {
    bool snapshot_received = false;
    std::set<std::string> mentioned;  // added or kept before snapshot_sent
  };

  void run();
  // One connection to the agent: requests until it ends or stop() is called.
  enum class Ended { kStopped, kAfterSnapshot, kEarly };
  Ended serve(maps::UniqueFd conn);
  // Waits for stop() up to `d`; true when stop() was called.
  bool stop_requested_within(std::chrono::milliseconds d);
  std::string handle(const zds::Request& request, maps::UniqueFd fd, Session& session);
  std::string add(const zds::AddWorkload& add, maps::UniqueFd netns_fd);
  // add() from a request: a failure is remembered in failed_ and retried.
  std::string add_or_remember(const zds::AddWorkload& add, maps::UniqueFd netns_fd);
  void retry_failed_adds();
  void remove(const std::string& uid, const std::string& why);
  std::optional<std::string> listener_map(maps::ListenerMap** out);
  // When the pinned listener map is no longer the one we opened: forget it and every pod.
  void follow_recreated_listener_map();

  Proxy& proxy_;
  const ZdsOptions options_;
  maps::UniqueFd wake_fd_;  // eventfd: stop()
  std::thread thread_;
  std::atomic<bool> synced_{false};
  std::map<std::string, Pod> pods_;       // by uid; the ZDS thread's alone
  std::map<std::string, Failed> failed_;  // by uid; adds to try again
  std::optional<maps::ListenerMap> listeners_map_;
  std::atomic<size_t> pod_count_{0};
  observe::Gauge* pods_gauge_;
};

}  // namespace sockmesh::proxy
