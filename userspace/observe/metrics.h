#pragma once
// Metrics registry rendered in the Prometheus text exposition format (version 0.0.4).
//
// Two kinds of metrics live here:
//   - Istio's standard TCP metrics (istio_tcp_connections_opened_total, ..._closed_total,
//     istio_tcp_received_bytes_total, istio_tcp_sent_bytes_total) with the label set ztunnel emits
//     (TrafficLabels). A connection obtains a ConnectionMetrics handle once (one lock); after that
//     every update is a relaxed atomic add on counters shared by all connections with the same
//     labels. Series are never removed, so handles stay valid.
//   - The proxy's own counters and gauges with few labels (sockmesh_*). counter()/gauge() take a
//     lock; callers look a series up once and keep the reference, which stays valid for the
//     registry's lifetime.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sockmesh::observe {

class Counter {
 public:
  void inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void set(int64_t v) { value_.store(v, std::memory_order_relaxed); }
  void inc(int64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  void dec(int64_t n = 1) { value_.fetch_sub(n, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// A Prometheus histogram: cumulative buckets by upper bound (plus +Inf), sum and count. observe()
// is lock-free; a scrape may see a bucket and the count of slightly different moments.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // ascending upper bounds, +Inf implied
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Observations <= bounds()[i] (cumulative); i == bounds().size() is +Inf, i.e. count().
  uint64_t cumulative(size_t i) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // non-cumulative, bounds_.size() + 1
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// Label name/value pairs of a generic metric. Order does not matter (series are keyed and
// rendered sorted by name).
using Labels = std::vector<std::pair<std::string, std::string>>;

// Label values as ztunnel renders them (src/proxy/metrics.rs).
enum class Reporter { kSource, kDestination };       // "source", "destination"
enum class RequestProtocol { kTcp, kHttp };          // "tcp", "http"
enum class SecurityPolicy { kUnknown, kMutualTls };  // "unknown", "mutual_tls"
enum class ResponseFlags {
  kNone,                       // "-"
  kAuthorizationPolicyDenied,  // "DENY"
  kConnectionFailure,          // "CONNECT"
  kTlsFailure,                 // "TLS_FAILURE"
  kHttp2HandshakeFailure,      // "H2_HANDSHAKE_FAILURE"
  kNetworkPolicyError,         // "NETWORK_POLICY"
  kIdentityError,              // "IDENTITY_ERROR"
  kCertificateRevoked,         // "CERT_REVOKED"
};

std::string_view to_string(Reporter v);
std::string_view to_string(RequestProtocol v);
std::string_view to_string(SecurityPolicy v);
std::string_view to_string(ResponseFlags v);

// The labels of Istio's TCP metrics, in the order ztunnel emits them. Empty strings render as
// "unknown". Principals are full SPIFFE IDs ("spiffe://td/ns/x/sa/y"); source_principal should be
// the peer identity from the handshake (leave empty for plaintext). ztunnel additionally emits
// source_/destination_ region and zone when it knows a workload's locality; the state model has no
// locality, so those are not produced here.
struct TrafficLabels {
  Reporter reporter = Reporter::kSource;

  std::string source_workload;
  std::string source_canonical_service;
  std::string source_canonical_revision;
  std::string source_workload_namespace;
  std::string source_principal;
  std::string source_app;
  std::string source_version;
  std::string source_cluster;

  std::string destination_service;  // hostname, e.g. "echo.ns.svc.cluster.local"
  std::string destination_service_namespace;
  std::string destination_service_name;

  std::string destination_workload;
  std::string destination_canonical_service;
  std::string destination_canonical_revision;
  std::string destination_workload_namespace;
  std::string destination_principal;
  std::string destination_app;
  std::string destination_version;
  std::string destination_cluster;

  RequestProtocol request_protocol = RequestProtocol::kTcp;
  ResponseFlags response_flags = ResponseFlags::kNone;
  SecurityPolicy connection_security_policy = SecurityPolicy::kUnknown;

  // NOLINTNEXTLINE(modernize-use-nullptr): false positive on the synthesized comparison
  auto operator<=>(const TrafficLabels&) const = default;
};

// Visits the labels in emission order as (name, rendered value), with "unknown" substituted.
template <typename F>
void for_each_label(const TrafficLabels& l, F&& f);

namespace detail {
struct TcpSeries {
  Counter opened;
  Counter closed;
  Counter received_bytes;
  Counter sent_bytes;
  const TrafficLabels* labels = nullptr;  // the map key this series is stored under
  std::string label_text;                 // rendered "{reporter=\"source\",...}", built once
};
class TcpFamily;
}  // namespace detail

// One connection's view of the Istio TCP metrics. Obtain it from Registry::connection() once per
// connection; the byte counters are then lock-free and may be called from any thread. Also keeps
// this connection's own byte totals (for the access log).
//
// Direction follows ztunnel (src/copy.rs): add_received() counts bytes from the connection's
// originator towards the destination (request direction), add_sent() bytes back to the originator.
class ConnectionMetrics {
 public:
  ConnectionMetrics() = default;  // records nothing
  ConnectionMetrics(ConnectionMetrics&& other) noexcept;
  ConnectionMetrics& operator=(ConnectionMetrics&& other) noexcept;
  ConnectionMetrics(const ConnectionMetrics&) = delete;
  ConnectionMetrics& operator=(const ConnectionMetrics&) = delete;
  // Records closed() with kNone if opened() was recorded but closed() was not.
  ~ConnectionMetrics();

  // Counts the connection as opened; only the first call counts.
  void opened();
  // Counts the connection as closed, under the same labels except response_flags (as ztunnel
  // does, a failure flag is only known at close; a different flag costs one registry lookup).
  // Only the first call counts.
  void closed(ResponseFlags flags = ResponseFlags::kNone);

  void add_received(uint64_t n) {
    if (series_ != nullptr) {
      series_->received_bytes.inc(n);
    }
    received_.fetch_add(n, std::memory_order_relaxed);
  }
  void add_sent(uint64_t n) {
    if (series_ != nullptr) {
      series_->sent_bytes.inc(n);
    }
    sent_.fetch_add(n, std::memory_order_relaxed);
  }

  // This connection's totals.
  uint64_t received_bytes() const { return received_.load(std::memory_order_relaxed); }
  uint64_t sent_bytes() const { return sent_.load(std::memory_order_relaxed); }

  // The labels of the series this handle updates; nullptr for a default-constructed handle.
  const TrafficLabels* labels() const { return series_ ? series_->labels : nullptr; }
  explicit operator bool() const { return series_ != nullptr; }

 private:
  friend class Registry;
  ConnectionMetrics(std::shared_ptr<detail::TcpFamily> family, detail::TcpSeries* series)
      : family_(std::move(family)), series_(series) {}

  static constexpr uint8_t kOpened = 1;
  static constexpr uint8_t kClosed = 2;

  std::shared_ptr<detail::TcpFamily> family_;  // keeps series_ alive
  detail::TcpSeries* series_ = nullptr;
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint8_t> state_{0};
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Finds or creates the TCP series for `labels` (one lock) and returns a handle to it.
  ConnectionMetrics connection(const TrafficLabels& labels);

  // Finds or creates a generic series. The name must match [a-zA-Z_:][a-zA-Z0-9_:]* and not be
  // one of the Istio TCP names; label names must match [a-zA-Z_][a-zA-Z0-9_]*, not start with
  // "__" and not repeat. `help` is kept from the first registration of a name. Registering a name
  // as both counter and gauge, or with a different set of label names, throws
  // std::invalid_argument, as do invalid names.
  Counter& counter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels = {});
  // As counter(); `bounds` are kept from the first registration of a name. Labels may not
  // include "le".
  Histogram& histogram(std::string_view name, std::string_view help,
                       const std::vector<double>& bounds, const Labels& labels = {});

  // Values of one TCP series (all zero if it does not exist); for tests and diagnostics.
  struct TcpValues {
    uint64_t opened = 0, closed = 0, received_bytes = 0, sent_bytes = 0;
  };
  TcpValues tcp_values(const TrafficLabels& labels) const;

  // The whole registry in the text exposition format: for each metric name a "# HELP" line, a
  // "# TYPE" line and its samples sorted by labels. Istio TCP metrics come first (opened, closed,
  // received, sent; omitted while there is no connection), then the generic ones sorted by name.
  std::string render() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Family {
    Kind kind;
    std::string help;
    std::vector<std::string> label_names;  // sorted
    std::map<Labels, std::unique_ptr<Counter>> counters;
    std::map<Labels, std::unique_ptr<Gauge>> gauges;
    std::map<Labels, std::unique_ptr<Histogram>> histograms;
    std::vector<double> bounds;  // histograms only
  };
  Family& family_locked(std::string_view name, std::string_view help, Kind kind,
                        const Labels& sorted_labels);

  std::shared_ptr<detail::TcpFamily> tcp_;
  mutable std::mutex mu_;
  std::map<std::string, Family, std::less<>> families_;
};

// The process-wide registry that the proxy's components report to and the admin server renders.
Registry& default_registry();

// Exposition-format escaping: label values escape backslash, double quote and newline; HELP text
// escapes backslash and newline.
std::string escape_label_value(std::string_view value);
std::string escape_help(std::string_view help);
bool is_valid_metric_name(std::string_view name);
bool is_valid_label_name(std::string_view name);

template <typename F>
void for_each_label(const TrafficLabels& l, F&& f) {
  auto s = [](const std::string& v) -> std::string_view {
    return v.empty() ? std::string_view("unknown") : std::string_view(v);
  };
  f("reporter", to_string(l.reporter));
  f("source_workload", s(l.source_workload));
  f("source_canonical_service", s(l.source_canonical_service));
  f("source_canonical_revision", s(l.source_canonical_revision));
  f("source_workload_namespace", s(l.source_workload_namespace));
  f("source_principal", s(l.source_principal));
  f("source_app", s(l.source_app));
  f("source_version", s(l.source_version));
  f("source_cluster", s(l.source_cluster));
  f("destination_service", s(l.destination_service));
  f("destination_service_namespace", s(l.destination_service_namespace));
  f("destination_service_name", s(l.destination_service_name));
  f("destination_workload", s(l.destination_workload));
  f("destination_canonical_service", s(l.destination_canonical_service));
  f("destination_canonical_revision", s(l.destination_canonical_revision));
  f("destination_workload_namespace", s(l.destination_workload_namespace));
  f("destination_principal", s(l.destination_principal));
  f("destination_app", s(l.destination_app));
  f("destination_version", s(l.destination_version));
  f("destination_cluster", s(l.destination_cluster));
  f("request_protocol", to_string(l.request_protocol));
  f("response_flags", to_string(l.response_flags));
  f("connection_security_policy", to_string(l.connection_security_policy));
}

}  // namespace sockmesh::observe
