#include "dns/names.h"

#include <algorithm>

#include "dns/message.h"

namespace sockmesh::dns {

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  while (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

NameTable::NameTable(const state::Snapshot& snapshot, std::string cluster_domain)
    : cluster_domain_(to_lower(cluster_domain)) {
  auto add = [this](const std::string& host, const IpAddress& ip) {
    if (host.empty()) return;
    auto& v = names_[to_lower(host)];
    if (std::find(v.begin(), v.end(), ip) == v.end()) v.push_back(ip);
  };
  for (const auto& s : snapshot.services()) {
    if (s.hostname.empty()) continue;
    names_.try_emplace(to_lower(s.hostname));  // known even without VIPs (headless)
    for (const auto& vip : s.vips) add(s.hostname, vip.ip);
  }
  for (const auto& w : snapshot.workloads()) {
    if (w.hostname.empty()) continue;
    names_.try_emplace(to_lower(w.hostname));
    for (const auto& ip : w.ips) add(w.hostname, ip);
  }
}

NameAnswer NameTable::lookup(std::string_view name, uint16_t type,
                             std::string_view client_namespace) const {
  // The search path of a pod in namespace N: N.svc.<domain>, svc.<domain>, <domain>.
  std::vector<std::string> candidates{std::string(name)};
  if (!name.empty()) {
    const std::string n(name);
    if (!client_namespace.empty()) {
      candidates.push_back(n + "." + std::string(client_namespace) + ".svc." + cluster_domain_);
    }
    candidates.push_back(n + ".svc." + cluster_domain_);
    candidates.push_back(n + "." + cluster_domain_);
  }
  for (const auto& c : candidates) {
    auto it = names_.find(c);
    if (it == names_.end()) continue;
    NameAnswer a{true, c, {}};
    for (const auto& ip : it->second) {
      if ((type == kTypeA && ip.is_v4()) || (type == kTypeAAAA && !ip.is_v4())) {
        a.addresses.push_back(ip);
      }
    }
    return a;
  }
  return {};
}

}  // namespace sockmesh::dns
