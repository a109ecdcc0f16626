#include "proxy/connection_record.h"

#include "proxy/context.h"

namespace sockmesh::proxy {

ConnectionRecord::ConnectionRecord(ProxyContext& ctx, Worker& worker, std::string direction)
    : ctx_(ctx), worker_(worker), active_(&worker.active()) {
  access_.direction = std::move(direction);
  worker_.add_record(this);
}

ConnectionRecord::~ConnectionRecord() {
  if (!finished_) finish("connection dropped before it completed");
}

void ConnectionRecord::identify(observe::Reporter reporter, const ConnectionView& view) {
  fill_access(access_, view);
  metrics_ = ctx_.metrics->connection(traffic_labels(reporter, view));
  metrics_.opened();
}

void ConnectionRecord::track(const std::string& destination_uid,
                             const policy::ConnectionFacts& facts,
                             std::function<void(const std::string&)> abort) {
  tracked_ = worker_.track(LiveConnection{destination_uid, facts, std::move(abort)});
}

void ConnectionRecord::add_sent(uint64_t n) {
  access_.bytes_sent += n;
  // Istio counts request-direction bytes as "received" (by the destination side of the proxy).
  metrics_.add_received(n);
}

void ConnectionRecord::add_received(uint64_t n) {
  access_.bytes_recv += n;
  metrics_.add_sent(n);
}

void ConnectionRecord::finish(const std::string& error, observe::ResponseFlags flags) {
  if (finished_) return;
  finished_ = true;
  worker_.remove_record(this);
  if (tracked_) worker_.untrack(*tracked_);
  tracked_.reset();
  access_.error = error;
  metrics_.closed(flags);
  observe::log_access(access_);
}

}  // namespace sockmesh::proxy
