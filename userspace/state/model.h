#pragma once
// The mesh as the proxy sees it: workloads, services and authorization policies. Field names follow
// ztunnel's local configuration (and its xDS Address/Authorization types) so that a control-plane
// client can fill the same structs later.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/ip_address.h"

namespace sockmesh::state {

enum class Protocol { kHbone, kTcp };

struct Workload {
  std::string uid;
  std::string name;
  std::string namespace_name;
  std::string service_account = "default";
  std::string trust_domain = "cluster.local";
  std::string node;
  std::string workload_name;       // the owning Deployment etc.; defaults to name
  std::string canonical_name;      // app label; metrics' source_canonical_service
  std::string canonical_revision;  // version label
  std::string cluster_id = "Kubernetes";
  std::string network;
  std::string hostname;  // DNS name answered with `ips` (the DNS proxy); may be empty
  std::vector<IpAddress> ips;
  Protocol protocol = Protocol::kTcp;
  // "namespace/hostname" -> {service port -> target port}
  std::map<std::string, std::map<uint16_t, uint16_t>> services;
  // Policies of scope WorkloadSelector that select this workload, as "namespace/name".
  std::vector<std::string> authorization_policies;
  // Labels of the pod, for enrollment decisions (istio.io/dataplane-mode).
  std::map<std::string, std::string> labels;

  // spiffe://<trust domain>/ns/<namespace>/sa/<service account>
  std::string identity() const;
};

struct ServiceVip {
  std::string network;  // may be empty
  IpAddress ip;
  auto operator<=>(const ServiceVip&) const = default;
};

struct Service {
  std::string name;
  std::string namespace_name;
  std::string hostname;
  std::vector<ServiceVip> vips;
  std::map<uint16_t, uint16_t> ports;  // service port -> target port
  std::vector<std::string> subject_alt_names;

  std::string key() const { return namespace_name + "/" + hostname; }
};

enum class PolicyScope { kGlobal, kNamespace, kWorkloadSelector };
enum class PolicyAction { kAllow, kDeny };

// One match: every non-empty field must match (AND); values within a field are ORed; the not_
// fields must all fail to match.
struct PolicyMatch {
  std::vector<std::string> namespaces, not_namespaces;
  std::vector<std::string> principals, not_principals;  // exact, "prefix*", "*suffix" or "*"
  std::vector<std::string> service_accounts, not_service_accounts;  // "ns/sa" or "sa"
  std::vector<IpNetwork> source_ips, not_source_ips;
  std::vector<IpNetwork> destination_ips, not_destination_ips;
  std::vector<uint16_t> destination_ports, not_destination_ports;
};

// A rule is a list of clauses that must all hold (AND); a clause holds if any match in it does.
using PolicyClause = std::vector<PolicyMatch>;
using PolicyRule = std::vector<PolicyClause>;

struct Policy {
  std::string name;
  std::string namespace_name;
  PolicyScope scope = PolicyScope::kNamespace;
  PolicyAction action = PolicyAction::kAllow;
  std::vector<PolicyRule> rules;  // ORed; an empty list matches nothing
  // Istio's dry run: evaluated and logged, never enforced (policy::Verdict::dry_run).
  bool dry_run = false;

  std::string key() const { return namespace_name + "/" + name; }
};

// A namespace and its labels (for the embedded default, where no API server provides them).
struct Namespace {
  std::string name;
  std::map<std::string, std::string> labels;
};

}  // namespace sockmesh::state
