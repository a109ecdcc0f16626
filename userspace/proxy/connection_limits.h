#pragma once
// Caps on the HBONE connections a proxy holds: in total and per source IP. Checked when a
// connection is accepted, before its TLS handshake, so that a peer cannot pin the proxy's memory
// and descriptors by opening connections it never uses. Shared by every worker (one mutex, taken
// once when a connection opens and once when it closes, never on the data path).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/ip_address.h"

namespace sockmesh::proxy {

class ConnectionLimits : public std::enable_shared_from_this<ConnectionLimits> {
 public:
  enum class Refusal { kNone, kTotal, kPerSource };

  // Holds one connection's place; gives it back when destroyed (on any thread).
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { release(); }
    explicit operator bool() const { return owner_ != nullptr; }
    void release();

   private:
    friend class ConnectionLimits;
    Ticket(std::shared_ptr<ConnectionLimits> owner, const IpAddress& source)
        : owner_(std::move(owner)), source_(source) {}
    std::shared_ptr<ConnectionLimits> owner_;
    IpAddress source_;
  };

  // 0 means no limit.
  ConnectionLimits(size_t max_total, size_t max_per_source)
      : max_total_(max_total), max_per_source_(max_per_source) {}

  // A ticket, or an empty one with *why set. When a refusal should be logged (at most once per
  // log interval), *log_now is true and *suppressed says how many went unlogged before it.
  Ticket admit(const IpAddress& source, Refusal* why, bool* log_now, uint64_t* suppressed);

  size_t open() const;
  size_t open_from(const IpAddress& source) const;
  size_t max_total() const { return max_total_; }
  size_t max_per_source() const { return max_per_source_; }

  static constexpr std::chrono::seconds kLogInterval{10};

 private:
  void release(const IpAddress& source);

  const size_t max_total_;
  const size_t max_per_source_;
  mutable std::mutex mu_;
  size_t total_ = 0;
  std::unordered_map<IpAddress, size_t> per_source_;
  std::chrono::steady_clock::time_point last_log_{};
  uint64_t unlogged_ = 0;
};

const char* refusal_name(ConnectionLimits::Refusal r);

}  // namespace sockmesh::proxy
