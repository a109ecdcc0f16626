#include "state/snapshot.h"

#include <algorithm>

namespace sockmesh::state {

std::string Workload::identity() const {
  return "spiffe://" + trust_domain + "/ns/" + namespace_name + "/sa/" + service_account;
}

Snapshot::Snapshot(std::vector<Workload> workloads, std::vector<Service> services,
                   std::vector<Policy> policies, std::vector<Namespace> namespaces)
    : workloads_(std::move(workloads)),
      services_(std::move(services)),
      policies_(std::move(policies)),
      namespaces_(std::move(namespaces)) {
  for (size_t i = 0; i < workloads_.size(); ++i) {
    for (const auto& ip : workloads_[i].ips) workload_by_ip_.emplace(ip, i);
    workload_by_uid_.emplace(workloads_[i].uid, i);
    for (const auto& [svc, _] : workloads_[i].services) endpoints_by_service_[svc].push_back(i);
  }
  for (size_t i = 0; i < services_.size(); ++i) {
    for (const auto& vip : services_[i].vips) service_by_vip_.emplace(vip.ip, i);
    service_by_key_.emplace(services_[i].key(), i);
  }
}

const Workload* Snapshot::workload_by_ip(const IpAddress& ip) const {
  auto it = workload_by_ip_.find(ip);
  return it == workload_by_ip_.end() ? nullptr : &workloads_[it->second];
}

const Workload* Snapshot::workload_by_uid(const std::string& uid) const {
  auto it = workload_by_uid_.find(uid);
  return it == workload_by_uid_.end() ? nullptr : &workloads_[it->second];
}

const Service* Snapshot::service_by_vip(const IpAddress& ip) const {
  auto it = service_by_vip_.find(ip);
  return it == service_by_vip_.end() ? nullptr : &services_[it->second];
}

const Service* Snapshot::service_by_key(const std::string& key) const {
  auto it = service_by_key_.find(key);
  return it == service_by_key_.end() ? nullptr : &services_[it->second];
}

const Namespace* Snapshot::namespace_by_name(const std::string& name) const {
  auto it = std::find_if(namespaces_.begin(), namespaces_.end(),
                         [&](const Namespace& n) { return n.name == name; });
  return it == namespaces_.end() ? nullptr : &*it;
}

std::vector<const Workload*> Snapshot::endpoints_of(const Service& service) const {
  std::vector<const Workload*> out;
  auto it = endpoints_by_service_.find(service.key());
  if (it == endpoints_by_service_.end()) return out;
  for (size_t i : it->second) out.push_back(&workloads_[i]);
  return out;
}

std::vector<const Policy*> Snapshot::policies_for(const Workload& workload) const {
  std::vector<const Policy*> out;
  for (const auto& p : policies_) {
    switch (p.scope) {
      case PolicyScope::kGlobal:
        out.push_back(&p);
        break;
      case PolicyScope::kNamespace:
        if (p.namespace_name == workload.namespace_name) out.push_back(&p);
        break;
      case PolicyScope::kWorkloadSelector:
        if (std::find(workload.authorization_policies.begin(),
                      workload.authorization_policies.end(),
                      p.key()) != workload.authorization_policies.end()) {
          out.push_back(&p);
        }
        break;
    }
  }
  return out;
}

}  // namespace sockmesh::state
