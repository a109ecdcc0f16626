#include "state/store.h"

namespace sockmesh::state {

void StateStore::set(SnapshotPtr next) {
  std::vector<Listener> listeners;
  {
    std::lock_guard lock(mu_);
    listeners = listeners_;
  }
  auto previous = current_.exchange(next, std::memory_order_acq_rel);
  for (auto& l : listeners) l(previous, next);
}

void StateStore::subscribe(Listener listener) {
  std::lock_guard lock(mu_);
  listeners_.push_back(std::move(listener));
}

}  // namespace sockmesh::state
