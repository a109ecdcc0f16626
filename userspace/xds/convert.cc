#include "xds/convert.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace sockmesh::xds {
namespace {

// Collects the first error with its field path; the converters return early once one is set.
class Converter {
 public:
  explicit Converter(const std::string& resource) : resource_(resource) {}

  bool failed() const { return error_.has_value(); }
  ConvertError error() const { return *error_; }
  void fail(const std::string& field, const std::string& message) {
    if (!error_) error_ = ConvertError{resource_, field, message};
  }

  std::string nonempty(const std::string& field, const std::string& value) {
    if (value.empty()) fail(field, "must not be empty");
    return value;
  }

  uint16_t port(const std::string& field, uint32_t value, bool allow_zero) {
    if (value > 65535 || (value == 0 && !allow_zero)) {
      fail(field, std::string("expected a port from ") + (allow_zero ? "0" : "1") +
                      " to 65535, got " + std::to_string(value));
      return 0;
    }
    return static_cast<uint16_t>(value);
  }

  IpAddress ip(const std::string& field, const std::string& bytes) {
    auto a = ip_from_bytes(bytes);
    if (!a) {
      fail(field,
           "expected 4 (IPv4) or 16 (IPv6) address bytes, got " + std::to_string(bytes.size()));
      return {};
    }
    return *a;
  }

  std::map<uint16_t, uint16_t> ports(
      const std::string& field,
      const google::protobuf::RepeatedPtrField<istio::workload::Port>& list) {
    std::map<uint16_t, uint16_t> out;
    for (int i = 0; i < list.size() && !failed(); ++i) {
      std::string at = field + "[" + std::to_string(i) + "]";
      uint16_t from = port(at + ".service_port", list[i].service_port(), false);
      uint16_t to = port(at + ".target_port", list[i].target_port(), true);
      if (!failed() && !out.emplace(from, to).second) {
        fail(at + ".service_port", "duplicate port " + std::to_string(from));
      }
    }
    return out;
  }

  state::Workload workload(const istio::workload::Workload& in);
  state::Service service(const istio::workload::Service& in);
  state::Policy policy(const istio::security::Authorization& in);

 private:
  state::PolicyMatch match(const std::string& field, const istio::security::Match& in);
  std::string string_match(const std::string& field, const istio::security::StringMatch& in,
                           bool principal);
  IpNetwork network(const std::string& field, const istio::security::Address& in);

  const std::string& resource_;
  std::optional<ConvertError> error_;
};

bool is_namespaced(const std::string& s) {
  auto slash = s.find('/');
  return slash != std::string::npos && slash > 0 && slash + 1 < s.size() &&
         s.find('/', slash + 1) == std::string::npos;
}

constexpr char kUnsupported[] = "is not supported by sockmesh";

state::Workload Converter::workload(const istio::workload::Workload& in) {
  state::Workload w;
  w.uid = nonempty("workload.uid", in.uid());
  w.name = in.name();
  w.namespace_name = nonempty("workload.namespace", in.namespace_());
  // Empty means the default, as istiod elides it.
  if (!in.service_account().empty()) w.service_account = in.service_account();
  if (!in.trust_domain().empty()) w.trust_domain = in.trust_domain();
  if (!in.cluster_id().empty()) w.cluster_id = in.cluster_id();
  w.node = in.node();
  w.network = in.network();
  w.workload_name = in.workload_name().empty() ? in.name() : in.workload_name();
  w.canonical_name = in.canonical_name();
  w.canonical_revision = in.canonical_revision();
  w.hostname = in.hostname();
  switch (in.tunnel_protocol()) {
    case istio::workload::NONE:
      w.protocol = state::Protocol::kTcp;
      break;
    case istio::workload::HBONE:
      w.protocol = state::Protocol::kHbone;
      break;
    default:
      fail("workload.tunnel_protocol",
           istio::workload::TunnelProtocol_Name(in.tunnel_protocol()).empty()
               ? "unknown value " + std::to_string(in.tunnel_protocol())
               : istio::workload::TunnelProtocol_Name(in.tunnel_protocol()) + " " + kUnsupported);
  }
  for (int i = 0; i < in.addresses_size() && !failed(); ++i) {
    IpAddress a = ip("workload.addresses[" + std::to_string(i) + "]", in.addresses(i));
    if (!failed()) w.ips.push_back(a);
  }
  // protobuf maps iterate in no fixed order; sort the keys so errors and snapshots are stable.
  std::vector<std::string> keys;
  for (const auto& [key, _] : in.services()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  for (const auto& key : keys) {
    if (failed()) break;
    std::string at = "workload.services[\"" + key + "\"]";
    if (!is_namespaced(key)) {
      fail(at, "expected \"namespace/hostname\" as the key");
      break;
    }
    w.services[key] = ports(at + ".ports", in.services().at(key).ports());
  }
  for (int i = 0; i < in.authorization_policies_size() && !failed(); ++i) {
    const std::string& p = in.authorization_policies(i);
    if (!is_namespaced(p)) {
      fail("workload.authorization_policies[" + std::to_string(i) + "]",
           "expected \"namespace/name\", got '" + p + "'");
    }
    w.authorization_policies.push_back(p);
  }
  // An unhealthy workload stays known (its identity, its policies) but backs no service, as
  // ztunnel leaves unhealthy endpoints out of load balancing.
  if (in.status() == istio::workload::UNHEALTHY) w.services.clear();
  if (in.has_waypoint()) fail("workload.waypoint", kUnsupported);
  if (in.has_network_gateway()) fail("workload.network_gateway", kUnsupported);
  if (in.native_tunnel()) fail("workload.native_tunnel", kUnsupported);
  if (in.has_application_tunnel() &&
      in.application_tunnel().protocol() != istio::workload::ApplicationTunnel::NONE) {
    fail("workload.application_tunnel", kUnsupported);
  }
  if (in.network_mode() == istio::workload::HOST_NETWORK) {
    fail("workload.network_mode", std::string("HOST_NETWORK ") + kUnsupported);
  }
  return w;
}

state::Service Converter::service(const istio::workload::Service& in) {
  state::Service s;
  s.name = nonempty("service.name", in.name());
  s.namespace_name = nonempty("service.namespace", in.namespace_());
  s.hostname = nonempty("service.hostname", in.hostname());
  for (int i = 0; i < in.addresses_size() && !failed(); ++i) {
    std::string at = "service.addresses[" + std::to_string(i) + "]";
    const auto& a = in.addresses(i);
    IpAddress vip = ip(at + ".address", a.address());
    if (failed()) break;
    if (a.has_length() && a.length() != (vip.is_v4() ? 32u : 128u)) {
      fail(at + ".length", "a CIDR VIP " + std::string(kUnsupported));
      break;
    }
    s.vips.push_back(state::ServiceVip{a.network(), vip});
  }
  // Target port 0: the workload's own port map supplies the number.
  s.ports = ports("service.ports", in.ports());
  s.subject_alt_names.assign(in.subject_alt_names().begin(), in.subject_alt_names().end());
  if (in.has_waypoint()) fail("service.waypoint", kUnsupported);
  return s;
}

std::string Converter::string_match(const std::string& field,
                                    const istio::security::StringMatch& in, bool principal) {
  using M = istio::security::StringMatch;
  std::string value;
  switch (in.match_type_case()) {
    case M::kExact:
      value = in.exact();
      if (value.empty()) fail(field + ".exact", "must not be empty");
      break;
    case M::kPrefix:
      value = in.prefix();
      break;
    case M::kSuffix:
      value = in.suffix();
      break;
    case M::kPresence:
      return "*";
    case M::MATCH_TYPE_NOT_SET:
      fail(field, "no match set (exact, prefix, suffix or presence)");
      return "";
  }
  // The model spells wildcards with '*', so a literal '*' could not be told apart.
  if (value.find('*') != std::string::npos) fail(field, "'*' cannot appear in a match value");
  // ztunnel compares principals without "spiffe://"; a value with it would never match.
  if (principal && value.rfind("spiffe://", 0) == 0) {
    fail(field, "principals are compared without \"spiffe://\"");
  }
  if (in.match_type_case() == M::kPrefix) return value + "*";
  if (in.match_type_case() == M::kSuffix) return "*" + value;
  return value;
}

IpNetwork Converter::network(const std::string& field, const istio::security::Address& in) {
  IpAddress base = ip(field + ".address", in.address());
  if (failed()) return {};
  uint32_t max = base.is_v4() ? 32 : 128;
  if (in.length() > max) {
    fail(field + ".length",
         "prefix length " + std::to_string(in.length()) + " is longer than " + std::to_string(max));
    return {};
  }
  // Mask the host bits so the range compares as the CIDR it names.
  auto parsed = IpNetwork::parse(base.to_string() + "/" + std::to_string(in.length()));
  if (!parsed) {
    fail(field, "not a valid CIDR: " + base.to_string() + "/" + std::to_string(in.length()));
    return {};
  }
  return *parsed;
}

state::PolicyMatch Converter::match(const std::string& field, const istio::security::Match& in) {
  state::PolicyMatch m;
  auto strings = [&](const char* name, const auto& list, bool principal,
                     std::vector<std::string>* out) {
    for (int i = 0; i < list.size() && !failed(); ++i) {
      out->push_back(
          string_match(field + "." + name + "[" + std::to_string(i) + "]", list[i], principal));
    }
  };
  auto accounts = [&](const char* name, const auto& list, std::vector<std::string>* out) {
    for (int i = 0; i < list.size() && !failed(); ++i) {
      std::string at = field + "." + name + "[" + std::to_string(i) + "]";
      std::string sa = nonempty(at + ".serviceAccount", list[i].serviceaccount());
      out->push_back(list[i].namespace_().empty() ? sa : list[i].namespace_() + "/" + sa);
    }
  };
  auto networks = [&](const char* name, const auto& list, std::vector<IpNetwork>* out) {
    for (int i = 0; i < list.size() && !failed(); ++i) {
      out->push_back(network(field + "." + name + "[" + std::to_string(i) + "]", list[i]));
    }
  };
  auto port_list = [&](const char* name, const auto& list, std::vector<uint16_t>* out) {
    for (int i = 0; i < list.size() && !failed(); ++i) {
      out->push_back(port(field + "." + name + "[" + std::to_string(i) + "]", list[i], false));
    }
  };
  strings("namespaces", in.namespaces(), false, &m.namespaces);
  strings("not_namespaces", in.not_namespaces(), false, &m.not_namespaces);
  strings("principals", in.principals(), true, &m.principals);
  strings("not_principals", in.not_principals(), true, &m.not_principals);
  accounts("service_accounts", in.service_accounts(), &m.service_accounts);
  accounts("not_service_accounts", in.not_service_accounts(), &m.not_service_accounts);
  networks("source_ips", in.source_ips(), &m.source_ips);
  networks("not_source_ips", in.not_source_ips(), &m.not_source_ips);
  networks("destination_ips", in.destination_ips(), &m.destination_ips);
  networks("not_destination_ips", in.not_destination_ips(), &m.not_destination_ips);
  port_list("destination_ports", in.destination_ports(), &m.destination_ports);
  port_list("not_destination_ports", in.not_destination_ports(), &m.not_destination_ports);
  return m;
}

state::Policy Converter::policy(const istio::security::Authorization& in) {
  state::Policy p;
  p.name = nonempty("authorization.name", in.name());
  p.namespace_name = nonempty("authorization.namespace", in.namespace_());
  switch (in.scope()) {
    case istio::security::GLOBAL:
      p.scope = state::PolicyScope::kGlobal;
      break;
    case istio::security::NAMESPACE:
      p.scope = state::PolicyScope::kNamespace;
      break;
    case istio::security::WORKLOAD_SELECTOR:
      p.scope = state::PolicyScope::kWorkloadSelector;
      break;
    default:
      fail("authorization.scope", "unknown value " + std::to_string(in.scope()));
  }
  switch (in.action()) {
    case istio::security::ALLOW:
      p.action = state::PolicyAction::kAllow;
      break;
    case istio::security::DENY:
      p.action = state::PolicyAction::kDeny;
      break;
    default:
      fail("authorization.action", "unknown value " + std::to_string(in.action()));
  }
  for (int r = 0; r < in.rules_size() && !failed(); ++r) {
    state::PolicyRule rule;
    const auto& rule_in = in.rules(r);
    for (int c = 0; c < rule_in.clauses_size() && !failed(); ++c) {
      state::PolicyClause clause;
      const auto& clause_in = rule_in.clauses(c);
      for (int m = 0; m < clause_in.matches_size() && !failed(); ++m) {
        clause.push_back(match("authorization.rules[" + std::to_string(r) + "].clauses[" +
                                   std::to_string(c) + "].matches[" + std::to_string(m) + "]",
                               clause_in.matches(m)));
      }
      rule.push_back(std::move(clause));
    }
    p.rules.push_back(std::move(rule));
  }
  p.dry_run = in.dry_run();
  return p;
}

}  // namespace

std::string ConvertError::to_string() const {
  std::string s = "resource '" + resource + "': ";
  if (!field.empty()) s += field + ": ";
  return s + message;
}

std::optional<IpAddress> ip_from_bytes(const std::string& bytes) {
  if (bytes.size() == 4) {
    uint32_t v = 0;
    for (unsigned char c : bytes) v = (v << 8) | c;
    return IpAddress::v4(v);
  }
  if (bytes.size() == 16) {
    std::array<uint8_t, 16> raw{};
    std::memcpy(raw.data(), bytes.data(), raw.size());
    return IpAddress::from_bytes16(raw);
  }
  return std::nullopt;
}

Result<Address, ConvertError> convert_address(const std::string& resource_name,
                                              const istio::workload::Address& address) {
  Converter c(resource_name);
  Address out;
  switch (address.type_case()) {
    case istio::workload::Address::kWorkload:
      out = c.workload(address.workload());
      break;
    case istio::workload::Address::kService:
      out = c.service(address.service());
      break;
    case istio::workload::Address::TYPE_NOT_SET:
      c.fail("type", "neither workload nor service is set");
      break;
  }
  if (c.failed()) return c.error();
  return out;
}

Result<state::Policy, ConvertError> convert_authorization(
    const std::string& resource_name, const istio::security::Authorization& authorization) {
  Converter c(resource_name);
  auto p = c.policy(authorization);
  if (c.failed()) return c.error();
  return p;
}

}  // namespace sockmesh::xds
