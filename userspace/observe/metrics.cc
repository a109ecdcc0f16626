#include "observe/metrics.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <stdexcept>

namespace sockmesh::observe {

namespace detail {

// All TCP series, keyed by their labels. Series are created on first use and never removed, so
// pointers handed out stay valid for as long as the family lives.
class TcpFamily {
 public:
  TcpSeries* get(const TrafficLabels& labels) {
    std::lock_guard lock(mu_);
    auto [it, inserted] = series_.try_emplace(labels);
    if (inserted) {
      it->second.labels = &it->first;
      it->second.label_text = render_labels(it->first);
    }
    return &it->second;
  }

  const TcpSeries* find(const TrafficLabels& labels) const {
    std::lock_guard lock(mu_);
    auto it = series_.find(labels);
    return it == series_.end() ? nullptr : &it->second;
  }

  // Stable pointers to every series, in label order.
  std::vector<const TcpSeries*> all() const {
    std::lock_guard lock(mu_);
    std::vector<const TcpSeries*> out;
    out.reserve(series_.size());
    for (const auto& [_, s] : series_) {
      out.push_back(&s);
    }
    return out;
  }

 private:
  static std::string render_labels(const TrafficLabels& l) {
    std::string out = "{";
    bool first = true;
    for_each_label(l, [&](std::string_view name, std::string_view value) {
      if (!first) {
        out += ',';
      }
      first = false;
      out.append(name).append("=\"").append(escape_label_value(value)).append("\"");
    });
    out += '}';
    return out;
  }

  mutable std::mutex mu_;
  std::map<TrafficLabels, TcpSeries> series_;
};

}  // namespace detail

namespace {

struct TcpMetric {
  std::string_view name;
  std::string_view help;
  const Counter detail::TcpSeries::*counter;
};

constexpr std::array<TcpMetric, 4> kTcpMetrics = {{
    {"istio_tcp_connections_opened_total", "Total TCP connections opened.",
     &detail::TcpSeries::opened},
    {"istio_tcp_connections_closed_total", "Total TCP connections closed.",
     &detail::TcpSeries::closed},
    {"istio_tcp_received_bytes_total",
     "Total bytes received from the connection's originator (request direction).",
     &detail::TcpSeries::received_bytes},
    {"istio_tcp_sent_bytes_total",
     "Total bytes sent back to the connection's originator (response direction).",
     &detail::TcpSeries::sent_bytes},
}};

bool is_name_char(char c, bool first, bool colon_ok) {
  bool alpha =
      (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_ok && c == ':');
  return alpha || (!first && c >= '0' && c <= '9');
}

bool valid_name(std::string_view name, bool colon_ok) {
  if (name.empty()) {
    return false;
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!is_name_char(name[i], i == 0, colon_ok)) {
      return false;
    }
  }
  return true;
}

void append_header(std::string* out, std::string_view name, std::string_view help,
                   std::string_view type) {
  out->append("# HELP ").append(name).append(" ").append(escape_help(help)).append("\n");
  out->append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void append_generic_labels(std::string* out, const Labels& labels) {
  if (labels.empty()) {
    return;
  }
  out->push_back('{');
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) {
      out->push_back(',');
    }
    out->append(labels[i].first).append("=\"").append(escape_label_value(labels[i].second));
    out->push_back('"');
  }
  out->push_back('}');
}

}  // namespace

std::string_view to_string(Reporter v) { return v == Reporter::kSource ? "source" : "destination"; }

std::string_view to_string(RequestProtocol v) {
  return v == RequestProtocol::kTcp ? "tcp" : "http";
}

std::string_view to_string(SecurityPolicy v) {
  return v == SecurityPolicy::kMutualTls ? "mutual_tls" : "unknown";
}

std::string_view to_string(ResponseFlags v) {
  switch (v) {
    case ResponseFlags::kNone:
      return "-";
    case ResponseFlags::kAuthorizationPolicyDenied:
      return "DENY";
    case ResponseFlags::kConnectionFailure:
      return "CONNECT";
    case ResponseFlags::kTlsFailure:
      return "TLS_FAILURE";
    case ResponseFlags::kHttp2HandshakeFailure:
      return "H2_HANDSHAKE_FAILURE";
    case ResponseFlags::kNetworkPolicyError:
      return "NETWORK_POLICY";
    case ResponseFlags::kIdentityError:
      return "IDENTITY_ERROR";
    case ResponseFlags::kCertificateRevoked:
      return "CERT_REVOKED";
  }
  return "-";
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string escape_help(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

bool is_valid_metric_name(std::string_view name) { return valid_name(name, true); }

bool is_valid_label_name(std::string_view name) {
  return valid_name(name, false) && !name.starts_with("__");
}

// --- ConnectionMetrics ---

ConnectionMetrics::ConnectionMetrics(ConnectionMetrics&& other) noexcept
    : family_(std::move(other.family_)),
      series_(std::exchange(other.series_, nullptr)),
      received_(other.received_.load(std::memory_order_relaxed)),
      sent_(other.sent_.load(std::memory_order_relaxed)),
      state_(other.state_.exchange(0, std::memory_order_relaxed)) {}

ConnectionMetrics& ConnectionMetrics::operator=(ConnectionMetrics&& other) noexcept {
  if (this == &other) {
    return *this;
  }
  if (state_.load(std::memory_order_relaxed) == kOpened) {
    closed();
  }
  family_ = std::move(other.family_);
  series_ = std::exchange(other.series_, nullptr);
  received_.store(other.received_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  sent_.store(other.sent_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  state_.store(other.state_.exchange(0, std::memory_order_relaxed), std::memory_order_relaxed);
  return *this;
}

ConnectionMetrics::~ConnectionMetrics() {
  if (state_.load(std::memory_order_relaxed) == kOpened) {
    closed();
  }
}

void ConnectionMetrics::opened() {
  if (series_ == nullptr) {
    return;
  }
  if ((state_.fetch_or(kOpened, std::memory_order_relaxed) & kOpened) == 0) {
    series_->opened.inc();
  }
}

void ConnectionMetrics::closed(ResponseFlags flags) {
  if (series_ == nullptr) {
    return;
  }
  if ((state_.fetch_or(kClosed, std::memory_order_relaxed) & kClosed) != 0) {
    return;
  }
  detail::TcpSeries* target = series_;
  if (flags != series_->labels->response_flags) {
    TrafficLabels labels = *series_->labels;
    labels.response_flags = flags;
    target = family_->get(labels);
  }
  target->closed.inc();
}

// --- Registry ---

Registry::Registry() : tcp_(std::make_shared<detail::TcpFamily>()) {}
Registry::~Registry() = default;

ConnectionMetrics Registry::connection(const TrafficLabels& labels) {
  return ConnectionMetrics(tcp_, tcp_->get(labels));
}

Registry::TcpValues Registry::tcp_values(const TrafficLabels& labels) const {
  TcpValues v;
  if (const detail::TcpSeries* s = tcp_->find(labels)) {
    v.opened = s->opened.value();
    v.closed = s->closed.value();
    v.received_bytes = s->received_bytes.value();
    v.sent_bytes = s->sent_bytes.value();
  }
  return v;
}

Registry::Family& Registry::family_locked(std::string_view name, std::string_view help, Kind kind,
                                          const Labels& sorted_labels) {
  auto it = families_.find(name);
  if (it == families_.end()) {
    if (!is_valid_metric_name(name)) {
      throw std::invalid_argument("invalid metric name: " + std::string(name));
    }
    for (const auto& m : kTcpMetrics) {
      if (m.name == name) {
        throw std::invalid_argument("reserved metric name: " + std::string(name));
      }
    }
    Family f{kind, std::string(help), {}, {}, {}};
    for (const auto& [label, _] : sorted_labels) {
      f.label_names.push_back(label);
    }
    it = families_.emplace(std::string(name), std::move(f)).first;
  }
  Family& f = it->second;
  if (f.kind != kind) {
    throw std::invalid_argument("metric registered with another type: " + std::string(name));
  }
  bool same_names = f.label_names.size() == sorted_labels.size() &&
                    std::equal(f.label_names.begin(), f.label_names.end(), sorted_labels.begin(),
                               [](const std::string& n, const auto& l) { return n == l.first; });
  if (!same_names) {
    throw std::invalid_argument("metric registered with other label names: " + std::string(name));
  }
  return f;
}

namespace {

Labels canonical_labels(const Labels& labels) {
  Labels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (!is_valid_label_name(sorted[i].first)) {
      throw std::invalid_argument("invalid label name: " + sorted[i].first);
    }
    if (i > 0 && sorted[i].first == sorted[i - 1].first) {
      throw std::invalid_argument("repeated label name: " + sorted[i].first);
    }
  }
  return sorted;
}

}  // namespace

Counter& Registry::counter(std::string_view name, std::string_view help, const Labels& labels) {
  Labels key = canonical_labels(labels);
  std::lock_guard lock(mu_);
  Family& f = family_locked(name, help, Kind::kCounter, key);
  auto& slot = f.counters[std::move(key)];
  if (!slot) {
    slot = std::make_unique<Counter>();
  }
  return *slot;
}

Gauge& Registry::gauge(std::string_view name, std::string_view help, const Labels& labels) {
  Labels key = canonical_labels(labels);
  std::lock_guard lock(mu_);
  Family& f = family_locked(name, help, Kind::kGauge, key);
  auto& slot = f.gauges[std::move(key)];
  if (!slot) {
    slot = std::make_unique<Gauge>();
  }
  return *slot;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void Histogram::observe(double v) {
  size_t i =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

uint64_t Histogram::cumulative(size_t i) const {
  uint64_t n = 0;
  for (size_t b = 0; b <= i && b <= bounds_.size(); ++b) {
    n += buckets_[b].load(std::memory_order_relaxed);
  }
  return n;
}

Histogram& Registry::histogram(std::string_view name, std::string_view help,
                               const std::vector<double>& bounds, const Labels& labels) {
  Labels key = canonical_labels(labels);
  for (const auto& [label, _] : key) {
    if (label == "le") throw std::invalid_argument("histogram label 'le' is reserved");
  }
  if (!std::is_sorted(bounds.begin(), bounds.end())) {
    throw std::invalid_argument("histogram bounds are not ascending: " + std::string(name));
  }
  std::lock_guard lock(mu_);
  Family& f = family_locked(name, help, Kind::kHistogram, key);
  if (f.bounds.empty()) f.bounds = bounds;
  auto& slot = f.histograms[std::move(key)];
  if (!slot) {
    slot = std::make_unique<Histogram>(f.bounds);
  }
  return *slot;
}

namespace {
std::string format_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
}  // namespace

std::string Registry::render() const {
  std::string out;
  std::vector<const detail::TcpSeries*> tcp = tcp_->all();
  if (!tcp.empty()) {
    for (const TcpMetric& m : kTcpMetrics) {
      append_header(&out, m.name, m.help, "counter");
      for (const detail::TcpSeries* s : tcp) {
        out.append(m.name).append(s->label_text).append(" ");
        out.append(std::to_string((s->*m.counter).value())).append("\n");
      }
    }
  }
  std::lock_guard lock(mu_);
  for (const auto& [name, f] : families_) {
    append_header(&out, name, f.help,
                  f.kind == Kind::kCounter ? "counter"
                  : f.kind == Kind::kGauge ? "gauge"
                                           : "histogram");
    if (f.kind == Kind::kHistogram) {
      for (const auto& [labels, h] : f.histograms) {
        for (size_t i = 0; i <= h->bounds().size(); ++i) {
          Labels with_le = labels;
          with_le.emplace_back("le",
                               i < h->bounds().size() ? format_double(h->bounds()[i]) : "+Inf");
          out.append(name).append("_bucket");
          append_generic_labels(&out, with_le);
          out.append(" ").append(std::to_string(h->cumulative(i))).append("\n");
        }
        out.append(name).append("_sum");
        append_generic_labels(&out, labels);
        out.append(" ").append(format_double(h->sum())).append("\n");
        out.append(name).append("_count");
        append_generic_labels(&out, labels);
        out.append(" ").append(std::to_string(h->count())).append("\n");
      }
    } else if (f.kind == Kind::kCounter) {
      for (const auto& [labels, c] : f.counters) {
        out.append(name);
        append_generic_labels(&out, labels);
        out.append(" ").append(std::to_string(c->value())).append("\n");
      }
    } else {
      for (const auto& [labels, g] : f.gauges) {
        out.append(name);
        append_generic_labels(&out, labels);
        out.append(" ").append(std::to_string(g->value())).append("\n");
      }
    }
  }
  return out;
}

Registry& default_registry() {
  static Registry registry;
  return registry;
}

}  // namespace sockmesh::observe
