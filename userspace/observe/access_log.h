#pragma once
// One line per proxied connection when it ends, in the shape of ztunnel's access log:
// "connection complete src.addr=... dst.addr=... direction=... bytes_sent=... duration=..."
#include <chrono>
#include <cstdint>
#include <string>

namespace sockmesh::observe {

struct AccessRecord {
  std::string direction;  // "inbound" or "outbound"
  std::string src_addr;
  std::string src_workload;
  std::string src_namespace;
  std::string src_identity;
  std::string dst_addr;
  std::string dst_hbone_addr;  // set when the connection went through a tunnel
  // How the bytes went when it is not the usual way: "same-node" for the same-node fast path
  // (no tunnel: both ends are workloads of this proxy). Empty: not printed.
  std::string path;
  std::string dst_service;
  std::string dst_workload;
  std::string dst_namespace;
  std::string dst_identity;
  uint64_t bytes_sent = 0;  // towards the destination
  uint64_t bytes_recv = 0;  // from the destination
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::string error;  // empty on success
};

// Renders the line (exposed for tests); values with spaces or quotes are quoted.
std::string format_access(const AccessRecord& r);
void log_access(const AccessRecord& r);

}  // namespace sockmesh::observe
