#include "config/local_config.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>

#include <filesystem>
#include <fstream>
#include <string>

namespace sockmesh::config {
namespace {

using state::PolicyAction;
using state::PolicyScope;
using state::Protocol;

IpAddress ip(const char* text) { return *IpAddress::parse(text); }
IpNetwork net(const char* text) { return *IpNetwork::parse(text); }

state::SnapshotPtr parse_ok(const std::string& yaml) {
  ParseResult r = parse_local_config(yaml, "test.yaml");
  if (const ConfigError* e = error_of(r)) {
    ADD_FAILURE() << "unexpected error: " << e->to_string();
    return nullptr;
  }
  return snapshot_of(r);
}

ConfigError parse_err(const std::string& yaml) {
  ParseResult r = parse_local_config(yaml, "bad.yaml");
  if (const ConfigError* e = error_of(r)) return *e;
  ADD_FAILURE() << "expected an error for:\n" << yaml;
  return {};
}

// Line numbers in these documents are part of the assertions: every raw string starts its first
// line right after the opening delimiter.
constexpr const char* kFull = R"(namespaces:
- name: default
  labels:
    istio.io/dataplane-mode: ambient
    team: "blue"
- name: other
workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client-sa
  trustDomain: example.org
  workloadIps: ["127.0.10.1", "fd00::10"]
  protocol: HBONE
  node: node-a
  network: net1
  workloadName: client-deploy
  canonicalName: client-app
  canonicalRevision: v2
  clusterId: cluster1
  authorizationPolicies: ["default/select-client"]
  labels:
    app: client
    version: "2"
- uid: cluster1//v1/Pod/default/server
  name: server
  namespace: default
  workloadIps:
  - 127.0.20.1
  protocol: TCP
  node: node-b
  services:
    "default/echo.default.svc.cluster.local":
      80: 8080
      443: 8443
    "default/other.default.svc.cluster.local": {}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/127.0.30.1", "net1/fd00::30"]
  ports:
    80: 8080
    443: 0
  subjectAltNames:
  - spiffe://cluster.local/ns/default/sa/echo
policies:
- name: select-client
  namespace: default
  scope: WorkloadSelector
  action: Deny
  rules:
  - - - namespaces: [!Exact other, !Prefix "team-", !Suffix "-prod", !Presence [], "plain"]
        notNamespaces: ["kube-*"]
        principals: [!Exact cluster.local/ns/default/sa/a, "*"]
        notPrincipals: [!Prefix cluster.local/ns/bad/]
        serviceAccounts:
        - {namespace: default, serviceAccount: a}
        - default/b
        notServiceAccounts: [c]
        sourceIps: ["10.0.0.0/8", "127.0.10.1"]
        notSourceIps: ["fd00::/64"]
        destinationIps: ["127.0.20.1/32"]
        notDestinationIps: ["192.168.1.7"]
        destinationPorts: [8080, 9090]
        notDestinationPorts: [22]
      - sourceIps: ["127.0.0.0/8"]
    - - destinationPorts: [80]
  - []
- name: ns-allow
  namespace: default
  scope: Namespace
  action: Allow
  rules: []
  dryRun: false
- name: global
  namespace: istio-system
  scope: Global
  action: Allow
  rules: [[[{}]]]
)";

TEST(LocalConfig, ParsesEveryWorkloadField) {
  auto snap = parse_ok(kFull);
  ASSERT_TRUE(snap);
  ASSERT_EQ(snap->workloads().size(), 2u);
  const state::Workload& c = snap->workloads()[0];
  EXPECT_EQ(c.uid, "cluster1//v1/Pod/default/client");
  EXPECT_EQ(c.name, "client");
  EXPECT_EQ(c.namespace_name, "default");
  EXPECT_EQ(c.service_account, "client-sa");
  EXPECT_EQ(c.trust_domain, "example.org");
  EXPECT_EQ(c.ips, (std::vector<IpAddress>{ip("127.0.10.1"), ip("fd00::10")}));
  EXPECT_EQ(c.protocol, Protocol::kHbone);
  EXPECT_EQ(c.node, "node-a");
  EXPECT_EQ(c.network, "net1");
  EXPECT_EQ(c.workload_name, "client-deploy");
  EXPECT_EQ(c.canonical_name, "client-app");
  EXPECT_EQ(c.canonical_revision, "v2");
  EXPECT_EQ(c.cluster_id, "cluster1");
  EXPECT_EQ(c.authorization_policies, std::vector<std::string>{"default/select-client"});
  EXPECT_EQ(c.labels, (std::map<std::string, std::string>{{"app", "client"}, {"version", "2"}}));
  EXPECT_TRUE(c.services.empty());
  EXPECT_EQ(c.identity(), "spiffe://example.org/ns/default/sa/client-sa");

  const state::Workload& s = snap->workloads()[1];
  EXPECT_EQ(s.protocol, Protocol::kTcp);
  EXPECT_EQ(s.ips, std::vector<IpAddress>{ip("127.0.20.1")});
  ASSERT_EQ(s.services.size(), 2u);
  EXPECT_EQ(s.services.at("default/echo.default.svc.cluster.local"),
            (std::map<uint16_t, uint16_t>{{80, 8080}, {443, 8443}}));
  EXPECT_TRUE(s.services.at("default/other.default.svc.cluster.local").empty());

  // The snapshot's indexes see what the parser produced.
  EXPECT_EQ(snap->workload_by_ip(ip("fd00::10")), &c);
  EXPECT_EQ(snap->workload_by_uid("cluster1//v1/Pod/default/server"), &s);
}

TEST(LocalConfig, AppliesDefaultsForOmittedWorkloadFields) {
  auto snap = parse_ok(R"(workloads:
- uid: u1
  name: plain
  namespace: ns1
  workloadIps: []
- uid: u2
  namespace: ns1
  serviceAccount: ""
  trustDomain: ""
  clusterId: ""
  workloadIps: [10.1.1.1]
)");
  ASSERT_TRUE(snap);
  const auto& w = snap->workloads()[0];
  EXPECT_EQ(w.service_account, "default");
  EXPECT_EQ(w.trust_domain, "cluster.local");
  EXPECT_EQ(w.cluster_id, "Kubernetes");
  EXPECT_EQ(w.workload_name, "plain");  // falls back to name
  EXPECT_EQ(w.protocol, Protocol::kTcp);
  EXPECT_TRUE(w.ips.empty());
  const auto& w2 = snap->workloads()[1];
  EXPECT_EQ(w2.service_account, "default");
  EXPECT_EQ(w2.trust_domain, "cluster.local");
  EXPECT_EQ(w2.cluster_id, "Kubernetes");
  EXPECT_EQ(w2.name, "");
  EXPECT_EQ(w2.identity(), "spiffe://cluster.local/ns/ns1/sa/default");
}

TEST(LocalConfig, ParsesServices) {
  auto snap = parse_ok(kFull);
  ASSERT_TRUE(snap);
  ASSERT_EQ(snap->services().size(), 1u);
  const state::Service& svc = snap->services()[0];
  EXPECT_EQ(svc.name, "echo");
  EXPECT_EQ(svc.namespace_name, "default");
  EXPECT_EQ(svc.hostname, "echo.default.svc.cluster.local");
  ASSERT_EQ(svc.vips.size(), 2u);
  EXPECT_EQ(svc.vips[0], (state::ServiceVip{"", ip("127.0.30.1")}));
  EXPECT_EQ(svc.vips[1], (state::ServiceVip{"net1", ip("fd00::30")}));
  EXPECT_EQ(svc.ports, (std::map<uint16_t, uint16_t>{{80, 8080}, {443, 0}}));
  EXPECT_EQ(svc.subject_alt_names,
            std::vector<std::string>{"spiffe://cluster.local/ns/default/sa/echo"});
  EXPECT_EQ(snap->service_by_vip(ip("127.0.30.1")), &svc);
  EXPECT_EQ(snap->service_by_key("default/echo.default.svc.cluster.local"), &svc);
  auto eps = snap->endpoints_of(svc);
  ASSERT_EQ(eps.size(), 1u);
  EXPECT_EQ(eps[0]->name, "server");
}

TEST(LocalConfig, ParsesPoliciesAndEveryMatchField) {
  auto snap = parse_ok(kFull);
  ASSERT_TRUE(snap);
  ASSERT_EQ(snap->policies().size(), 3u);
  const state::Policy& p = snap->policies()[0];
  EXPECT_EQ(p.name, "select-client");
  EXPECT_EQ(p.namespace_name, "default");
  EXPECT_EQ(p.scope, PolicyScope::kWorkloadSelector);
  EXPECT_EQ(p.action, PolicyAction::kDeny);
  // Two rules; the first has two clauses (two matches, then one); the second has none.
  ASSERT_EQ(p.rules.size(), 2u);
  ASSERT_EQ(p.rules[0].size(), 2u);
  ASSERT_EQ(p.rules[0][0].size(), 2u);
  ASSERT_EQ(p.rules[0][1].size(), 1u);
  EXPECT_TRUE(p.rules[1].empty());

  const state::PolicyMatch& m = p.rules[0][0][0];
  EXPECT_EQ(m.namespaces, (std::vector<std::string>{"other", "team-*", "*-prod", "*", "plain"}));
  EXPECT_EQ(m.not_namespaces, std::vector<std::string>{"kube-*"});
  EXPECT_EQ(m.principals, (std::vector<std::string>{"cluster.local/ns/default/sa/a", "*"}));
  EXPECT_EQ(m.not_principals, std::vector<std::string>{"cluster.local/ns/bad/*"});
  EXPECT_EQ(m.service_accounts, (std::vector<std::string>{"default/a", "default/b"}));
  EXPECT_EQ(m.not_service_accounts, std::vector<std::string>{"c"});
  EXPECT_EQ(m.source_ips, (std::vector<IpNetwork>{net("10.0.0.0/8"), net("127.0.10.1/32")}));
  EXPECT_EQ(m.not_source_ips, std::vector<IpNetwork>{net("fd00::/64")});
  EXPECT_EQ(m.destination_ips, std::vector<IpNetwork>{net("127.0.20.1")});
  EXPECT_EQ(m.not_destination_ips, std::vector<IpNetwork>{net("192.168.1.7/32")});
  EXPECT_EQ(m.destination_ports, (std::vector<uint16_t>{8080, 9090}));
  EXPECT_EQ(m.not_destination_ports, std::vector<uint16_t>{22});
  EXPECT_EQ(p.rules[0][0][1].source_ips, std::vector<IpNetwork>{net("127.0.0.0/8")});
  EXPECT_EQ(p.rules[0][1][0].destination_ports, std::vector<uint16_t>{80});

  EXPECT_EQ(snap->policies()[1].scope, PolicyScope::kNamespace);
  EXPECT_EQ(snap->policies()[1].action, PolicyAction::kAllow);
  EXPECT_TRUE(snap->policies()[1].rules.empty());
  EXPECT_EQ(snap->policies()[2].scope, PolicyScope::kGlobal);
  EXPECT_EQ(snap->policies()[2].key(), "istio-system/global");
  // An empty match is kept as written; ztunnel skips it when evaluating.
  ASSERT_EQ(snap->policies()[2].rules.size(), 1u);
  ASSERT_EQ(snap->policies()[2].rules[0].size(), 1u);
  ASSERT_EQ(snap->policies()[2].rules[0][0].size(), 1u);

  // The workload selector ties the client to its policy.
  auto applied = snap->policies_for(snap->workloads()[0]);
  ASSERT_EQ(applied.size(), 3u);
  EXPECT_EQ(applied[0]->name, "select-client");
}

TEST(LocalConfig, ParsesNamespacesExtension) {
  auto snap = parse_ok(kFull);
  ASSERT_TRUE(snap);
  ASSERT_EQ(snap->namespaces().size(), 2u);
  const state::Namespace* ns = snap->namespace_by_name("default");
  ASSERT_NE(ns, nullptr);
  EXPECT_EQ(ns->labels, (std::map<std::string, std::string>{{"istio.io/dataplane-mode", "ambient"},
                                                            {"team", "blue"}}));
  ASSERT_NE(snap->namespace_by_name("other"), nullptr);
  EXPECT_TRUE(snap->namespace_by_name("other")->labels.empty());
}

// The shape ztunnel's own example uses, including fields sockmesh accepts and does not use.
TEST(LocalConfig, AcceptsZtunnelOnlyFieldsThatRequestNothingUnsupported) {
  auto snap = parse_ok(R"(workloads:
- uid: cluster1//v1/Pod/default/local
  name: local
  namespace: default
  serviceAccount: default
  workloadIps: ["127.0.0.1"]
  protocol: HBONE
  node: local
  network: ""
  workloadType: deployment
  hostname: ""
  status: Healthy
  networkMode: Standard
  nativeTunnel: false
  capacity: 3
  locality: {region: r1, zone: z1}
  waypoint: ~
  services:
    "default/example.com":
      80: 8080
policies:
- action: Allow
  rules:
  - - - notDestinationPorts:
        - 9999
  name: deny-9999
  namespace: default
  scope: Namespace
  dryRun: false
services:
- name: local
  namespace: default
  hostname: example.com
  vips:
  - /127.10.0.1
  ports:
    80: 8080
  canonical: true
  visibility: Public
  ipFamilies: IPv4
  endpoints: {}
  cidrVips: []
)");
  ASSERT_TRUE(snap);
  EXPECT_EQ(snap->workloads().size(), 1u);
  EXPECT_EQ(snap->services().size(), 1u);
  ASSERT_EQ(snap->policies().size(), 1u);
  EXPECT_EQ(snap->policies()[0].rules[0][0][0].not_destination_ports, std::vector<uint16_t>{9999});
}

TEST(LocalConfig, KeepsDryRunPoliciesMarked) {
  auto snap = parse_ok(R"(policies:
- {name: shadow, namespace: default, scope: Namespace, action: Deny, rules: [], dryRun: true}
- {name: real, namespace: default, scope: Namespace, action: Deny, rules: []}
)");
  ASSERT_TRUE(snap);
  ASSERT_EQ(snap->policies().size(), 2u);
  EXPECT_EQ(snap->policies()[0].name, "shadow");
  EXPECT_TRUE(snap->policies()[0].dry_run);
  EXPECT_EQ(snap->policies()[1].name, "real");
  EXPECT_FALSE(snap->policies()[1].dry_run);
}

TEST(LocalConfig, EmptyDocumentsGiveEmptySnapshots) {
  for (const char* yaml : {"", "# only a comment\n", "---\n", "workloads:\nservices:\npolicies:\n",
                           "workloads: []\n"}) {
    auto snap = parse_ok(yaml);
    ASSERT_TRUE(snap) << yaml;
    EXPECT_TRUE(snap->workloads().empty());
    EXPECT_TRUE(snap->services().empty());
    EXPECT_TRUE(snap->policies().empty());
  }
}

TEST(LocalConfig, EmbeddedDefaultDescribesTheTwoNodeDemo) {
  auto snap = parse_ok(embedded_default_config());
  ASSERT_TRUE(snap);
  const state::Workload* client = snap->workload_by_ip(ip("127.0.10.1"));
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->node, "node-a");
  EXPECT_EQ(client->namespace_name, "default");
  const state::Workload* server = snap->workload_by_ip(ip("127.0.20.1"));
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->node, "node-b");
  EXPECT_EQ(server->protocol, Protocol::kHbone);
  for (const auto& w : snap->workloads()) {
    for (const auto& a : w.ips) EXPECT_TRUE(a.is_loopback()) << a.to_string();
  }
  const state::Service* echo = snap->service_by_vip(ip("127.0.30.1"));
  ASSERT_NE(echo, nullptr);
  EXPECT_EQ(echo->hostname, "echo.default.svc.cluster.local");
  EXPECT_EQ(echo->ports, (std::map<uint16_t, uint16_t>{{80, 8080}}));
  auto eps = snap->endpoints_of(*echo);
  ASSERT_EQ(eps.size(), 1u);
  EXPECT_EQ(eps[0], server);
  ASSERT_NE(snap->namespace_by_name("default"), nullptr);
  EXPECT_EQ(snap->namespace_by_name("default")->labels.at("istio.io/dataplane-mode"), "ambient");
}

TEST(ConfigError, FormatsFileLineColumnFieldAndMessage) {
  EXPECT_EQ((ConfigError{"a.yaml", 3, 7, "workloads[0].uid", "bad"}).to_string(),
            "a.yaml:3:7: workloads[0].uid: bad");
  EXPECT_EQ((ConfigError{"a.yaml", 0, 0, "", "cannot read"}).to_string(), "a.yaml: cannot read");
}

// One invalid document per kind of mistake: where the error points and what it says.
struct BadCase {
  const char* name;
  const char* yaml;
  int line;
  int column;  // 0: not checked
  const char* field;
  const char* message_part;
};

class InvalidConfig : public ::testing::TestWithParam<BadCase> {};

TEST_P(InvalidConfig, NamesFileLineAndField) {
  const BadCase& c = GetParam();
  ConfigError e = parse_err(c.yaml);
  EXPECT_EQ(e.file, "bad.yaml");
  EXPECT_EQ(e.line, c.line) << e.to_string();
  if (c.column != 0) {
    EXPECT_EQ(e.column, c.column) << e.to_string();
  }
  EXPECT_EQ(e.field, c.field) << e.to_string();
  EXPECT_NE(e.message.find(c.message_part), std::string::npos) << e.to_string();
}

constexpr const char* kTwoWorkloads = R"(workloads:
- uid: a
  namespace: default
  workloadIps: [127.0.0.1]
- uid: b
  namespace: default
)";

const BadCase kBadCases[] = {
    {"UnknownTopLevelField", "workloads: []\nwrokloads: []\n", 2, 1, "wrokloads", "unknown field"},
    {"UnknownWorkloadField",
     R"(workloads:
- uid: a
  namespace: default
  workloadIps: []
- uid: b
  namespace: default
  workloadIps: []
  serviceAcount: x
)",
     8, 3, "workloads[1].serviceAcount", "unknown field"},
    {"BadWorkloadIp",
     R"(workloads:
- uid: a
  namespace: default
  workloadIps: [127.0.0.1]
- uid: b
  namespace: default
  workloadIps: ["10.0.0.256"]
)",
     7, 17, "workloads[1].workloadIps[0]", "'10.0.0.256' is not an IP address"},
    {"WorkloadIpsNotAList", "workloads:\n- uid: a\n  namespace: d\n  workloadIps: 10.0.0.1\n", 4,
     16, "workloads[0].workloadIps", "expected a list"},
    {"StringFieldGivenAList", "workloads:\n- uid: a\n  namespace: [d]\n  workloadIps: []\n", 3, 14,
     "workloads[0].namespace", "expected a string"},
    {"MissingRequiredField", "workloads:\n- uid: a\n  workloadIps: []\n", 2, 3,
     "workloads[0].namespace", "missing required field"},
    {"EmptyRequiredValue", "workloads:\n- uid: a\n  namespace:\n  workloadIps: []\n", 3, 3,
     "workloads[0].namespace", "must not be empty"},
    {"UnknownProtocol",
     "workloads:\n- uid: a\n  namespace: d\n  workloadIps: []\n  protocol: HTTP\n", 5, 13,
     "workloads[0].protocol", "unknown value 'HTTP'; expected one of HBONE, TCP"},
    {"ProtocolIsCaseSensitive",
     "workloads:\n- uid: a\n  namespace: d\n  workloadIps: []\n  protocol: hbone\n", 5, 13,
     "workloads[0].protocol", "unknown value 'hbone'"},
    {"DuplicateWorkloadUid",
     R"(workloads:
- uid: same
  namespace: default
  workloadIps: [127.0.0.1]
- uid: same
  namespace: default
  workloadIps: [127.0.0.2]
)",
     5, 8, "workloads[1].uid", "duplicate workload uid 'same' (first at line 2)"},
    {"DuplicateIpAcrossWorkloads",
     R"(workloads:
- uid: a
  namespace: default
  workloadIps: [127.0.0.1]
- uid: b
  namespace: default
  workloadIps:
  - 127.0.0.9
  - 127.0.0.1
)",
     9, 5, "workloads[1].workloadIps[1]", "127.0.0.1 is already used by workload 'a' (line 4)"},
    {"SameIpSpelledDifferently",
     R"(workloads:
- uid: a
  namespace: default
  workloadIps: ["fd00::1"]
- uid: b
  namespace: default
  workloadIps: ["fd00:0::1"]
)",
     7, 17, "workloads[1].workloadIps[0]", "already used by workload 'a'"},
    {"WorkloadServiceKeyWithoutNamespace",
     "workloads:\n- uid: a\n  namespace: d\n  workloadIps: []\n  services:\n    echo: {80: 8080}\n",
     6, 5, "workloads[0].services[\"echo\"]", "expected \"namespace/hostname\""},
    {"WorkloadTargetPortOutOfRange",
     "workloads:\n- uid: a\n  namespace: d\n  workloadIps: []\n  services:\n"
     "    d/echo:\n      80: 65536\n",
     7, 11, "workloads[0].services[\"d/echo\"][80]", "65536 is out of range (at most 65535)"},
    {"AuthorizationPolicyNotNamespaced",
     "workloads:\n- uid: a\n  namespace: d\n  workloadIps: []\n  authorizationPolicies: [p]\n", 5,
     27, "workloads[0].authorizationPolicies[0]", "expected \"namespace/name\""},
    {"WaypointIsUnsupported",
     "workloads:\n- uid: a\n  namespace: d\n  workloadIps: []\n"
     "  waypoint: {destination: /10.0.0.1, hboneMtlsPort: 15008}\n",
     5, 13, "workloads[0].waypoint", "not supported by sockmesh"},
    {"UnhealthyIsUnsupported",
     "workloads:\n- uid: a\n  namespace: d\n  workloadIps: []\n  status: Unhealthy\n", 5, 11,
     "workloads[0].status", "Unhealthy is not supported"},
    {"DuplicateFieldInARecord",
     "workloads:\n- uid: a\n  namespace: d\n  workloadIps: []\n  uid: b\n", 5, 3,
     "workloads[0].uid", "duplicate field (first at line 2)"},
    {"ServiceVipNotAnIp",
     R"(services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/127.0.30.1", "/echo.local"]
  ports: {80: 8080}
)",
     5, 25, "services[0].vips[1]", "'echo.local' is not an IP address"},
    {"ServiceVipWithoutNetwork",
     R"(services:
- name: echo
  namespace: default
  hostname: h
  vips: [127.0.30.1]
  ports: {80: 8080}
)",
     5, 10, "services[0].vips[0]", "expected \"network/IP\""},
    {"ServicePortOutOfRange",
     R"(services:
- name: echo
  namespace: default
  hostname: h
  vips: []
  ports:
    80: 8080
    70000: 8080
)",
     8, 5, "services[0].ports[70000]", "70000 is out of range"},
    {"ServicePortZero",
     "services:\n- {name: e, namespace: d, hostname: h, vips: [], ports: {0: 80}}\n", 2, 58,
     "services[0].ports[0]", "port 0 is out of range"},
    {"QuotedPortIsAString",
     "services:\n- {name: e, namespace: d, hostname: h, vips: [], ports: {80: \"8080\"}}\n", 2, 62,
     "services[0].ports[80]", "expected an integer"},
    {"NegativePort",
     "services:\n- {name: e, namespace: d, hostname: h, vips: [], ports: {80: -1}}\n", 2, 62,
     "services[0].ports[80]", "expected an integer, got '-1'"},
    {"ServiceMissingPorts", "services:\n- {name: e, namespace: d, hostname: h, vips: []}\n", 2, 3,
     "services[0].ports", "missing required field"},
    {"DuplicateServiceVip",
     "services:\n- {name: a, namespace: d, hostname: a, vips: [/10.0.0.1], ports: {}}\n"
     "- {name: b, namespace: d, hostname: b, vips: [net/10.0.0.1], ports: {}}\n",
     3, 47, "services[1].vips[0]", "already a VIP of service 'd/a' (line 2)"},
    {"DuplicateService",
     "services:\n- {name: a, namespace: d, hostname: h, vips: [], ports: {}}\n"
     "- {name: b, namespace: d, hostname: h, vips: [], ports: {}}\n",
     3, 37, "services[1].hostname", "duplicate service 'd/h'"},
    {"UnknownScope",
     "policies:\n- name: p\n  namespace: d\n  scope: Cluster\n  action: Allow\n  rules: []\n", 4,
     10, "policies[0].scope", "expected one of Global, Namespace, WorkloadSelector"},
    {"UnknownAction",
     "policies:\n- name: p\n  namespace: d\n  scope: Global\n  action: Audit\n  rules: []\n", 5, 11,
     "policies[0].action", "expected one of Allow, Deny"},
    {"PolicyMissingRules",
     "policies:\n- name: p\n  namespace: d\n  scope: Global\n  action: Allow\n", 2, 3,
     "policies[0].rules", "missing required field"},
    {"DryRunIsYaml12Boolean",
     "policies:\n- {name: p, namespace: d, scope: Global, action: Allow, rules: [], dryRun: yes}\n",
     2, 76, "policies[0].dryRun", "expected true or false"},
    {"BadSourceCidr",
     R"(policies:
- name: p
  namespace: d
  scope: Namespace
  action: Deny
  rules:
  - - - sourceIps: [10.0.0.0/8, 10.0.0.0/33]
)",
     7, 33, "policies[0].rules[0][0][0].sourceIps[1]", "not an IP address or CIDR range"},
    {"PolicyPortZero",
     R"(policies:
- name: p
  namespace: d
  scope: Namespace
  action: Deny
  rules:
  - - - destinationPorts: [80]
    - - notDestinationPorts: [0]
)",
     8, 31, "policies[0].rules[0][1][0].notDestinationPorts[0]", "port 0 is out of range"},
    {"UnknownMatchField",
     R"(policies:
- name: p
  namespace: d
  scope: Namespace
  action: Deny
  rules:
  - - - sourceIp: [10.0.0.1]
)",
     7, 9, "policies[0].rules[0][0][0].sourceIp", "unknown field"},
    {"ClauseNotAList",
     R"(policies:
- name: p
  namespace: d
  scope: Namespace
  action: Deny
  rules:
  - - sourceIps: [10.0.0.1]
)",
     7, 7, "policies[0].rules[0][0]", "expected a list"},
    {"StringMatchAsMap",
     R"(policies:
- name: p
  namespace: d
  scope: Namespace
  action: Deny
  rules:
  - - - namespaces: [{Exact: x}]
)",
     7, 22, "policies[0].rules[0][0][0].namespaces[0]", "tagged value"},
    {"UnknownStringMatchTag",
     R"(policies:
- name: p
  namespace: d
  scope: Namespace
  action: Deny
  rules:
  - - - principals: [!Regex "a.*"]
)",
     7, 22, "policies[0].rules[0][0][0].principals[0]", "unknown tag '!Regex'"},
    {"WildcardInTheMiddle",
     R"(policies:
- name: p
  namespace: d
  scope: Namespace
  action: Deny
  rules:
  - - - principals: ["cluster.local/*/sa/x"]
)",
     7, 22, "policies[0].rules[0][0][0].principals[0]", "'*' is only allowed"},
    {"PrincipalWithSpiffeScheme",
     R"(policies:
- name: p
  namespace: d
  scope: Namespace
  action: Deny
  rules:
  - - - principals: [!Exact spiffe://cluster.local/ns/d/sa/x]
)",
     7, 22, "policies[0].rules[0][0][0].principals[0]", "without \"spiffe://\""},
    {"ServiceAccountMatchMissingName",
     R"(policies:
- name: p
  namespace: d
  scope: Namespace
  action: Deny
  rules:
  - - - serviceAccounts:
        - namespace: d
)",
     8, 11, "policies[0].rules[0][0][0].serviceAccounts[0].serviceAccount",
     "missing required field"},
    {"DuplicatePolicy",
     "policies:\n- {name: p, namespace: d, scope: Global, action: Allow, rules: []}\n"
     "- {name: p, namespace: d, scope: Global, action: Deny, rules: []}\n",
     3, 10, "policies[1].name", "duplicate policy 'd/p' (first at line 2)"},
    {"NamespaceWithoutName", "namespaces:\n- labels: {a: b}\n", 2, 3, "namespaces[0].name",
     "missing required field"},
    {"DuplicateNamespace", "namespaces:\n- name: a\n- name: a\n", 3, 9, "namespaces[1].name",
     "duplicate namespace 'a'"},
    {"WorkloadsIsAMapping", "workloads:\n  uid: a\n", 2, 3, "workloads", "expected a list"},
    {"RootIsAList", "- a\n- b\n", 1, 1, "", "expected a mapping"},
    {"YamlSyntaxError", "workloads:\n- uid: a\n  namespace: [d\n  workloadIps: []\n", 4, 0, "",
     "invalid YAML"},
    {"MultipleDocuments", "workloads: []\n---\nservices: []\n", 3, 1, "",
     "expected one YAML document"},
    // Found by the local_config fuzz target: yaml-cpp 0.7's LoadAll looped forever on these,
    // allocating an empty document per round (jbeder/yaml-cpp#1040).
    {"StrayCommaAfterATag", "!canonicalNameuid,:0u1", 1, 0, "", "malformed YAML"},
    {"StrayCommaAfterAnAnchor", "&a ,\n", 1, 0, "", "malformed YAML"},
    {"StrayComma", ",\n", 1, 0, "", "malformed YAML"},
};

INSTANTIATE_TEST_SUITE_P(Cases, InvalidConfig, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return std::string(info.param.name);
                         });

// A FIFO named as the config file: opening it for reading used to wait for a writer forever
// (the start-up, or the watcher's thread, hung). It is refused at once, with a clear reason.
TEST(LocalConfig, RefusesAFifoWithoutBlocking) {
  auto path = std::filesystem::temp_directory_path() /
              ("sockmesh-config-fifo-" + std::to_string(getpid()) + ".yaml");
  std::filesystem::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto result =
      std::async(std::launch::async, [&] { return load_local_config_file(path.string()); });
  if (result.wait_for(std::chrono::seconds(3)) != std::future_status::ready) {
    // Release the blocked reader so that the test ends, then fail.
    int w = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
    result.wait();
    std::filesystem::remove(path);
    FAIL() << "reading a FIFO as the config file blocked for 3 s";
  }
  auto r = result.get();
  std::filesystem::remove(path);
  const ConfigError* err = error_of(r);
  ASSERT_NE(err, nullptr);
  EXPECT_NE(err->to_string().find("not a regular file"), std::string::npos) << err->to_string();
}

TEST(LocalConfig, ReportsTheFirstErrorOnly) {
  // A second workload is missing its IPs too, but the error is about the first one.
  ConfigError e = parse_err(kTwoWorkloads + std::string("- uid: a\n  namespace: x\n"));
  EXPECT_EQ(e.field, "workloads[1].workloadIps");
  EXPECT_EQ(e.line, 5);
}

TEST(LocalConfig, RejectsAliasExpansionBombs) {
  // A port list, a clause and a rule each named 300 times: 300^4 ports from about 12 KB.
  auto repeat = [](const std::string& item) {
    std::string out = "[";
    for (int i = 0; i < 300; ++i) out += (i ? ", " : "") + item;
    return out + "]";
  };
  std::string doc =
      "policies:\n- name: p\n  namespace: d\n  scope: Global\n  action: Allow\n"
      "  rules:\n"
      "  - &rule\n"
      "    - &clause\n"
      "      - destinationPorts: &ports " +
      repeat("1") + "\n" + "      - " + "{destinationPorts: *ports}\n";
  // Widen each level by aliasing the one below.
  doc += "    - " + repeat("{destinationPorts: *ports}") + "\n";
  doc += "  - " + repeat("*clause") + "\n";
  doc +=
      "- name: q\n  namespace: d\n  scope: Global\n  action: Allow\n  rules: " + repeat("*rule") +
      "\n";
  ConfigError e = parse_err(doc);
  EXPECT_NE(e.message.find("expands too much"), std::string::npos) << e.to_string();
}

class LoadFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sm_config_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(LoadFile, ParsesAFile) {
  std::string path = write("ok.yaml", embedded_default_config());
  ParseResult r = load_local_config_file(path);
  ASSERT_FALSE(error_of(r)) << error_of(r)->to_string();
  EXPECT_EQ(snapshot_of(r)->workloads().size(), 2u);
}

TEST_F(LoadFile, ErrorsNameThePath) {
  std::string path = write("bad.yaml", "workloads:\n- uid: a\n  namespace: d\n  bogus: 1\n");
  ParseResult r = load_local_config_file(path);
  const ConfigError* e = error_of(r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->file, path);
  EXPECT_EQ(e->line, 4);
  EXPECT_EQ(e->to_string(), path + ":4:3: workloads[0].bogus: unknown field");
}

TEST_F(LoadFile, MissingFileAndDirectoryAreErrors) {
  ParseResult r = load_local_config_file(dir_ + "/absent.yaml");
  ASSERT_TRUE(error_of(r));
  EXPECT_EQ(error_of(r)->line, 0);
  EXPECT_NE(error_of(r)->message.find("No such file"), std::string::npos);
  ParseResult d = load_local_config_file(dir_);
  ASSERT_TRUE(error_of(d));
  EXPECT_NE(error_of(d)->message.find("directory"), std::string::npos);
}

}  // namespace
}  // namespace sockmesh::config
