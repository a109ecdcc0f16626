#pragma once
// An immutable view of the mesh with lookup indexes. Readers hold a shared_ptr for as long as they
// need a consistent view; writers build a new Snapshot and swap it in (StateStore).
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "state/model.h"

namespace sockmesh::state {

class Snapshot {
 public:
  Snapshot() = default;
  Snapshot(std::vector<Workload> workloads, std::vector<Service> services,
           std::vector<Policy> policies, std::vector<Namespace> namespaces = {});

  const std::vector<Workload>& workloads() const { return workloads_; }
  const std::vector<Service>& services() const { return services_; }
  const std::vector<Policy>& policies() const { return policies_; }
  const std::vector<Namespace>& namespaces() const { return namespaces_; }

  const Workload* workload_by_ip(const IpAddress& ip) const;
  const Workload* workload_by_uid(const std::string& uid) const;
  const Service* service_by_vip(const IpAddress& ip) const;
  const Service* service_by_key(const std::string& ns_slash_hostname) const;
  const Namespace* namespace_by_name(const std::string& name) const;
  // Workloads that back a service ("ns/hostname"), in configuration order.
  std::vector<const Workload*> endpoints_of(const Service& service) const;
  // Policies that apply to a workload: Global ones, its namespace's, and those that select it.
  std::vector<const Policy*> policies_for(const Workload& workload) const;

 private:
  std::vector<Workload> workloads_;
  std::vector<Service> services_;
  std::vector<Policy> policies_;
  std::vector<Namespace> namespaces_;
  std::unordered_map<IpAddress, size_t> workload_by_ip_;
  std::unordered_map<std::string, size_t> workload_by_uid_;
  std::unordered_map<IpAddress, size_t> service_by_vip_;
  std::unordered_map<std::string, size_t> service_by_key_;
  std::unordered_map<std::string, std::vector<size_t>> endpoints_by_service_;
};

using SnapshotPtr = std::shared_ptr<const Snapshot>;

}  // namespace sockmesh::state
