#include "policy/authorize.h"

#include "identity/spiffe.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace sockmesh::policy {
namespace {

using state::Policy;
using state::PolicyAction;
using state::PolicyClause;
using state::PolicyMatch;
using state::PolicyRule;
using state::PolicyScope;
using state::Snapshot;
using state::Workload;

IpAddress ip(const char* text) {
  auto a = IpAddress::parse(text);
  EXPECT_TRUE(a) << text;
  return a.value_or(IpAddress());
}

IpNetwork net(const char* text) {
  auto n = IpNetwork::parse(text);
  EXPECT_TRUE(n) << text;
  return n.value_or(IpNetwork());
}

constexpr const char* kMtlsA = "spiffe://cluster.local/ns/a/sa/alice";
constexpr const char* kMtlsB = "spiffe://cluster.local/ns/b/sa/bob";

ConnectionFacts conn(std::string principal, const char* src = "10.0.0.1",
                     const char* dst = "10.0.1.1", uint16_t port = 8080) {
  return ConnectionFacts::make(ip(src), std::move(principal), ip(dst), port);
}

Workload workload(std::string ns, std::string name, std::vector<std::string> selected = {}) {
  Workload w;
  w.uid = "Kubernetes//Pod/" + ns + "/" + name;  // before the moves below
  w.name = std::move(name);
  w.namespace_name = std::move(ns);
  w.ips = {ip("10.0.1.1")};
  w.authorization_policies = std::move(selected);
  return w;
}

Policy policy(std::string ns, std::string name, PolicyAction action, std::vector<PolicyRule> rules,
              PolicyScope scope = PolicyScope::kNamespace) {
  Policy p;
  p.name = std::move(name);
  p.namespace_name = std::move(ns);
  p.scope = scope;
  p.action = action;
  p.rules = std::move(rules);
  return p;
}

// One rule with one clause holding one match.
std::vector<PolicyRule> single(PolicyMatch m) { return {PolicyRule{PolicyClause{std::move(m)}}}; }

// --- Matching semantics: one Allow policy in namespace "dst"; the row says whether it matches. ---

struct MatchCase {
  std::string name;
  std::vector<PolicyRule> rules;
  ConnectionFacts facts;
  bool matches;
};

std::vector<MatchCase> match_cases() {
  std::vector<MatchCase> c;
  auto add = [&](std::string name, std::vector<PolicyRule> rules, ConnectionFacts facts,
                 bool matches) {
    c.push_back({std::move(name), std::move(rules), std::move(facts), matches});
  };
  const std::string plain;

  // Structure (ztunnel src/rbac.rs rbac_empty_policy).
  add("no_rules_match_nothing", {}, conn(kMtlsA), false);
  add("empty_rule_matches_all", {PolicyRule{}}, conn(plain), true);
  add("empty_clause_holds", {PolicyRule{PolicyClause{}}}, conn(plain), true);
  add("empty_match_never_matches", single(PolicyMatch{}), conn(kMtlsA), false);
  add("empty_match_is_skipped_not_fatal",
      {PolicyRule{PolicyClause{PolicyMatch{}, PolicyMatch{.destination_ports = {8080}}}}},
      conn(plain), true);

  // Rules OR.
  std::vector<PolicyRule> two_rules = {PolicyRule{PolicyClause{PolicyMatch{.namespaces = {"x"}}}},
                                       PolicyRule{PolicyClause{PolicyMatch{.namespaces = {"a"}}}}};
  add("rules_or_second", two_rules, conn(kMtlsA), true);
  add("rules_or_none", two_rules, conn(kMtlsB), false);

  // Clauses AND (from + to).
  std::vector<PolicyRule> and_clauses = {
      PolicyRule{PolicyClause{PolicyMatch{.namespaces = {"a"}}, PolicyMatch{.namespaces = {"b"}}},
                 PolicyClause{PolicyMatch{.destination_ports = {80}}}}};
  add("clauses_and_both", and_clauses, conn(kMtlsB, "10.0.0.1", "10.0.1.1", 80), true);
  add("clauses_and_first_fails", and_clauses,
      conn("spiffe://cluster.local/ns/c/sa/x", "10.0.0.1", "10.0.1.1", 80), false);
  add("clauses_and_second_fails", and_clauses, conn(kMtlsA, "10.0.0.1", "10.0.1.1", 81), false);
  add("clause_matches_or", and_clauses, conn(kMtlsA, "10.0.0.1", "10.0.1.1", 80), true);

  // Fields within a match AND; values within a field OR.
  PolicyMatch both{.namespaces = {"a"}, .destination_ports = {80, 8080}};
  add("fields_and_values_or", single(both), conn(kMtlsA), true);
  add("fields_and_port_fails", single(both), conn(kMtlsA, "10.0.0.1", "10.0.1.1", 81), false);
  add("fields_and_ns_fails", single(both), conn(kMtlsB), false);

  // Principals (policy values carry no spiffe:// scheme).
  add("principal_exact", single({.principals = {"cluster.local/ns/a/sa/alice"}}), conn(kMtlsA),
      true);
  add("principal_exact_other", single({.principals = {"cluster.local/ns/a/sa/alice"}}),
      conn(kMtlsB), false);
  add("principal_with_scheme_never_matches",
      single({.principals = {"spiffe://cluster.local/ns/a/sa/alice"}}), conn(kMtlsA), false);
  add("principal_prefix", single({.principals = {"cluster.local/ns/a/*"}}), conn(kMtlsA), true);
  add("principal_prefix_other", single({.principals = {"cluster.local/ns/a/*"}}), conn(kMtlsB),
      false);
  add("principal_suffix", single({.principals = {"*/sa/bob"}}), conn(kMtlsB), true);
  add("principal_suffix_other", single({.principals = {"*/sa/bob"}}), conn(kMtlsA), false);
  add("principal_star_mtls", single({.principals = {"*"}}), conn(kMtlsA), true);
  add("principal_star_plaintext", single({.principals = {"*"}}), conn(plain), false);
  add("principal_prefix_plaintext", single({.principals = {"cluster.local/*"}}), conn(plain),
      false);
  add("principal_values_or", single({.principals = {"nope", "*/sa/alice"}}), conn(kMtlsA), true);
  add("not_principal_exact", single({.not_principals = {"cluster.local/ns/a/sa/alice"}}),
      conn(kMtlsA), false);
  add("not_principal_other", single({.not_principals = {"cluster.local/ns/a/sa/alice"}}),
      conn(kMtlsB), true);
  add("not_principal_star_plaintext", single({.not_principals = {"*"}}), conn(plain), true);
  add("not_principal_star_mtls", single({.not_principals = {"*"}}), conn(kMtlsA), false);
  add("principal_and_not_principal",
      single({.principals = {"cluster.local/*"}, .not_principals = {"*/sa/bob"}}), conn(kMtlsB),
      false);

  // Namespaces (from the peer identity).
  add("namespace_exact", single({.namespaces = {"a"}}), conn(kMtlsA), true);
  add("namespace_plaintext", single({.namespaces = {"a"}}), conn(plain), false);
  add("namespace_star_mtls", single({.namespaces = {"*"}}), conn(kMtlsB), true);
  add("namespace_star_plaintext", single({.namespaces = {"*"}}), conn(plain), false);
  add("namespace_prefix", single({.namespaces = {"tenant-*"}}),
      conn("spiffe://cluster.local/ns/tenant-7/sa/x"), true);
  add("not_namespace", single({.not_namespaces = {"a"}}), conn(kMtlsA), false);
  add("not_namespace_other", single({.not_namespaces = {"a"}}), conn(kMtlsB), true);
  add("not_namespace_plaintext", single({.not_namespaces = {"a"}}), conn(plain), true);

  // Service accounts: "ns/sa", or "sa" in the policy's namespace ("dst").
  add("sa_qualified", single({.service_accounts = {"a/alice"}}), conn(kMtlsA), true);
  add("sa_qualified_wrong_ns", single({.service_accounts = {"b/alice"}}), conn(kMtlsA), false);
  add("sa_bare_uses_policy_ns", single({.service_accounts = {"alice"}}),
      conn("spiffe://cluster.local/ns/dst/sa/alice"), true);
  add("sa_bare_other_ns", single({.service_accounts = {"alice"}}), conn(kMtlsA), false);
  add("sa_ignores_trust_domain", single({.service_accounts = {"a/alice"}}),
      conn("spiffe://other.td/ns/a/sa/alice"), true);
  add("sa_plaintext", single({.service_accounts = {"a/alice"}}), conn(plain), false);
  add("not_sa", single({.not_service_accounts = {"a/alice"}}), conn(kMtlsA), false);
  add("not_sa_other", single({.not_service_accounts = {"a/alice"}}), conn(kMtlsB), true);
  add("not_sa_plaintext", single({.not_service_accounts = {"a/alice"}}), conn(plain), true);

  // Source IPs, IPv4 and IPv6.
  add("source_cidr_v4", single({.source_ips = {net("10.0.0.0/24")}}), conn(plain, "10.0.0.9"),
      true);
  add("source_cidr_v4_out", single({.source_ips = {net("10.0.0.0/24")}}), conn(plain, "10.0.9.9"),
      false);
  add("source_host_v4", single({.source_ips = {net("10.0.0.1")}}), conn(plain, "10.0.0.1"), true);
  add("source_cidr_v6", single({.source_ips = {net("fd00:1::/64")}}),
      conn(plain, "fd00:1::abcd", "fd00:2::1"), true);
  add("source_cidr_v6_out", single({.source_ips = {net("fd00:1::/64")}}),
      conn(plain, "fd00:1:0:1::1", "fd00:2::1"), false);
  add("source_v6_range_excludes_v4", single({.source_ips = {net("::/0")}}), conn(plain, "10.0.0.1"),
      false);
  add("source_v4_range_excludes_v6", single({.source_ips = {net("0.0.0.0/0")}}),
      conn(plain, "fd00::1", "fd00::2"), false);
  add("not_source_cidr_v6", single({.not_source_ips = {net("fd00:1::/64")}}),
      conn(plain, "fd00:1::5", "fd00:2::1"), false);
  add("not_source_cidr_v6_other", single({.not_source_ips = {net("fd00:1::/64")}}),
      conn(plain, "fd00:3::5", "fd00:2::1"), true);

  // Destination IPs and ports.
  add("destination_cidr_v6", single({.destination_ips = {net("fd00:2::/48")}}),
      conn(plain, "fd00:1::1", "fd00:2:0:7::1"), true);
  add("destination_cidr_v4_out", single({.destination_ips = {net("10.9.0.0/16")}}), conn(plain),
      false);
  add("not_destination_ip", single({.not_destination_ips = {net("10.0.1.1")}}), conn(plain), false);
  add("destination_port", single({.destination_ports = {8080}}), conn(plain), true);
  add("destination_port_other", single({.destination_ports = {9090}}), conn(plain), false);
  add("not_destination_port", single({.not_destination_ports = {8080}}), conn(plain), false);
  add("not_destination_port_other", single({.not_destination_ports = {9090}}), conn(plain), true);
  add("port_and_not_port", single({.destination_ports = {80, 8080}, .not_destination_ports = {80}}),
      conn(plain, "10.0.0.1", "10.0.1.1", 80), false);
  return c;
}

class MatchTable : public ::testing::TestWithParam<MatchCase> {};

TEST_P(MatchTable, PolicyMatches) {
  const MatchCase& c = GetParam();
  Policy p = policy("dst", "p", PolicyAction::kAllow, c.rules);
  EXPECT_EQ(policy_matches(p, c.facts), c.matches);
  // The same row through the full decision: a lone Allow policy allows exactly when it matches.
  Verdict v = authorize({&p}, c.facts);
  EXPECT_EQ(v.allowed, c.matches) << v.reason;
  EXPECT_EQ(v.policy, c.matches ? "dst/p" : "");
  // And as a Deny policy: denies exactly when it matches.
  p.action = PolicyAction::kDeny;
  Verdict d = authorize({&p}, c.facts);
  EXPECT_EQ(d.allowed, !c.matches) << d.reason;
  EXPECT_EQ(d.policy, c.matches ? "dst/p" : "");
}

INSTANTIATE_TEST_SUITE_P(Rbac, MatchTable, ::testing::ValuesIn(match_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(StringPattern, Forms) {
  EXPECT_TRUE(string_pattern_matches("abc", "abc"));
  EXPECT_FALSE(string_pattern_matches("abc", "abcd"));
  EXPECT_FALSE(string_pattern_matches("abc", ""));
  EXPECT_TRUE(string_pattern_matches("abc*", "abc"));
  EXPECT_TRUE(string_pattern_matches("abc*", "abcd"));
  EXPECT_FALSE(string_pattern_matches("abc*", "xabc"));
  EXPECT_TRUE(string_pattern_matches("*abc", "abc"));
  EXPECT_TRUE(string_pattern_matches("*abc", "xabc"));
  EXPECT_FALSE(string_pattern_matches("*abc", "abcx"));
  EXPECT_TRUE(string_pattern_matches("*", "x"));
  EXPECT_FALSE(string_pattern_matches("*", ""));
  // A leading '*' wins: "*a*" is the suffix "a*".
  EXPECT_TRUE(string_pattern_matches("*a*", "xa*"));
  EXPECT_FALSE(string_pattern_matches("*a*", "xax"));
}

TEST(ConnectionFacts, DerivesNamespaceAndServiceAccount) {
  auto f = conn("spiffe://td.example/ns/prod/sa/web");
  EXPECT_EQ(f.source_namespace, "prod");
  EXPECT_EQ(f.source_service_account, "web");
  auto p = conn("");
  EXPECT_EQ(p.source_namespace, "");
  EXPECT_EQ(p.source_service_account, "");
  for (const char* bad : {"spiffe://td/ns/a", "spiffe://td/ns/a/sa/", "spiffe://td/ns//sa/x",
                          "spiffe:///ns/a/sa/x", "spiffe://td/ns/a/sa/x/y", "spiffe://td/xx/a/sa/x",
                          "td/ns/a/sa/x", "https://td/ns/a/sa/x"}) {
    EXPECT_FALSE(identity::SpiffeId::parse(bad)) << bad;
    EXPECT_EQ(conn(bad).source_service_account, "") << bad;
  }
  auto id = identity::SpiffeId::parse("spiffe://cluster.local/ns/a/sa/alice");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->trust_domain, "cluster.local");
}

// --- Decision over several policies. ---

TEST(Authorize, NoPoliciesAllows) {
  Snapshot snap({workload("dst", "w")}, {}, {});
  Verdict v = authorize(snap, snap.workloads()[0], conn(""));
  EXPECT_TRUE(v.allowed);
  EXPECT_EQ(v.policy, "");
  EXPECT_EQ(v.reason, "no allow policies");
}

TEST(Authorize, DenyWinsOverMatchingAllow) {
  Snapshot snap({workload("dst", "w")}, {},
                {policy("dst", "allow-all", PolicyAction::kAllow, {PolicyRule{}}),
                 policy("dst", "deny-b", PolicyAction::kDeny, single({.namespaces = {"b"}}))});
  const Workload& w = snap.workloads()[0];
  Verdict denied = authorize(snap, w, conn(kMtlsB));
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.policy, "dst/deny-b");
  EXPECT_EQ(denied.reason, "denied by policy dst/deny-b");
  Verdict allowed = authorize(snap, w, conn(kMtlsA));
  EXPECT_TRUE(allowed.allowed);
  EXPECT_EQ(allowed.policy, "dst/allow-all");
  EXPECT_EQ(allowed.reason, "allowed by policy dst/allow-all");
}

Policy dry_run(Policy p) {
  p.dry_run = true;
  return p;
}

TEST(Authorize, DryRunPoliciesAreReportedAndNeverEnforced) {
  // A dry-run Deny that matches: the connection is allowed, and the shadow decision says deny.
  Snapshot snap(
      {workload("dst", "w")}, {},
      {dry_run(policy("dst", "audit-b", PolicyAction::kDeny, single({.namespaces = {"b"}})))});
  const Workload& w = snap.workloads()[0];
  Verdict v = authorize(snap, w, conn(kMtlsB));
  EXPECT_TRUE(v.allowed);
  EXPECT_EQ(v.reason, "no allow policies") << "the dry-run Deny is not an enforced policy";
  ASSERT_TRUE(v.dry_run);
  EXPECT_FALSE(v.dry_run->allowed);
  EXPECT_EQ(v.dry_run->policy, "dst/audit-b");
  EXPECT_EQ(dry_run_summary(v),
            "dry run would deny: denied by policy dst/audit-b (enforced: allow)");
  Verdict other = authorize(snap, w, conn(kMtlsA));
  ASSERT_TRUE(other.dry_run);
  EXPECT_TRUE(other.dry_run->allowed);

  // A dry-run Allow beside an enforced Allow: it does not make an Allow policy "exist" for the
  // enforced decision, and is judged on its own in the shadow one.
  Snapshot both({workload("dst", "w")}, {},
                {policy("dst", "allow-a", PolicyAction::kAllow, single({.namespaces = {"a"}})),
                 dry_run(policy("dst", "trial-allow-b", PolicyAction::kAllow,
                                single({.namespaces = {"b"}})))});
  Verdict b = authorize(both, both.workloads()[0], conn(kMtlsB));
  EXPECT_FALSE(b.allowed);
  EXPECT_EQ(b.reason, "allow policies exist, but none matched");
  ASSERT_TRUE(b.dry_run);
  EXPECT_TRUE(b.dry_run->allowed);
  EXPECT_EQ(b.dry_run->policy, "dst/trial-allow-b");

  // With only a dry-run Allow, the enforced side has no Allow policy at all: everything passes.
  Snapshot trial(
      {workload("dst", "w")}, {},
      {dry_run(policy("dst", "trial", PolicyAction::kAllow, single({.namespaces = {"a"}})))});
  Verdict t = authorize(trial, trial.workloads()[0], conn(kMtlsB));
  EXPECT_TRUE(t.allowed);
  ASSERT_TRUE(t.dry_run);
  EXPECT_FALSE(t.dry_run->allowed);
  EXPECT_EQ(t.dry_run->reason, "allow policies exist, but none matched");

  // No dry-run policy applies: nothing to report.
  Snapshot plain({workload("dst", "w")}, {}, {});
  EXPECT_FALSE(authorize(plain, plain.workloads()[0], conn(kMtlsB)).dry_run);
  EXPECT_EQ(dry_run_summary(authorize(plain, plain.workloads()[0], conn(kMtlsB))), "");
}

TEST(Authorize, NonMatchingDenyAloneAllows) {
  Snapshot snap({workload("dst", "w")}, {},
                {policy("dst", "deny-b", PolicyAction::kDeny, single({.namespaces = {"b"}}))});
  Verdict v = authorize(snap, snap.workloads()[0], conn(kMtlsA));
  EXPECT_TRUE(v.allowed);
  EXPECT_EQ(v.reason, "no allow policies");
}

TEST(Authorize, AllowPoliciesButNoneMatchDenies) {
  Snapshot snap({workload("dst", "w")}, {},
                {policy("dst", "a", PolicyAction::kAllow, single({.namespaces = {"a"}})),
                 policy("dst", "c", PolicyAction::kAllow, single({.namespaces = {"c"}}))});
  const Workload& w = snap.workloads()[0];
  Verdict v = authorize(snap, w, conn(kMtlsB));
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.policy, "");
  EXPECT_EQ(v.reason, "allow policies exist, but none matched");
  EXPECT_TRUE(authorize(snap, w, conn(kMtlsA)).allowed);
}

TEST(Authorize, AllowWithNoRulesDeniesEverything) {
  Snapshot snap({workload("dst", "w")}, {},
                {policy("dst", "allow-nothing", PolicyAction::kAllow, {})});
  Verdict v = authorize(snap, snap.workloads()[0], conn(kMtlsA));
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.policy, "");
}

TEST(Authorize, DenyWithNoRulesHasNoEffect) {
  Snapshot snap({workload("dst", "w")}, {},
                {policy("dst", "deny-nothing", PolicyAction::kDeny, {})});
  EXPECT_TRUE(authorize(snap, snap.workloads()[0], conn(kMtlsA)).allowed);
}

TEST(Authorize, DenyPlaintextWithNotPrincipalsStar) {
  Snapshot snap(
      {workload("dst", "w")}, {},
      {policy("dst", "require-mtls", PolicyAction::kDeny, single({.not_principals = {"*"}}))});
  const Workload& w = snap.workloads()[0];
  EXPECT_FALSE(authorize(snap, w, conn("")).allowed);
  EXPECT_TRUE(authorize(snap, w, conn(kMtlsA)).allowed);
}

TEST(Authorize, ScopingThroughPoliciesFor) {
  // One Deny policy of each scope, each for its own port.
  std::vector<Policy> policies = {
      policy("istio-system", "global", PolicyAction::kDeny,
             {PolicyRule{PolicyClause{PolicyMatch{.destination_ports = {1}}}}},
             PolicyScope::kGlobal),
      policy("ns1", "ns-wide", PolicyAction::kDeny,
             {PolicyRule{PolicyClause{PolicyMatch{.destination_ports = {2}}}}}),
      policy("ns1", "selected", PolicyAction::kDeny,
             {PolicyRule{PolicyClause{PolicyMatch{.destination_ports = {3}}}}},
             PolicyScope::kWorkloadSelector),
  };
  Snapshot snap({workload("ns1", "chosen", {"ns1/selected"}), workload("ns1", "other"),
                 workload("ns2", "elsewhere")},
                {}, policies);
  const Workload& chosen = snap.workloads()[0];
  const Workload& other = snap.workloads()[1];
  const Workload& elsewhere = snap.workloads()[2];
  auto on_port = [](uint16_t port) { return conn(kMtlsA, "10.0.0.1", "10.0.1.1", port); };

  struct Row {
    const Workload* w;
    uint16_t port;
    bool allowed;
    const char* policy;
  };
  for (const Row& r : std::vector<Row>{
           {&chosen, 1, false, "istio-system/global"},
           {&chosen, 2, false, "ns1/ns-wide"},
           {&chosen, 3, false, "ns1/selected"},
           {&chosen, 4, true, ""},
           {&other, 1, false, "istio-system/global"},
           {&other, 2, false, "ns1/ns-wide"},
           {&other, 3, true, ""},  // not selected
           {&elsewhere, 1, false, "istio-system/global"},
           {&elsewhere, 2, true, ""},  // other namespace
           {&elsewhere, 3, true, ""},
       }) {
    Verdict v = authorize(snap, *r.w, on_port(r.port));
    EXPECT_EQ(v.allowed, r.allowed) << r.w->name << ":" << r.port << " " << v.reason;
    EXPECT_EQ(v.policy, r.policy) << r.w->name << ":" << r.port;
  }
}

TEST(Authorize, AllowInOneScopeMakesOtherWorkloadsUnaffected) {
  // An Allow policy in ns1 makes ns1 default-deny but leaves ns2 open.
  Snapshot snap({workload("ns1", "w1"), workload("ns2", "w2")}, {},
                {policy("ns1", "only-a", PolicyAction::kAllow, single({.namespaces = {"a"}}))});
  EXPECT_FALSE(authorize(snap, snap.workloads()[0], conn(kMtlsB)).allowed);
  EXPECT_TRUE(authorize(snap, snap.workloads()[0], conn(kMtlsA)).allowed);
  EXPECT_TRUE(authorize(snap, snap.workloads()[1], conn(kMtlsB)).allowed);
}

TEST(Recheck, PicksUpPolicyAndSelectorChanges) {
  Workload w = workload("ns1", "w");
  Snapshot v1({w}, {}, {});
  ConnectionFacts facts = conn(kMtlsB);
  ASSERT_TRUE(authorize(v1, v1.workloads()[0], facts).allowed);

  // A selector policy appears and the workload now lists it.
  Workload w2 = w;
  w2.authorization_policies = {"ns1/deny-b"};
  Snapshot v2({w2}, {},
              {policy("ns1", "deny-b", PolicyAction::kDeny, single({.namespaces = {"b"}}),
                      PolicyScope::kWorkloadSelector)});
  // The connection still holds the workload as accepted (without the selector); recheck uses the
  // current one.
  Verdict v = recheck(v2, w, facts);
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.policy, "ns1/deny-b");
  // Same inputs, same answer: no hidden state.
  EXPECT_FALSE(recheck(v2, w, facts).allowed);
  EXPECT_TRUE(recheck(v1, w, facts).allowed);

  // Workload gone from the new snapshot: the accepted copy decides (namespace policy applies).
  Snapshot v3({}, {}, {policy("ns1", "deny-all", PolicyAction::kDeny, {PolicyRule{}})});
  Verdict gone = recheck(v3, w, facts);
  EXPECT_FALSE(gone.allowed);
  EXPECT_EQ(gone.policy, "ns1/deny-all");
}

}  // namespace
}  // namespace sockmesh::policy

namespace sockmesh::policy {
namespace {

// Issue #14 item 4: a peer whose identity no port of the workload lets in loses its connection.
TEST(DeniedOnEveryPort, DependsOnWhetherAnyPortWouldAllow) {
  auto alice_only = [](std::vector<uint16_t> ports, std::vector<uint16_t> not_ports = {}) {
    return policy("dst", "alice", PolicyAction::kAllow,
                  single(PolicyMatch{.principals = {"cluster.local/ns/a/sa/alice"},
                                     .destination_ports = std::move(ports),
                                     .not_destination_ports = std::move(not_ports)}));
  };
  struct Row {
    const char* name;
    std::vector<Policy> policies;
    const char* principal;
    bool denied_everywhere;
  };
  std::vector<Row> rows = {
      {"no_policies", {}, kMtlsB, false},
      {"allow_other_identity", {alice_only({})}, kMtlsB, true},
      {"allow_this_identity", {alice_only({})}, kMtlsA, false},
      {"allow_this_identity_on_one_port", {alice_only({9999})}, kMtlsA, false},
      {"allow_every_port_but_one", {alice_only({}, {8080})}, kMtlsA, false},
      {"deny_this_identity",
       {policy("dst", "no-alice", PolicyAction::kDeny,
               single(PolicyMatch{.principals = {"cluster.local/ns/a/sa/alice"}}))},
       kMtlsA,
       true},
      {"deny_one_port_only",
       {policy("dst", "no-8080", PolicyAction::kDeny,
               single(PolicyMatch{.destination_ports = {8080}}))},
       kMtlsA,
       false},
  };
  for (const auto& row : rows) {
    Snapshot snap({workload("dst", "server")}, {}, row.policies);
    EXPECT_EQ(denied_on_every_port(snap, snap.workloads()[0], conn(row.principal)),
              row.denied_everywhere)
        << row.name;
  }
}

}  // namespace
}  // namespace sockmesh::policy
