#pragma once
// One event loop on one thread. Every connection lives on exactly one worker, so its state is
// touched by one thread only and needs no locks; cross-thread requests are posted.
#include <boost/asio/io_context.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "policy/authorize.h"

namespace sockmesh::proxy {

class HbonePool;
class ConnectionRecord;

// A connection that policy may revoke, or drain may have to end.
struct LiveConnection {
  std::string destination_uid;   // the local workload being protected
  policy::ConnectionFacts facts;  // what authorization saw when it was allowed
  std::function<void(const std::string& reason)> abort;
};

class Worker {
 public:
  explicit Worker(int index);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  int index() const { return index_; }
  boost::asio::io_context& io() { return io_; }
  HbonePool& pool() { return *pool_; }
  void set_pool(std::unique_ptr<HbonePool> pool);

  void start();
  void stop();

  // On this worker's thread only.
  uint64_t track(LiveConnection c);
  void untrack(uint64_t id);
  std::unordered_map<uint64_t, LiveConnection>& live() { return live_; }
  // The records of every connection alive on this worker, whatever its state (/config_dump lists
  // them). ConnectionRecord adds and removes itself.
  void add_record(ConnectionRecord* r) { records_.insert(r); }
  void remove_record(ConnectionRecord* r) { records_.erase(r); }
  const std::unordered_set<ConnectionRecord*>& records() const { return records_; }
  // Things to tell when the proxy drains (e.g. send GOAWAY on a server connection).
  uint64_t on_drain(std::function<void()> fn);
  void forget_drain(uint64_t id);
  void drain_all();

  // Connections in any state (accepted, handshaking, relaying): drain waits for these.
  std::atomic<int64_t>& active() { return active_; }

 private:
  int index_;
  // Before io_, so that it outlives the handlers io_ destroys (records remove themselves).
  std::unordered_set<ConnectionRecord*> records_;
  std::atomic<int64_t> active_{0};
  boost::asio::io_context io_{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::thread thread_;
  std::unique_ptr<HbonePool> pool_;
  std::unordered_map<uint64_t, LiveConnection> live_;
  std::unordered_map<uint64_t, std::function<void()>> drainers_;
  uint64_t next_id_ = 1;
};

// Counts a connection as active for as long as the guard lives.
class ActiveGuard {
 public:
  explicit ActiveGuard(std::atomic<int64_t>* counter) : counter_(counter) { counter_->fetch_add(1); }
  ~ActiveGuard() { counter_->fetch_sub(1); }
  ActiveGuard(const ActiveGuard&) = delete;
  ActiveGuard& operator=(const ActiveGuard&) = delete;

 private:
  std::atomic<int64_t>* counter_;
};

}  // namespace sockmesh::proxy
