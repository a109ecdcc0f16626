#include "loader/attach/skeleton.h"

#include <cstdarg>
#include <cstdio>
#include <deque>
#include <mutex>

#include "base/log.h"

namespace sockmesh::loader {
namespace {

std::mutex g_mu;
std::deque<std::string> g_warnings;  // the last few, for error messages

int on_libbpf_message(libbpf_print_level level, const char* format, va_list args) {
  char buf[2048];
  int n = vsnprintf(buf, sizeof(buf), format, args);
  if (n <= 0) return 0;
  std::string line(buf, std::min<size_t>(static_cast<size_t>(n), sizeof(buf) - 1));
  while (!line.empty() && line.back() == '\n') line.pop_back();
  // libbpf also warns about expected outcomes (an existing clsact qdisc); callers report real
  // failures themselves, so its messages are debug output here.
  SM_DEBUG("libbpf") << line;
  if (level == LIBBPF_WARN) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_warnings.push_back(std::move(line));
    if (g_warnings.size() > 3) g_warnings.pop_front();
  }
  return 0;
}

}  // namespace

void route_libbpf_logs() {
  static std::once_flag once;
  std::call_once(once, [] { libbpf_set_print(on_libbpf_message); });
}

std::string last_libbpf_warning() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::string out;
  for (const auto& w : g_warnings) out += (out.empty() ? "" : " | ") + w;
  return out;
}

}  // namespace sockmesh::loader
