#pragma once
// The Delta ADS client: one gRPC stream to istiod on a thread of its own ("sm-xds"), subscribed to
// istio.workload.Address and istio.security.Authorization, as ztunnel is.
//
// Each response is converted (convert.h) into a copy of the held resources; if that succeeds the
// copy is kept, a new state::Snapshot goes to the StateStore and the response is ACKed with its
// nonce; if not, it is NACKed with an error_detail naming the resource and the field and nothing
// changes. The store is first written once both types have been answered (the first complete
// sync), so the data plane never sees workloads without their policies. When the stream ends the
// last state stays in the store; the client reconnects with exponential backoff and jitter and
// tells the server what it holds (initial_resource_versions), so deletes made meanwhile arrive as
// removed_resources.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "state/store.h"
#include "xds/resources.h"

namespace grpc {
class ClientContext;
}

namespace sockmesh::xds {

struct DeltaClientOptions {
  std::string address;       // "https://host:port" or "host:port"
  std::string root_ca_file;  // PEM bundle istiod's certificate must chain to
  std::string token_file;    // read on every connection attempt; "" sends no token
  std::string cluster_id = "Kubernetes";
  // Who this proxy is, for the node id and metadata.
  std::string node_name;
  std::string pod_name;
  std::string pod_namespace;
  std::string instance_ip;
  int max_message_bytes = 32 << 20;  // a bigger response ends the stream (RESOURCE_EXHAUSTED)
  std::chrono::milliseconds initial_backoff{200};
  std::chrono::milliseconds max_backoff{5000};
};

// What the client has seen, for /config_dump and the metrics.
struct DeltaClientStatus {
  struct PerType {
    bool answered = false;  // an ACKed response has been received since start
    std::string acked_version;
    std::string acked_nonce;
    uint64_t acks = 0;
    uint64_t nacks = 0;
    std::string nacked_nonce;
    std::string nack_error;  // why the last NACK was sent
  };
  bool connected = false;
  bool synced = false;
  uint64_t streams = 0;                  // streams opened
  std::string last_error;                // why the last stream ended, or why it could not start
  std::map<std::string, PerType> types;  // by type URL
  std::map<std::string, uint64_t> terminations;  // stream ends by reason (gRPC code name)
  size_t workloads = 0, services = 0, policies = 0;
};

class DeltaClient {
 public:
  // `store` must outlive the client.
  DeltaClient(DeltaClientOptions options, state::StateStore* store);
  ~DeltaClient();
  DeltaClient(const DeltaClient&) = delete;
  DeltaClient& operator=(const DeltaClient&) = delete;

  void start();
  // Cancels the stream and joins the thread; the store keeps the last state.
  void stop();

  // True once both types have been answered (the first complete sync); stays true after.
  bool synced() const;
  DeltaClientStatus status() const;

  // ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local
  static std::string node_id(const DeltaClientOptions& o);

 private:
  void run();
  // One stream, from connect to end; true when at least one response arrived on it.
  bool run_stream();
  void stream_ended(const std::string& reason, const std::string& message);

  const DeltaClientOptions options_;
  state::StateStore* const store_;
  XdsResources resources_;  // only the client thread touches it

  mutable std::mutex mu_;  // guards all below
  std::condition_variable cv_;
  bool stopping_ = false;
  grpc::ClientContext* active_ = nullptr;  // the open stream's context, to cancel it
  DeltaClientStatus status_;
  std::thread thread_;
};

}  // namespace sockmesh::xds
