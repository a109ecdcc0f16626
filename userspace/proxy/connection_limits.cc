#include "proxy/connection_limits.h"

namespace sockmesh::proxy {

ConnectionLimits::Ticket& ConnectionLimits::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::move(other.owner_);
    source_ = other.source_;
    other.owner_.reset();
  }
  return *this;
}

void ConnectionLimits::Ticket::release() {
  if (!owner_) return;
  auto owner = std::move(owner_);
  owner_.reset();
  owner->release(source_);
}

ConnectionLimits::Ticket ConnectionLimits::admit(const IpAddress& source, Refusal* why,
                                                 bool* log_now, uint64_t* suppressed) {
  std::lock_guard lock(mu_);
  *why = Refusal::kNone;
  *log_now = false;
  *suppressed = 0;
  auto it = per_source_.find(source);
  size_t from_source = it == per_source_.end() ? 0 : it->second;
  if (max_total_ != 0 && total_ >= max_total_) {
    *why = Refusal::kTotal;
  } else if (max_per_source_ != 0 && from_source >= max_per_source_) {
    *why = Refusal::kPerSource;
  }
  if (*why != Refusal::kNone) {
    auto now = std::chrono::steady_clock::now();
    if (last_log_ == std::chrono::steady_clock::time_point{} || now - last_log_ >= kLogInterval) {
      last_log_ = now;
      *log_now = true;
      *suppressed = unlogged_;
      unlogged_ = 0;
    } else {
      ++unlogged_;
    }
    return {};
  }
  ++total_;
  if (it == per_source_.end()) {
    per_source_.emplace(source, 1);
  } else {
    ++it->second;
  }
  return Ticket(shared_from_this(), source);
}

void ConnectionLimits::release(const IpAddress& source) {
  std::lock_guard lock(mu_);
  if (total_ > 0) --total_;
  auto it = per_source_.find(source);
  if (it == per_source_.end()) return;
  if (--it->second == 0) per_source_.erase(it);
}

size_t ConnectionLimits::open() const {
  std::lock_guard lock(mu_);
  return total_;
}

size_t ConnectionLimits::open_from(const IpAddress& source) const {
  std::lock_guard lock(mu_);
  auto it = per_source_.find(source);
  return it == per_source_.end() ? 0 : it->second;
}

const char* refusal_name(ConnectionLimits::Refusal r) {
  switch (r) {
    case ConnectionLimits::Refusal::kTotal:
      return "total";
    case ConnectionLimits::Refusal::kPerSource:
      return "per_source";
    case ConnectionLimits::Refusal::kNone:
      break;
  }
  return "none";
}

}  // namespace sockmesh::proxy
