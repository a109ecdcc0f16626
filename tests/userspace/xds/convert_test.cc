#include "xds/convert.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "xds/resources.h"

namespace sockmesh::xds {
namespace {

std::string fixture(const std::string& name) {
  const char* src = std::getenv("SOCKMESH_SOURCE_DIR");
  std::string path =
      std::string(src != nullptr ? src : ".") + "/tests/userspace/xds/fixtures/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

IpAddress ip(const char* text) { return *IpAddress::parse(text); }
IpNetwork net(const char* text) { return *IpNetwork::parse(text); }

std::string v4(const char* text) {
  auto b = ip(text).bytes16();
  return std::string(reinterpret_cast<const char*>(b.data()) + 12, 4);
}

// Bytes written by Python's protobuf (fixtures/make_fixtures.py), decoded here.
TEST(XdsDecode, WorkloadFromPythonBytes) {
  istio::workload::Address a;
  ASSERT_TRUE(a.ParseFromString(fixture("workload.bin")));
  auto r = convert_address("Kubernetes//Pod/default/client-7d4", a);
  ASSERT_TRUE(r) << r.error().to_string();
  const auto& w = std::get<state::Workload>(*r);
  EXPECT_EQ(w.uid, "Kubernetes//Pod/default/client-7d4");
  EXPECT_EQ(w.name, "client-7d4");
  EXPECT_EQ(w.namespace_name, "default");
  EXPECT_EQ(w.identity(), "spiffe://example.org/ns/default/sa/client");
  ASSERT_EQ(w.ips.size(), 2u);
  EXPECT_EQ(w.ips[0], ip("10.1.2.3"));
  EXPECT_EQ(w.ips[1], ip("fd00::3"));
  EXPECT_EQ(w.protocol, state::Protocol::kHbone);
  EXPECT_EQ(w.node, "node-a");
  EXPECT_EQ(w.canonical_name, "client");
  EXPECT_EQ(w.canonical_revision, "v1");
  EXPECT_EQ(w.services.at("default/server.default.svc.cluster.local").at(80), 8080);
  EXPECT_EQ(w.authorization_policies, std::vector<std::string>{"default/only-client"});
}

TEST(XdsDecode, ServiceFromPythonBytes) {
  istio::workload::Address a;
  ASSERT_TRUE(a.ParseFromString(fixture("service.bin")));
  auto r = convert_address("default/server.default.svc.cluster.local", a);
  ASSERT_TRUE(r) << r.error().to_string();
  const auto& s = std::get<state::Service>(*r);
  EXPECT_EQ(s.key(), "default/server.default.svc.cluster.local");
  ASSERT_EQ(s.vips.size(), 1u);
  EXPECT_EQ(s.vips[0].network, "net1");
  EXPECT_EQ(s.vips[0].ip, ip("10.96.0.10"));
  EXPECT_EQ(s.ports.at(80), 8080);
  EXPECT_EQ(s.ports.at(443), 0);
  EXPECT_EQ(s.subject_alt_names,
            std::vector<std::string>{"spiffe://cluster.local/ns/default/sa/server"});
}

TEST(XdsDecode, AuthorizationFromPythonBytes) {
  istio::security::Authorization a;
  ASSERT_TRUE(a.ParseFromString(fixture("authorization.bin")));
  auto r = convert_authorization("default/only-client", a);
  ASSERT_TRUE(r) << r.error().to_string();
  const state::Policy& p = *r;
  EXPECT_EQ(p.key(), "default/only-client");
  EXPECT_EQ(p.scope, state::PolicyScope::kWorkloadSelector);
  EXPECT_EQ(p.action, state::PolicyAction::kDeny);
  ASSERT_EQ(p.rules.size(), 1u);
  ASSERT_EQ(p.rules[0].size(), 1u);
  ASSERT_EQ(p.rules[0][0].size(), 1u);
  const auto& m = p.rules[0][0][0];
  EXPECT_EQ(m.principals, std::vector<std::string>{"cluster.local/ns/*"});
  EXPECT_EQ(m.namespaces, std::vector<std::string>{"*-prod"});
  EXPECT_EQ(m.not_namespaces, std::vector<std::string>{"*"});
  EXPECT_EQ(m.service_accounts, std::vector<std::string>{"default/client"});
  EXPECT_EQ(m.source_ips, std::vector<IpNetwork>{net("10.0.0.0/8")});
  EXPECT_EQ(m.destination_ports, (std::vector<uint16_t>{8080, 9090}));
}

istio::workload::Address good_workload() {
  istio::workload::Address a;
  auto* w = a.mutable_workload();
  w->set_uid("w1");
  w->set_namespace_("default");
  w->add_addresses(v4("10.0.0.1"));
  return a;
}

std::string error_of(const istio::workload::Address& a) {
  auto r = convert_address("w1", a);
  return r ? "" : r.error().to_string();
}

TEST(XdsConvert, ErrorsNameTheResourceAndTheField) {
  auto a = good_workload();
  EXPECT_EQ(error_of(a), "");
  a.mutable_workload()->add_addresses("abc");
  EXPECT_EQ(error_of(a),
            "resource 'w1': workload.addresses[1]: expected 4 (IPv4) or 16 (IPv6) address "
            "bytes, got 3");

  a = good_workload();
  (*a.mutable_workload()->mutable_services())["default/s"].add_ports()->set_service_port(0);
  EXPECT_EQ(error_of(a),
            "resource 'w1': workload.services[\"default/s\"].ports[0].service_port: expected a "
            "port from 1 to 65535, got 0");

  a = good_workload();
  a.mutable_workload()->mutable_waypoint()->set_hbone_mtls_port(15008);
  EXPECT_EQ(error_of(a), "resource 'w1': workload.waypoint: is not supported by sockmesh");

  a = good_workload();
  a.mutable_workload()->set_tunnel_protocol(istio::workload::LEGACY_ISTIO_MTLS);
  EXPECT_NE(error_of(a).find("workload.tunnel_protocol: LEGACY_ISTIO_MTLS"), std::string::npos);

  a = good_workload();
  a.mutable_workload()->clear_uid();
  EXPECT_EQ(error_of(a), "resource 'w1': workload.uid: must not be empty");

  EXPECT_EQ(error_of(istio::workload::Address{}),
            "resource 'w1': type: neither workload nor service is set");

  istio::workload::Address s;
  s.mutable_service()->set_name("s");
  s.mutable_service()->set_namespace_("default");
  s.mutable_service()->set_hostname("s.default.svc.cluster.local");
  auto* vip = s.mutable_service()->add_addresses();
  vip->set_address(v4("10.96.0.0"));
  vip->set_length(16);
  EXPECT_EQ(error_of(s),
            "resource 'w1': service.addresses[0].length: a CIDR VIP is not supported by sockmesh");
}

TEST(XdsConvert, PolicyErrorsAndDryRun) {
  istio::security::Authorization p;
  p.set_name("p");
  p.set_namespace_("default");
  auto* m = p.add_rules()->add_clauses()->add_matches();
  m->add_principals();  // no match type
  auto r = convert_authorization("default/p", p);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().to_string(),
            "resource 'default/p': authorization.rules[0].clauses[0].matches[0].principals[0]: no "
            "match set (exact, prefix, suffix or presence)");
  m->mutable_principals(0)->set_exact("spiffe://cluster.local/ns/a/sa/b");
  r = convert_authorization("default/p", p);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("without \"spiffe://\""), std::string::npos);
  m->mutable_principals(0)->set_exact("cluster.local/ns/a/sa/b");
  auto* src = m->add_source_ips();
  src->set_address(v4("10.0.0.0"));
  src->set_length(33);
  r = convert_authorization("default/p", p);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "authorization.rules[0].clauses[0].matches[0].source_ips[0].length");
  src->set_length(8);
  r = convert_authorization("default/p", p);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_FALSE(r->dry_run);
  p.set_dry_run(true);
  r = convert_authorization("default/p", p);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->dry_run) << "a dry-run policy is held, marked, and never enforced";
}

envoy::service::discovery::v3::DeltaDiscoveryResponse response(
    const std::string& type,
    const std::vector<std::pair<std::string, istio::workload::Address>>& add,
    const std::vector<std::string>& removed = {}) {
  envoy::service::discovery::v3::DeltaDiscoveryResponse r;
  r.set_type_url(type);
  for (const auto& [name, a] : add) {
    auto* res = r.add_resources();
    res->set_name(name);
    res->set_version("v-" + name);
    res->mutable_resource()->PackFrom(a);
  }
  for (const auto& n : removed) r.add_removed_resources(n);
  return r;
}

TEST(XdsResources, ResponsesApplyAllOrNothing) {
  XdsResources set;
  auto w1 = good_workload();
  auto w2 = good_workload();
  w2.mutable_workload()->set_uid("w2");
  w2.mutable_workload()->set_addresses(0, v4("10.0.0.2"));
  ASSERT_TRUE(set.apply(response(kAddressType, {{"w1", w1}})));
  EXPECT_EQ(set.workload_count(), 1u);

  auto bad = good_workload();
  bad.mutable_workload()->set_addresses(0, "x");
  auto r = set.apply(response(kAddressType, {{"w2", w2}, {"bad", bad}}, {"w1"}));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().resource, "bad");
  EXPECT_EQ(set.workload_count(), 1u);
  EXPECT_NE(set.snapshot()->workload_by_uid("w1"), nullptr) << "the NACKed removal did not apply";
  EXPECT_EQ(set.snapshot()->workload_by_uid("w2"), nullptr);

  auto ok = set.apply(response(kAddressType, {{"w2", w2}}, {"w1", "never-held"}));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->changed, 1u);
  EXPECT_EQ(ok->removed, 1u);
  EXPECT_EQ(set.snapshot()->workload_by_ip(ip("10.0.0.2"))->uid, "w2");
  EXPECT_EQ(set.versions(kAddressType), (std::map<std::string, std::string>{{"w2", "v-w2"}}));

  // An Address where an Authorization was subscribed is refused by its type URL.
  auto wrong = response(kAuthorizationType, {{"w3", w1}});
  r = set.apply(wrong);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "resource.type_url");
  r = set.apply(response("type.googleapis.com/other", {}));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "type_url");
}

}  // namespace
}  // namespace sockmesh::xds
