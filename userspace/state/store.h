#pragma once
// The current Snapshot, swapped atomically. Readers call get() (one atomic load of a shared_ptr);
// writers call set(), which also tells subscribers (e.g. to re-check live connections' policy).
#include <atomic>
#include <functional>
#include <mutex>
#include <vector>

#include "state/snapshot.h"

namespace sockmesh::state {

class StateStore {
 public:
  using Listener = std::function<void(const SnapshotPtr& previous, const SnapshotPtr& current)>;

  StateStore() : current_(std::make_shared<const Snapshot>()) {}

  SnapshotPtr get() const { return current_.load(std::memory_order_acquire); }
  void set(SnapshotPtr next);
  // Listeners run on the thread that calls set(); they must post work to their own loops.
  void subscribe(Listener listener);

 private:
  std::atomic<SnapshotPtr> current_;
  std::mutex mu_;
  std::vector<Listener> listeners_;
};

}  // namespace sockmesh::state
