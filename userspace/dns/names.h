#pragma once
// The names the DNS proxy answers itself, from one state snapshot: services' hostnames (and their
// short forms along the client pod's namespace search path) and workloads' hostnames. Everything
// else is not ours and is forwarded upstream.
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/ip_address.h"
#include "state/snapshot.h"

namespace sockmesh::dns {

struct NameAnswer {
  bool known = false;                // false: not ours, forward it
  std::string matched;               // the FQDN that matched, for logs
  std::vector<IpAddress> addresses;  // of the asked family only; empty is NOERROR with no answer
};

class NameTable {
 public:
  // `cluster_domain` is the Kubernetes DNS domain that search-path short forms expand into.
  explicit NameTable(const state::Snapshot& snapshot, std::string cluster_domain = "cluster.local");

  // `name` is lower case without a trailing dot (as parse_query returns it); `client_namespace`
  // is the namespace of the querying pod, empty when unknown (then only full names match).
  // `type` is the query type; A returns IPv4 addresses, AAAA IPv6, any other type none.
  NameAnswer lookup(std::string_view name, uint16_t type, std::string_view client_namespace) const;

  size_t size() const { return names_.size(); }

 private:
  std::string cluster_domain_;
  std::unordered_map<std::string, std::vector<IpAddress>> names_;  // lower-case FQDN -> addresses
};

std::string to_lower(std::string_view s);

}  // namespace sockmesh::dns
