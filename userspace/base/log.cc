#include "base/log.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>

namespace sockmesh::log {
namespace {

struct Registry {
  std::mutex mu;
  Level default_level = Level::kInfo;
  std::map<std::string, Level, std::less<>> scopes;
  // Lowest level enabled anywhere: lets enabled() skip the lock for disabled lines.
  std::atomic<int> floor{static_cast<int>(Level::kInfo)};

  void recompute_floor() {
    int f = static_cast<int>(default_level);
    for (auto& [_, l] : scopes) f = std::min(f, static_cast<int>(l));
    floor.store(f, std::memory_order_relaxed);
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::string_view level_name(Level level) {
  switch (level) {
    case Level::kTrace:
      return "trace";
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
    case Level::kOff:
      return "off";
  }
  return "?";
}

bool parse_level(std::string_view text, Level* out) {
  for (int i = 0; i <= static_cast<int>(Level::kOff); ++i) {
    if (level_name(static_cast<Level>(i)) == text) {
      *out = static_cast<Level>(i);
      return true;
    }
  }
  return false;
}

void set_level(Level level) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.default_level = level;
  r.scopes.clear();
  r.recompute_floor();
}

const std::vector<std::string_view>& known_scopes() {
  // Every scope literal in userspace/, loader/ and cni/ (tests/userspace/base/log_test.cc checks
  // the tree against this list), plus "tls" for the TLS layer.
  static const std::vector<std::string_view> scopes = {
      "access",  "admin", "agent",  "config", "dns",    "h2",   "identity", "inbound",
      "install", "kube",  "libbpf", "loader", "main",   "maps", "net",      "outbound",
      "policy",  "pool",  "proxy",  "rbac",   "socks5", "tls",  "xds",      "zds"};
  return scopes;
}

bool is_known_scope(std::string_view scope) {
  const auto& k = known_scopes();
  return std::binary_search(k.begin(), k.end(), scope);
}

bool set_level(std::string_view scope, Level level) {
  if (!is_known_scope(scope)) return false;
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.scopes[std::string(scope)] = level;
  r.recompute_floor();
  return true;
}

Level level_of(std::string_view scope) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.scopes.find(scope);
  return it == r.scopes.end() ? r.default_level : it->second;
}

std::string describe_levels() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::string out = "default=" + std::string(level_name(r.default_level));
  for (auto& [s, l] : r.scopes) out += "," + s + "=" + std::string(level_name(l));
  return out;
}

bool enabled(std::string_view scope, Level level) {
  if (static_cast<int>(level) < registry().floor.load(std::memory_order_relaxed)) return false;
  return static_cast<int>(level) >= static_cast<int>(level_of(scope));
}

void write(std::string_view scope, Level level, std::string_view message) {
  auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::system_clock::to_time_t(now);
  auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char ts[80];
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long>(micros));
  std::string line;
  line.reserve(message.size() + 64);
  line.append(ts).append(" ").append(level_name(level)).append(" ").append(scope).append(" ");
  line.append(message).append("\n");
  // One write(2) per line keeps lines whole when several threads log at once.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace sockmesh::log
