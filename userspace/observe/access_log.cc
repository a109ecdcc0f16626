#include "observe/access_log.h"

#include "base/log.h"

namespace sockmesh::observe {
namespace {

void field(std::string& out, const char* key, const std::string& value) {
  if (value.empty()) return;
  out.append(" ").append(key).append("=");
  bool quote = value.find_first_of(" \"=") != std::string::npos;
  if (!quote) {
    out.append(value);
    return;
  }
  out.push_back('"');
  for (char c : value) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
}

}  // namespace

std::string format_access(const AccessRecord& r) {
  std::string out = r.error.empty() ? "connection complete" : "connection failed";
  field(out, "src.addr", r.src_addr);
  field(out, "src.workload", r.src_workload);
  field(out, "src.namespace", r.src_namespace);
  field(out, "src.identity", r.src_identity);
  field(out, "dst.addr", r.dst_addr);
  field(out, "dst.hbone_addr", r.dst_hbone_addr);
  field(out, "dst.service", r.dst_service);
  field(out, "dst.workload", r.dst_workload);
  field(out, "dst.namespace", r.dst_namespace);
  field(out, "dst.identity", r.dst_identity);
  field(out, "direction", r.direction);
  field(out, "path", r.path);
  out.append(" bytes_sent=").append(std::to_string(r.bytes_sent));
  out.append(" bytes_recv=").append(std::to_string(r.bytes_recv));
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - r.started)
                .count();
  out.append(" duration=").append(std::to_string(ms)).append("ms");
  field(out, "error", r.error);
  return out;
}

void log_access(const AccessRecord& r) {
  if (r.error.empty()) {
    SM_INFO("access") << format_access(r);
  } else {
    SM_WARN("access") << format_access(r);
  }
}

}  // namespace sockmesh::observe
