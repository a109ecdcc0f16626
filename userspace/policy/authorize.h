#pragma once
// L4 authorization (Istio AuthorizationPolicy as ztunnel enforces it).
//
// authorize() is a pure function of (snapshot, destination workload, connection facts): it keeps no
// state and allocates only for the returned Verdict and the policies_for() list, so re-checking a
// live connection after a policy change is simply calling it again with the new snapshot
// (recheck() does that, re-resolving the destination workload in the new snapshot).
//
// Decision (https://istio.io/latest/docs/reference/config/security/authorization-policy/ and
// ztunnel src/state.rs DemandProxyState::assert_rbac):
//   1. any applicable Deny policy that matches -> deny;
//   2. no applicable Allow policy              -> allow;
//   3. any applicable Allow policy that matches -> allow;
//   4. otherwise                               -> deny.
// "Applicable" means Snapshot::policies_for(destination): Global, the destination's namespace, and
// WorkloadSelector policies the workload lists.
//
// Matching, verified against ztunnel src/rbac.rs (Authorization::matches, matches_internal,
// StringMatch, ServiceAccountMatch) at istio/ztunnel@62d82653:
//   - A policy with no rules matches nothing (for Allow and Deny alike). So an Allow policy with no
//     rules still "applies" and therefore denies everything it does not otherwise allow.
//   - Rules are ORed; a rule with no clauses matches everything (Istio's `rules: [{}]`).
//   - A rule's clauses are ANDed; a clause with no matches holds.
//   - A clause's matches are ORed; a match whose fields are ALL empty is skipped (never matches).
//   - Within a match every field pair is ANDed. For each pair: if the positive list is non-empty,
//     some value must match; if the not_ list is non-empty, no value may match.
//   - Principal patterns are matched against the source identity with its "spiffe://" scheme
//     removed (policy values are "td/ns/x/sa/y"); a source without a spiffe:// identity (plaintext)
//     matches no principal pattern at all, not even "*". Hence not_principals: ["*"] matches
//     plaintext.
//   - String patterns (principals, namespaces): "*" = non-empty, "*abc" = suffix, "abc*" = prefix,
//     otherwise exact (Istio API: "Any string field in the rule supports Exact, Prefix, Suffix and
//     Presence match"; a leading '*' is checked before a trailing one).
//   - Namespaces are matched against the namespace from the source identity (empty for
//     plaintext, so "*" does not match plaintext).
//   - Service accounts need a source identity and compare namespace and account exactly (trust
//     domain ignored); "sa" without a namespace means the policy's own namespace (istio/api
//     security/v1beta1/authorization_policy.proto, Source.service_accounts). No wildcards.
//   - IP ranges only contain addresses of their own family (ipnet semantics: "::/0" does not
//     contain IPv4 addresses).
//   - Dry-run policies (state::Policy::dry_run) never take part in the decision. Those that apply
//     are evaluated on their own, by the same four steps over the dry-run policies only, and the
//     result is reported in Verdict::dry_run, which callers log. That is the shadow evaluation
//     Istio gives them (a separate engine of the dry-run rules); an operator reads what the
//     policies would do before enforcing them.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/ip_address.h"
#include "state/model.h"
#include "state/snapshot.h"

namespace sockmesh::policy {

// What the proxy knows about a connection when it authorizes it.
struct ConnectionFacts {
  IpAddress source_ip;
  // Peer identity from the mTLS handshake ("spiffe://td/ns/<ns>/sa/<sa>"); empty for plaintext.
  std::string source_principal;
  // Derived from source_principal by make(); empty when there is no (parsable) identity.
  std::string source_namespace;
  std::string source_service_account;
  IpAddress destination_ip;
  uint16_t destination_port = 0;

  // Fills source_namespace/source_service_account from the principal.
  static ConnectionFacts make(const IpAddress& source_ip, std::string source_principal,
                              const IpAddress& destination_ip, uint16_t destination_port);
};

struct Verdict {
  bool allowed = true;
  // Key ("namespace/name") of the deciding policy; empty when no single policy decided.
  std::string policy;
  // Short, single-line text for logs and for an HTTP status reason.
  std::string reason;
  // What the dry-run policies that apply would decide on their own; empty when none applies.
  struct DryRun {
    bool allowed = true;
    std::string policy;  // the deciding dry-run policy's key, or empty
    std::string reason;
  };
  std::optional<DryRun> dry_run;
};

// Istio L4 decision for a connection to `destination` under the policies in `snapshot`.
Verdict authorize(const state::Snapshot& snapshot, const state::Workload& destination,
                  const ConnectionFacts& facts);

// The same decision over an explicit list of applicable policies (what policies_for() returns);
// dry-run policies in it are evaluated apart, into Verdict::dry_run.
Verdict authorize(const std::vector<const state::Policy*>& applicable,
                  const ConnectionFacts& facts);

// One line for the log when dry-run policies applied, e.g. "dry run would deny: denied by policy
// ns/audit (enforced: allow)"; empty when none did.
std::string dry_run_summary(const Verdict& verdict);

// Re-check of a live connection after the snapshot changed: the destination workload is looked up
// again by uid in `current` (its selector list may have changed); if it is gone, `destination` (the
// copy the connection was accepted with) is used. Pure, like authorize().
Verdict recheck(const state::Snapshot& current, const state::Workload& destination,
                const ConnectionFacts& facts);

// True when no port of `destination` would let this source in: every port a policy names, and one
// that none names, is denied (facts.destination_port is ignored). A peer proxy whose identity is
// refused everywhere has no use for its connection.
bool denied_on_every_port(const state::Snapshot& snapshot, const state::Workload& destination,
                          ConnectionFacts facts);

// Building blocks, exposed for tests and for diagnostics.
bool policy_matches(const state::Policy& policy, const ConnectionFacts& facts);
bool match_matches(const state::PolicyMatch& match, std::string_view policy_namespace,
                   const ConnectionFacts& facts);
// Istio string pattern: "*" (non-empty), "*suffix", "prefix*", or exact.
bool string_pattern_matches(std::string_view pattern, std::string_view value);

}  // namespace sockmesh::policy
