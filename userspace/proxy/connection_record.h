#pragma once
// The bookkeeping every proxied connection carries, whatever its role: counted as active (drain
// waits for it), metrics opened/closed with Istio's labels, byte counts, registration for policy
// re-checks, and one access-log line at the end.
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "observe/access_log.h"
#include "observe/metrics.h"
#include "proxy/labels.h"
#include "proxy/worker.h"

namespace sockmesh::proxy {

struct ProxyContext;

// What /config_dump shows of one live connection.
struct ConnectionSummary {
  std::string direction;  // "inbound" or "outbound"
  std::string path;       // ConnectionRecord::set_path; "" while not yet decided
  std::string relay;      // how the bytes move: "splice", "copy" or "tunnel"; "" before the relay
  observe::AccessRecord access;  // addresses, identities and bytes so far
};

class ConnectionRecord {
 public:
  ConnectionRecord(ProxyContext& ctx, Worker& worker, std::string direction);
  ~ConnectionRecord();
  ConnectionRecord(const ConnectionRecord&) = delete;
  ConnectionRecord& operator=(const ConnectionRecord&) = delete;

  observe::AccessRecord& access() { return access_; }
  // Which way the connection goes: "hbone" (a tunnel, outbound or inbound), "same-node" (the
  // same-node fast path), "passthrough" (plain TCP to a destination outside the mesh) or
  // "plaintext" (inbound plain TCP to a local workload); and, once it relays, how ("splice",
  // "copy" or "tunnel"). Shown by /config_dump.
  void set_path(std::string path) { path_ = std::move(path); }
  void set_relay(std::string relay) { relay_ = std::move(relay); }
  ConnectionSummary summary() const { return {access_.direction, path_, relay_, access_}; }
  // Who is talking to whom; opens the metrics series. Call once.
  void identify(observe::Reporter reporter, const ConnectionView& view);
  // Registers for policy re-checks; untracked on finish.
  void track(const std::string& destination_uid, const policy::ConnectionFacts& facts,
             std::function<void(const std::string&)> abort);
  void add_sent(uint64_t n);      // towards the destination
  void add_received(uint64_t n);  // from the destination
  // Ends the record: metrics closed, access log written. Later calls do nothing.
  void finish(const std::string& error,
              observe::ResponseFlags flags = observe::ResponseFlags::kNone);
  bool finished() const { return finished_; }

 private:
  ProxyContext& ctx_;
  Worker& worker_;
  ActiveGuard active_;
  observe::AccessRecord access_;
  observe::ConnectionMetrics metrics_;
  std::optional<uint64_t> tracked_;
  std::string path_;
  std::string relay_;
  bool finished_ = false;
};

// A relay's progress callback that counts bytes on `record`. `forward_is_outgoing` says whether
// the relay's forward direction carries bytes towards the destination.
inline std::function<void(bool, size_t)> count_bytes(std::shared_ptr<ConnectionRecord> record,
                                                     bool forward_is_outgoing) {
  return [record = std::move(record), forward_is_outgoing](bool forward, size_t n) {
    if (forward == forward_is_outgoing) {
      record->add_sent(n);
    } else {
      record->add_received(n);
    }
  };
}

// A relay's completion callback that ends `record` with the relay's error, if any.
template <typename RelayResult>
std::function<void(const RelayResult&)> finish_when_done(std::shared_ptr<ConnectionRecord> record) {
  return [record = std::move(record)](const RelayResult& res) {
    record->finish(res.error, res.error.empty() ? observe::ResponseFlags::kNone
                                                : observe::ResponseFlags::kConnectionFailure);
  };
}

}  // namespace sockmesh::proxy
