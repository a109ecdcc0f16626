#pragma once
// HBONE connections from this worker to peers, reused for many CONNECT streams. A connection is
// shared only by tunnels with the same key: the same source workload (identity and IP, which is
// what the peer sees), to the same destination identity at the same address, verified against
// the same set of acceptable server identities (the workload's plus a service's SANs: two
// services in front of one workload may accept different identities, and a connection verified
// for one proves nothing for the other; ztunnel keys its pool the same way). Up to
// max_streams_per_connection streams (--pool-max-streams-per-connection, ztunnel's
// POOL_MAX_STREAMS_PER_CONNECTION; the peer's SETTINGS_MAX_CONCURRENT_STREAMS may set fewer)
// share one connection; a full one makes the pool open another.
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/ip_address.h"
#include "h2/connection.h"
#include "observe/metrics.h"

namespace sockmesh::proxy {

struct ProxyContext;
class Worker;

struct PoolKey {
  std::string source_identity;
  IpAddress source_ip;
  std::string destination_identity;
  Endpoint destination;  // the peer's HBONE address, <workload ip>:15008
  // Server identities this connection may present, sorted and without duplicates (make()).
  std::vector<std::string> acceptable_identities;

  // The key for a tunnel accepting `acceptable` (in any order, duplicates allowed).
  static PoolKey make(std::string source_identity, IpAddress source_ip,
                      std::string destination_identity, Endpoint destination,
                      std::vector<std::string> acceptable);

  bool operator==(const PoolKey&) const = default;
  std::string to_string() const;
};

struct PoolKeyHash {
  size_t operator()(const PoolKey& k) const;
};

class HbonePool {
 public:
  struct Failure {
    std::string reason;
    observe::ResponseFlags flag = observe::ResponseFlags::kConnectionFailure;
  };
  // Exactly one of conn / failure is set. The callback runs on the worker's thread.
  using Callback =
      std::function<void(std::shared_ptr<h2::H2Connection> conn, const Failure* failure)>;

  HbonePool(ProxyContext& ctx, Worker& worker);
  ~HbonePool();

  // Finds a connection with room for one more stream, or opens one whose server must present one
  // of key.acceptable_identities.
  void acquire(const PoolKey& key, Callback cb);
  // GOAWAY on every connection (drain).
  void shutdown_all();
  size_t connections() const;

 private:
  struct Connecting;
  std::shared_ptr<h2::H2Connection> find_usable(const PoolKey& key);
  void connect(const PoolKey& key);
  void connected(const PoolKey& key, std::shared_ptr<h2::H2Connection> conn);
  void failed(const PoolKey& key, const Failure& failure);
  void arm_idle_sweep();
  void sweep_idle();

  ProxyContext& ctx_;
  Worker& worker_;
  std::unordered_map<PoolKey, std::vector<std::shared_ptr<h2::H2Connection>>, PoolKeyHash> conns_;
  std::unordered_map<PoolKey, std::vector<Callback>, PoolKeyHash> waiters_;
  boost::asio::steady_timer idle_timer_;
  observe::Gauge* pooled_gauge_;
  observe::Counter* opened_counter_;
  observe::Counter* identity_mismatch_counter_;
  bool shut_down_ = false;
};

}  // namespace sockmesh::proxy
