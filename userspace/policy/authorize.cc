#include "policy/authorize.h"

#include "identity/spiffe.h"

#include <algorithm>
#include <set>

#include "base/log.h"

namespace sockmesh::policy {
namespace {

constexpr std::string_view kScope = "rbac";
constexpr std::string_view kSpiffeScheme = "spiffe://";

// ztunnel's matches_internal: every positive value list that is non-empty needs one hit, and no
// value in a non-empty negative list may hit.
template <typename T, typename Pred>
bool field_matches(const std::vector<T>& positive, const std::vector<T>& negative, Pred pred) {
  if (!positive.empty() && std::none_of(positive.begin(), positive.end(), pred)) {
    return false;
  }
  if (!negative.empty() && std::any_of(negative.begin(), negative.end(), pred)) {
    return false;
  }
  return true;
}

bool match_is_empty(const state::PolicyMatch& m) {
  return m.namespaces.empty() && m.not_namespaces.empty() && m.principals.empty() &&
         m.not_principals.empty() && m.service_accounts.empty() && m.not_service_accounts.empty() &&
         m.source_ips.empty() && m.not_source_ips.empty() && m.destination_ips.empty() &&
         m.not_destination_ips.empty() && m.destination_ports.empty() &&
         m.not_destination_ports.empty();
}

bool network_contains(const IpNetwork& net, const IpAddress& ip) {
  return net.base.is_v4() == ip.is_v4() && net.contains(ip);
}

bool principal_matches(std::string_view pattern, std::string_view principal) {
  if (!principal.starts_with(kSpiffeScheme)) {
    return false;  // plaintext: no identity at all
  }
  return string_pattern_matches(pattern, principal.substr(kSpiffeScheme.size()));
}

bool service_account_matches(std::string_view value, std::string_view policy_namespace,
                             const ConnectionFacts& facts) {
  if (facts.source_service_account.empty()) {
    return false;  // no identity
  }
  std::string_view ns = policy_namespace;
  std::string_view sa = value;
  if (auto slash = value.find('/'); slash != std::string_view::npos) {
    ns = value.substr(0, slash);
    sa = value.substr(slash + 1);
  }
  return ns == facts.source_namespace && sa == facts.source_service_account;
}

Verdict decide(bool allowed, const state::Policy* policy, std::string_view reason) {
  Verdict v;
  v.allowed = allowed;
  if (policy != nullptr) {
    v.policy = policy->key();
    v.reason.reserve(reason.size() + 1 + v.policy.size());
    v.reason.append(reason).append(" ").append(v.policy);
  } else {
    v.reason = reason;
  }
  return v;
}

}  // namespace

ConnectionFacts ConnectionFacts::make(const IpAddress& source_ip, std::string source_principal,
                                      const IpAddress& destination_ip, uint16_t destination_port) {
  ConnectionFacts f;
  f.source_ip = source_ip;
  // The principal's parts come from the one SPIFFE parser the TLS layer also uses.
  if (auto id = identity::SpiffeId::parse(source_principal)) {
    f.source_namespace = std::move(id->namespace_name);
    f.source_service_account = std::move(id->service_account);
  }
  f.source_principal = std::move(source_principal);
  f.destination_ip = destination_ip;
  f.destination_port = destination_port;
  return f;
}

bool string_pattern_matches(std::string_view pattern, std::string_view value) {
  if (pattern == "*") {
    return !value.empty();
  }
  if (pattern.starts_with('*')) {
    return value.ends_with(pattern.substr(1));
  }
  if (pattern.ends_with('*')) {
    return value.starts_with(pattern.substr(0, pattern.size() - 1));
  }
  return pattern == value;
}

bool match_matches(const state::PolicyMatch& m, std::string_view policy_namespace,
                   const ConnectionFacts& facts) {
  if (match_is_empty(m)) {
    return false;
  }
  return field_matches(
             m.destination_ips, m.not_destination_ips,
             [&](const IpNetwork& n) { return network_contains(n, facts.destination_ip); }) &&
         field_matches(m.source_ips, m.not_source_ips,
                       [&](const IpNetwork& n) { return network_contains(n, facts.source_ip); }) &&
         field_matches(m.destination_ports, m.not_destination_ports,
                       [&](uint16_t p) { return p == facts.destination_port; }) &&
         field_matches(m.service_accounts, m.not_service_accounts,
                       [&](const std::string& v) {
                         return service_account_matches(v, policy_namespace, facts);
                       }) &&
         field_matches(
             m.principals, m.not_principals,
             [&](const std::string& p) { return principal_matches(p, facts.source_principal); }) &&
         field_matches(m.namespaces, m.not_namespaces, [&](const std::string& p) {
           return string_pattern_matches(p, facts.source_namespace);
         });
}

bool policy_matches(const state::Policy& policy, const ConnectionFacts& facts) {
  // No rules: matches nothing. No clauses in a rule: the rule matches. No matches in a clause: the
  // clause holds.
  return std::any_of(policy.rules.begin(), policy.rules.end(), [&](const state::PolicyRule& rule) {
    return std::all_of(rule.begin(), rule.end(), [&](const state::PolicyClause& clause) {
      return clause.empty() ||
             std::any_of(clause.begin(), clause.end(), [&](const state::PolicyMatch& m) {
               return match_matches(m, policy.namespace_name, facts);
             });
    });
  });
}

namespace {

// Istio's four steps over the policies of `applicable` whose dry_run equals `dry_run`.
Verdict decide_over(const std::vector<const state::Policy*>& applicable, bool dry_run,
                    const ConnectionFacts& facts) {
  bool any_allow = false;
  for (const state::Policy* p : applicable) {
    if (p->dry_run != dry_run) continue;
    if (p->action == state::PolicyAction::kAllow) {
      any_allow = true;
    } else if (policy_matches(*p, facts)) {
      return decide(false, p, "denied by policy");
    }
  }
  if (!any_allow) {
    return decide(true, nullptr, "no allow policies");
  }
  for (const state::Policy* p : applicable) {
    if (p->dry_run == dry_run && p->action == state::PolicyAction::kAllow &&
        policy_matches(*p, facts)) {
      return decide(true, p, "allowed by policy");
    }
  }
  return decide(false, nullptr, "allow policies exist, but none matched");
}

}  // namespace

Verdict authorize(const std::vector<const state::Policy*>& applicable,
                  const ConnectionFacts& facts) {
  Verdict v = decide_over(applicable, /*dry_run=*/false, facts);
  bool any_dry_run = std::any_of(applicable.begin(), applicable.end(),
                                 [](const state::Policy* p) { return p->dry_run; });
  if (any_dry_run) {
    Verdict shadow = decide_over(applicable, /*dry_run=*/true, facts);
    v.dry_run = Verdict::DryRun{shadow.allowed, std::move(shadow.policy), std::move(shadow.reason)};
  }
  return v;
}

std::string dry_run_summary(const Verdict& verdict) {
  if (!verdict.dry_run) return "";
  return std::string("dry run would ") + (verdict.dry_run->allowed ? "allow" : "deny") + ": " +
         verdict.dry_run->reason + " (enforced: " + (verdict.allowed ? "allow" : "deny") + ")";
}

Verdict authorize(const state::Snapshot& snapshot, const state::Workload& destination,
                  const ConnectionFacts& facts) {
  Verdict v = authorize(snapshot.policies_for(destination), facts);
  SM_DEBUG(kScope) << (v.allowed ? "allow" : "deny") << " src=" << facts.source_ip.to_string()
                   << " principal="
                   << (facts.source_principal.empty() ? "-" : facts.source_principal)
                   << " dst=" << Endpoint{facts.destination_ip, facts.destination_port}.to_string()
                   << " workload=" << destination.namespace_name << "/" << destination.name
                   << " reason=\"" << v.reason << "\"";
  return v;
}

bool denied_on_every_port(const state::Snapshot& snapshot, const state::Workload& destination,
                          ConnectionFacts facts) {
  auto applicable = snapshot.policies_for(destination);
  std::set<uint16_t> ports;
  for (const state::Policy* p : applicable) {
    for (const auto& rule : p->rules) {
      for (const auto& clause : rule) {
        for (const auto& match : clause) {
          ports.insert(match.destination_ports.begin(), match.destination_ports.end());
          ports.insert(match.not_destination_ports.begin(), match.not_destination_ports.end());
        }
      }
    }
  }
  uint16_t unnamed = 1;
  while (ports.count(unnamed) != 0) ++unnamed;
  ports.insert(unnamed);
  for (uint16_t port : ports) {
    facts.destination_port = port;
    if (authorize(applicable, facts).allowed) return false;
  }
  return true;
}

Verdict recheck(const state::Snapshot& current, const state::Workload& destination,
                const ConnectionFacts& facts) {
  const state::Workload* now = current.workload_by_uid(destination.uid);
  return authorize(current, now != nullptr ? *now : destination, facts);
}

}  // namespace sockmesh::policy
