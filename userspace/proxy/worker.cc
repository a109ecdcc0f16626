#include "proxy/worker.h"

#include <pthread.h>

#include "base/log.h"
#include "proxy/pool.h"

namespace sockmesh::proxy {

Worker::Worker(int index) : index_(index), guard_(boost::asio::make_work_guard(io_)) {}

Worker::~Worker() {
  stop();
  // Connections hold executors of io_; destroy them before the io_context goes.
  live_.clear();
  pool_.reset();
}

void Worker::set_pool(std::unique_ptr<HbonePool> pool) { pool_ = std::move(pool); }

void Worker::start() {
  thread_ = std::thread([this] {
    std::string name = "sm-worker-" + std::to_string(index_);
    pthread_setname_np(pthread_self(), name.c_str());
    io_.run();
  });
}

void Worker::stop() {
  guard_.reset();
  io_.stop();
  if (thread_.joinable()) thread_.join();
}

uint64_t Worker::track(LiveConnection c) {
  uint64_t id = next_id_++;
  live_.emplace(id, std::move(c));
  return id;
}

void Worker::untrack(uint64_t id) { live_.erase(id); }

uint64_t Worker::on_drain(std::function<void()> fn) {
  uint64_t id = next_id_++;
  drainers_.emplace(id, std::move(fn));
  return id;
}

void Worker::forget_drain(uint64_t id) { drainers_.erase(id); }

void Worker::drain_all() {
  auto drainers = std::move(drainers_);
  drainers_.clear();
  for (auto& [_, fn] : drainers) fn();
}

}  // namespace sockmesh::proxy
