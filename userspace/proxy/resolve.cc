#include "proxy/resolve.h"

#include <unordered_map>

namespace sockmesh::proxy {
namespace {

// Round robin per service and per worker thread: no lock, and each worker still spreads its
// connections evenly over the endpoints.
uint64_t next_turn(const std::string& service_key) {
  thread_local std::unordered_map<std::string, uint64_t> turns;
  return turns[service_key]++;
}

std::optional<IpAddress> address_like(const state::Workload& w, const IpAddress& want_family) {
  for (const auto& ip : w.ips) {
    if (ip.is_v4() == want_family.is_v4()) return ip;
  }
  return std::nullopt;
}

}  // namespace

Route resolve(const state::Snapshot& snap, const Endpoint& dst) {
  Route r;
  if (const state::Service* svc = snap.service_by_vip(dst.ip)) {
    r.service = svc;
    auto port_it = svc->ports.find(dst.port);
    if (port_it == svc->ports.end()) {
      r.error = "service " + svc->hostname + " has no port " + std::to_string(dst.port);
      return r;
    }
    std::vector<std::pair<const state::Workload*, IpAddress>> ready;
    for (const state::Workload* w : snap.endpoints_of(*svc)) {
      if (auto ip = address_like(*w, dst.ip)) ready.emplace_back(w, *ip);
    }
    if (ready.empty()) {
      r.error = "service " + svc->hostname + " has no endpoints";
      return r;
    }
    auto n = next_turn(svc->key());
    auto& [w, ip] = ready[n % ready.size()];
    uint16_t target_port = port_it->second == 0 ? dst.port : port_it->second;
    // The workload's own port map for this service wins over the service's.
    auto ws = w->services.find(svc->key());
    if (ws != w->services.end()) {
      auto p = ws->second.find(dst.port);
      if (p != ws->second.end() && p->second != 0) target_port = p->second;
    }
    r.workload = w;
    r.target = Endpoint{ip, target_port};
    return r;
  }
  r.workload = snap.workload_by_ip(dst.ip);
  r.target = dst;
  return r;
}

}  // namespace sockmesh::proxy
