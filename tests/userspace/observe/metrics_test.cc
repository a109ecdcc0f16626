#include "observe/metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace sockmesh::observe {
namespace {

// --- A small reader for the text exposition format, used to check our own output. ---

struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // unescaped values
  std::string value;
};

// Parses one sample line strictly; nullopt if it does not follow the grammar
//   name [ "{" label="value" { "," label="value" } [","] "}" ] " " value [ " " timestamp ]
std::optional<Sample> parse_sample(const std::string& line) {
  static const std::regex kName("[a-zA-Z_:][a-zA-Z0-9_:]*");
  static const std::regex kLabel("[a-zA-Z_][a-zA-Z0-9_]*");
  static const std::regex kValue(
      "[+-]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]Inf|NaN");
  static const std::regex kTimestamp("-?[0-9]+");
  Sample s;
  size_t i = 0;
  auto take_while = [&](auto pred) {
    size_t start = i;
    while (i < line.size() && pred(line[i])) {
      ++i;
    }
    return line.substr(start, i - start);
  };
  s.name = take_while([](char c) { return c != '{' && c != ' '; });
  if (!std::regex_match(s.name, kName)) {
    return std::nullopt;
  }
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      std::string label = take_while([](char c) { return c != '='; });
      if (!std::regex_match(label, kLabel)) {
        return std::nullopt;
      }
      if (line.compare(i, 2, "=\"") != 0) {
        return std::nullopt;
      }
      i += 2;
      std::string value;
      for (;;) {
        if (i >= line.size()) {
          return std::nullopt;
        }
        char c = line[i++];
        if (c == '"') {
          break;
        }
        if (c == '\n') {
          return std::nullopt;
        }
        if (c == '\\') {
          if (i >= line.size()) {
            return std::nullopt;
          }
          char e = line[i++];
          if (e == 'n') {
            value += '\n';
          } else if (e == '\\' || e == '"') {
            value += e;
          } else {
            return std::nullopt;
          }
        } else {
          value += c;
        }
      }
      s.labels.emplace_back(label, value);
      if (i < line.size() && line[i] == ',') {
        ++i;
      }
    }
    if (i >= line.size()) {
      return std::nullopt;
    }
    ++i;  // '}'
  }
  if (i >= line.size() || line[i] != ' ') {
    return std::nullopt;
  }
  ++i;
  std::string rest = line.substr(i);
  auto space = rest.find(' ');
  s.value = rest.substr(0, space);
  if (!std::regex_match(s.value, kValue)) {
    return std::nullopt;
  }
  if (space != std::string::npos && !std::regex_match(rest.substr(space + 1), kTimestamp)) {
    return std::nullopt;
  }
  return s;
}

// Checks a whole exposition: every line is HELP, TYPE or a sample; HELP/TYPE appear at most once
// per name and before that name's samples; samples of a name are contiguous; label names do not
// repeat within a sample. Returns the samples; adds a test failure per bad line.
std::vector<Sample> check_exposition(const std::string& text) {
  static const std::regex kHelp("# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) ((?:[^\\\\\\n]|\\\\[\\\\n])*)");
  static const std::regex kType(
      "# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)");
  std::vector<Sample> samples;
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "exposition must end with a newline";
  std::set<std::string> helped, typed, finished;
  std::string current;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::smatch m;
    if (std::regex_match(line, m, kHelp)) {
      EXPECT_TRUE(helped.insert(m[1]).second) << "line " << n << ": second HELP";
      EXPECT_EQ(typed.count(m[1]), 0u) << "line " << n << ": HELP after TYPE";
      continue;
    }
    if (std::regex_match(line, m, kType)) {
      EXPECT_TRUE(typed.insert(m[1]).second) << "line " << n << ": second TYPE";
      continue;
    }
    auto s = parse_sample(line);
    if (!s) {
      ADD_FAILURE() << "line " << n << " is not valid exposition format: " << line;
      continue;
    }
    EXPECT_EQ(typed.count(s->name), 1u) << "line " << n << ": sample before its TYPE";
    if (s->name != current) {
      if (!current.empty()) {
        finished.insert(current);
      }
      EXPECT_EQ(finished.count(s->name), 0u) << "line " << n << ": samples not grouped";
      current = s->name;
    }
    std::set<std::string> names;
    for (const auto& [label, _] : s->labels) {
      EXPECT_TRUE(names.insert(label).second) << "line " << n << ": repeated label " << label;
    }
    samples.push_back(std::move(*s));
  }
  return samples;
}

TrafficLabels example_labels() {
  TrafficLabels l;
  l.reporter = Reporter::kDestination;
  l.source_workload = "sleep";
  l.source_canonical_service = "sleep";
  l.source_canonical_revision = "v1";
  l.source_workload_namespace = "client";
  l.source_principal = "spiffe://cluster.local/ns/client/sa/sleep";
  l.source_app = "sleep";
  l.source_version = "v1";
  l.source_cluster = "Kubernetes";
  l.destination_service = "echo.server.svc.cluster.local";
  l.destination_service_namespace = "server";
  l.destination_service_name = "echo";
  l.destination_workload = "echo";
  l.destination_canonical_service = "echo";
  // destination_canonical_revision left empty: renders as "unknown"
  l.destination_workload_namespace = "server";
  l.destination_principal = "spiffe://cluster.local/ns/server/sa/echo";
  l.destination_app = "echo";
  l.destination_cluster = "Kubernetes";
  l.connection_security_policy = SecurityPolicy::kMutualTls;
  return l;
}

TEST(Metrics, RenderExactSmallCase) {
  Registry r;
  {
    ConnectionMetrics c = r.connection(example_labels());
    c.opened();
    c.add_received(100);
    c.add_sent(42);
    c.add_sent(8);
    EXPECT_EQ(c.received_bytes(), 100u);
    EXPECT_EQ(c.sent_bytes(), 50u);
    c.closed();
  }
  r.counter("sockmesh_tls_handshake_failures_total", "TLS handshakes that failed.",
            {{"reason", "bad_certificate"}})
      .inc(2);
  r.gauge("sockmesh_hbone_connections_active", "Open HBONE connections.").set(3);

  const std::string labels =
      "{reporter=\"destination\",source_workload=\"sleep\",source_canonical_service=\"sleep\","
      "source_canonical_revision=\"v1\",source_workload_namespace=\"client\","
      "source_principal=\"spiffe://cluster.local/ns/client/sa/sleep\",source_app=\"sleep\","
      "source_version=\"v1\",source_cluster=\"Kubernetes\","
      "destination_service=\"echo.server.svc.cluster.local\","
      "destination_service_namespace=\"server\",destination_service_name=\"echo\","
      "destination_workload=\"echo\",destination_canonical_service=\"echo\","
      "destination_canonical_revision=\"unknown\",destination_workload_namespace=\"server\","
      "destination_principal=\"spiffe://cluster.local/ns/server/sa/echo\","
      "destination_app=\"echo\",destination_version=\"unknown\","
      "destination_cluster=\"Kubernetes\",request_protocol=\"tcp\",response_flags=\"-\","
      "connection_security_policy=\"mutual_tls\"}";
  std::string expected;
  for (const std::string& line : {
           std::string("# HELP istio_tcp_connections_opened_total Total TCP connections opened."),
           std::string("# TYPE istio_tcp_connections_opened_total counter"),
           "istio_tcp_connections_opened_total" + labels + " 1",
           std::string("# HELP istio_tcp_connections_closed_total Total TCP connections closed."),
           std::string("# TYPE istio_tcp_connections_closed_total counter"),
           "istio_tcp_connections_closed_total" + labels + " 1",
           std::string("# HELP istio_tcp_received_bytes_total Total bytes received from the "
                       "connection's originator (request direction)."),
           std::string("# TYPE istio_tcp_received_bytes_total counter"),
           "istio_tcp_received_bytes_total" + labels + " 100",
           std::string("# HELP istio_tcp_sent_bytes_total Total bytes sent back to the "
                       "connection's originator (response direction)."),
           std::string("# TYPE istio_tcp_sent_bytes_total counter"),
           "istio_tcp_sent_bytes_total" + labels + " 50",
           std::string("# HELP sockmesh_hbone_connections_active Open HBONE connections."),
           std::string("# TYPE sockmesh_hbone_connections_active gauge"),
           std::string("sockmesh_hbone_connections_active 3"),
           std::string("# HELP sockmesh_tls_handshake_failures_total TLS handshakes that failed."),
           std::string("# TYPE sockmesh_tls_handshake_failures_total counter"),
           std::string("sockmesh_tls_handshake_failures_total{reason=\"bad_certificate\"} 2"),
       }) {
    expected += line + "\n";
  }
  std::string text = r.render();
  EXPECT_EQ(text, expected);
  auto samples = check_exposition(text);
  ASSERT_EQ(samples.size(), 6u);
  EXPECT_EQ(samples[0].labels.size(), 23u);
}

TEST(Metrics, EmptyRegistryRendersNothing) {
  Registry r;
  EXPECT_EQ(r.render(), "");
}

TEST(Metrics, AbsentValuesRenderUnknown) {
  Registry r;
  TrafficLabels empty;
  r.connection(empty).opened();
  auto samples = check_exposition(r.render());
  ASSERT_FALSE(samples.empty());
  std::map<std::string, std::string> got(samples[0].labels.begin(), samples[0].labels.end());
  EXPECT_EQ(got.at("reporter"), "source");
  EXPECT_EQ(got.at("source_principal"), "unknown");
  EXPECT_EQ(got.at("destination_service"), "unknown");
  EXPECT_EQ(got.at("request_protocol"), "tcp");
  EXPECT_EQ(got.at("response_flags"), "-");
  EXPECT_EQ(got.at("connection_security_policy"), "unknown");
}

TEST(Metrics, LabelEscaping) {
  EXPECT_EQ(escape_label_value("plain"), "plain");
  EXPECT_EQ(escape_label_value("a\\b"), "a\\\\b");
  EXPECT_EQ(escape_label_value("say \"hi\""), "say \\\"hi\\\"");
  EXPECT_EQ(escape_label_value("two\nlines"), "two\\nlines");
  EXPECT_EQ(escape_help("back\\slash \"quoted\"\nnext"), "back\\\\slash \"quoted\"\\nnext");

  Registry r;
  const std::string nasty = "C:\\path \"x\"\nend";
  r.counter("sockmesh_test_total", "Help with \\ and\nnewline.", {{"reason", nasty}}).inc();
  TrafficLabels l;
  l.source_workload = nasty;
  r.connection(l).opened();
  std::string text = r.render();
  EXPECT_NE(text.find("{reason=\"C:\\\\path \\\"x\\\"\\nend\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# HELP sockmesh_test_total Help with \\\\ and\\nnewline.\n"),
            std::string::npos);
  // Round trip: parsing the output gives back the original values.
  int seen = 0;
  for (const Sample& s : check_exposition(text)) {
    for (const auto& [name, value] : s.labels) {
      if (name == "reason" || name == "source_workload") {
        EXPECT_EQ(value, nasty) << s.name;
        ++seen;
      }
    }
  }
  EXPECT_EQ(seen, 5);  // four TCP series + the counter
}

TEST(Metrics, CloseWithFailureFlagUsesItsOwnSeries) {
  Registry r;
  TrafficLabels l = example_labels();
  {
    ConnectionMetrics c = r.connection(l);
    c.opened();
    c.add_received(10);
    c.closed(ResponseFlags::kAuthorizationPolicyDenied);
    c.closed();  // second close is ignored
  }
  EXPECT_EQ(r.tcp_values(l).opened, 1u);
  EXPECT_EQ(r.tcp_values(l).closed, 0u);
  EXPECT_EQ(r.tcp_values(l).received_bytes, 10u);
  TrafficLabels denied = l;
  denied.response_flags = ResponseFlags::kAuthorizationPolicyDenied;
  EXPECT_EQ(r.tcp_values(denied).closed, 1u);
  EXPECT_EQ(r.tcp_values(denied).opened, 0u);
  EXPECT_NE(r.render().find("response_flags=\"DENY\""), std::string::npos);
}

TEST(Metrics, DestructorClosesOpenedConnectionOnce) {
  Registry r;
  TrafficLabels l;
  {
    ConnectionMetrics c = r.connection(l);
    c.opened();
    c.opened();  // counted once
  }
  { ConnectionMetrics never_opened = r.connection(l); }
  EXPECT_EQ(r.tcp_values(l).opened, 1u);
  EXPECT_EQ(r.tcp_values(l).closed, 1u);
}

TEST(Metrics, HandleMoves) {
  Registry r;
  TrafficLabels l;
  ConnectionMetrics a = r.connection(l);
  a.opened();
  a.add_sent(5);
  ConnectionMetrics b(std::move(a));
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from handle is inert by contract
  ASSERT_TRUE(b);
  EXPECT_EQ(b.sent_bytes(), 5u);
  b.add_sent(1);
  ConnectionMetrics c;
  EXPECT_EQ(c.labels(), nullptr);
  c.add_sent(1000);  // inert handle: only its own total
  c = std::move(b);
  EXPECT_EQ(c.sent_bytes(), 6u);
  EXPECT_EQ(r.tcp_values(l).opened, 1u);
  EXPECT_EQ(r.tcp_values(l).closed, 0u);
  c = ConnectionMetrics();  // replacing an opened handle closes it
  EXPECT_EQ(r.tcp_values(l).closed, 1u);
  EXPECT_EQ(r.tcp_values(l).sent_bytes, 6u);
}

TEST(Metrics, ConcurrentUpdatesSum) {
  Registry r;
  TrafficLabels l = example_labels();
  constexpr int kThreads = 8;
  constexpr int kIterations = 100000;
  ConnectionMetrics shared = r.connection(l);
  Counter& failures =
      r.counter("sockmesh_tls_handshake_failures_total", "TLS failures.", {{"reason", "timeout"}});
  Gauge& active = r.gauge("sockmesh_hbone_connections_active", "Open HBONE connections.");
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread has its own connection on the same labels, plus one handle shared by all.
      ConnectionMetrics own = r.connection(l);
      own.opened();
      for (int i = 0; i < kIterations; ++i) {
        own.add_sent(3);
        own.add_received(1);
        shared.add_received(2);
        failures.inc();
        active.inc();
        active.dec();
      }
      // Lookups and rendering may race with the hot path.
      TrafficLabels mine = l;
      mine.source_workload = "w" + std::to_string(t);
      r.connection(mine).opened();
      (void)r.render();
      EXPECT_EQ(own.sent_bytes(), 3u * kIterations);
      own.closed();
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  auto v = r.tcp_values(l);
  EXPECT_EQ(v.opened, uint64_t{kThreads});
  EXPECT_EQ(v.closed, uint64_t{kThreads});
  EXPECT_EQ(v.sent_bytes, 3u * kThreads * kIterations);
  EXPECT_EQ(v.received_bytes, 3u * kThreads * kIterations);
  EXPECT_EQ(shared.received_bytes(), 2u * kThreads * kIterations);
  EXPECT_EQ(failures.value(), uint64_t{kThreads} * kIterations);
  EXPECT_EQ(active.value(), 0);
  auto samples = check_exposition(r.render());
  // 1 + kThreads TCP series, four metrics each, plus the counter and the gauge.
  EXPECT_EQ(samples.size(), 4u * (1 + kThreads) + 2);
}

TEST(Metrics, GenericSeriesIdentityAndValidation) {
  Registry r;
  Counter& a = r.counter("sockmesh_x_total", "X.", {{"b", "2"}, {"a", "1"}});
  Counter& b = r.counter("sockmesh_x_total", "ignored", {{"a", "1"}, {"b", "2"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &r.counter("sockmesh_x_total", "X.", {{"a", "1"}, {"b", "3"}}));
  EXPECT_NE(r.render().find("sockmesh_x_total{a=\"1\",b=\"2\"} 0\n"), std::string::npos);
  Gauge& pool = r.gauge("sockmesh_pool_connections", "Pooled upstream connections.");
  EXPECT_EQ(&pool, &r.gauge("sockmesh_pool_connections", "Pooled upstream connections."));

  EXPECT_THROW(r.gauge("sockmesh_x_total", "X.", {{"a", "1"}, {"b", "2"}}), std::invalid_argument);
  EXPECT_THROW(r.counter("sockmesh_x_total", "X.", {{"a", "1"}}), std::invalid_argument);
  EXPECT_THROW(r.counter("0bad", "X."), std::invalid_argument);
  EXPECT_THROW(r.counter("bad-name", "X."), std::invalid_argument);
  EXPECT_THROW(r.counter("sockmesh_y_total", "Y.", {{"bad-label", "v"}}), std::invalid_argument);
  EXPECT_THROW(r.counter("sockmesh_y_total", "Y.", {{"__reserved", "v"}}), std::invalid_argument);
  EXPECT_THROW(r.counter("sockmesh_y_total", "Y.", {{"a", "1"}, {"a", "2"}}),
               std::invalid_argument);
  EXPECT_THROW(r.counter("istio_tcp_sent_bytes_total", "No."), std::invalid_argument);
  EXPECT_TRUE(is_valid_metric_name("ns:sub_metric_total"));
  EXPECT_FALSE(is_valid_label_name("with:colon"));
  check_exposition(r.render());
}

TEST(Metrics, ExpositionCheckerRejectsBadLines) {
  // The checker itself must catch what a broken renderer could produce.
  EXPECT_TRUE(parse_sample("m 1"));
  EXPECT_TRUE(parse_sample("m{a=\"x\\\"y\",b=\"\"} 1.5e3 1700000000"));
  EXPECT_TRUE(parse_sample("m{a=\"x\",} -Inf"));
  EXPECT_FALSE(parse_sample("m{a=\"x\"y\"} 1"));   // unescaped quote
  EXPECT_FALSE(parse_sample("m{a=\"x\\ty\"} 1"));  // unknown escape
  EXPECT_FALSE(parse_sample("m{a=\"x} 1"));        // unterminated value
  EXPECT_FALSE(parse_sample("m{1a=\"x\"} 1"));     // bad label name
  EXPECT_FALSE(parse_sample("m-x 1"));             // bad metric name
  EXPECT_FALSE(parse_sample("m one"));             // bad value
  EXPECT_FALSE(parse_sample("m  1"));              // double space
}

TEST(Metrics, DefaultRegistryIsShared) { EXPECT_EQ(&default_registry(), &default_registry()); }

}  // namespace
}  // namespace sockmesh::observe

namespace sockmesh::observe {
namespace {

TEST(MetricsHistogram, RendersCumulativeBucketsSumAndCount) {
  Registry r;
  auto& h =
      r.histogram("test_duration_seconds", "A test histogram", {0.001, 0.1, 1}, {{"kind", "x"}});
  h.observe(0.0005);
  h.observe(0.05);
  h.observe(3);
  std::string text = r.render();
  EXPECT_NE(text.find("# TYPE test_duration_seconds histogram"), std::string::npos) << text;
  EXPECT_NE(text.find("test_duration_seconds_bucket{kind=\"x\",le=\"0.001\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("test_duration_seconds_bucket{kind=\"x\",le=\"0.1\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("test_duration_seconds_bucket{kind=\"x\",le=\"+Inf\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("test_duration_seconds_count{kind=\"x\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("test_duration_seconds_sum{kind=\"x\"} 3.0505"), std::string::npos);
  EXPECT_THROW(r.counter("test_duration_seconds", "", {{"kind", "x"}}), std::invalid_argument);
  EXPECT_THROW(r.histogram("other_seconds", "", {1}, {{"le", "1"}}), std::invalid_argument);
}

}  // namespace
}  // namespace sockmesh::observe
