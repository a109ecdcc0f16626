#pragma once
// HBONE connections from this worker to peers, reused for many CONNECT streams. A connection is
// shared only by tunnels with the same key: the same source workload (identity and IP, which is
// what the peer sees), to the same destination identity at the same address. Up to
// max_streams_per_connection streams share one connection; a full one makes the pool open another.
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
  using Callback = std::function<void(std::shared_ptr<h2::H2Connection> conn,
                                      const Failure* failure)>;

  HbonePool(ProxyContext& ctx, Worker& worker);
  ~HbonePool();

  // Finds a connection with room for one more stream, or opens one. `expected_identities` are the
  // server identities acceptable for this key (the destination workload's, or a service's SANs).
  void acquire(const PoolKey& key, std::vector<std::string> expected_identities, Callback cb);
  // GOAWAY on every connection (drain).
  void shutdown_all();
  size_t connections() const;

 private:
  struct Connecting;
  std::shared_ptr<h2::H2Connection> find_usable(const PoolKey& key);
  void connect(const PoolKey& key, std::vector<std::string> expected);
  void connected(const PoolKey& key, std::shared_ptr<h2::H2Connection> conn);
  void failed(const PoolKey& key, const Failure& failure);
  void arm_idle_sweep();
  void sweep_idle();

  ProxyContext& ctx_;
  Worker& worker_;
  std::unordered_map<PoolKey, std::vector<std::shared_ptr<h2::H2Connection>>, PoolKeyHash> conns_;
  struct Waiter {
    Callback cb;
    std::vector<std::string> expected;
  };
  std::unordered_map<PoolKey, std::vector<Waiter>, PoolKeyHash> waiters_;
  boost::asio::steady_timer idle_timer_;
  observe::Gauge* pooled_gauge_;
  observe::Counter* opened_counter_;
  bool shut_down_ = false;
};

}  // namespace sockmesh::proxy
