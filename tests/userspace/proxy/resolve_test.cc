#include "proxy/resolve.h"

#include <gtest/gtest.h>

#include <map>

namespace sockmesh::proxy {
namespace {

state::Workload workload(const std::string& uid, const std::string& ip,
                         std::map<uint16_t, uint16_t> own_ports = {}) {
  state::Workload w;
  w.uid = uid;
  w.name = uid;
  w.namespace_name = "default";
  w.ips = {*IpAddress::parse(ip)};
  w.protocol = state::Protocol::kHbone;
  w.services["default/echo.default.svc.cluster.local"] = std::move(own_ports);
  return w;
}

state::Snapshot mesh() {
  state::Service svc;
  svc.name = "echo";
  svc.namespace_name = "default";
  svc.hostname = "echo.default.svc.cluster.local";
  svc.vips = {{"", *IpAddress::parse("10.96.0.10")}};
  svc.ports = {{80, 8080}, {81, 0}};
  // e3 maps service port 80 to 9090 itself: the workload's own map wins.
  return state::Snapshot({workload("e1", "10.0.0.1"), workload("e2", "10.0.0.2"),
                          workload("e3", "10.0.0.3", {{80, 9090}})},
                         {svc}, {});
}

TEST(Resolve, VipRoundRobinsOverEndpointsAndMapsPorts) {
  auto snap = mesh();
  std::map<std::string, int> hits;
  std::map<std::string, uint16_t> ports;
  for (int i = 0; i < 30; ++i) {
    Route r = resolve(snap, *Endpoint::parse("10.96.0.10:80"));
    ASSERT_TRUE(r.error.empty()) << r.error;
    ASSERT_NE(r.workload, nullptr);
    ASSERT_NE(r.service, nullptr);
    hits[r.workload->uid]++;
    ports[r.workload->uid] = r.target.port;
    EXPECT_EQ(r.target.ip, r.workload->ips.front());
  }
  EXPECT_EQ(hits, (std::map<std::string, int>{{"e1", 10}, {"e2", 10}, {"e3", 10}}));
  EXPECT_EQ(ports["e1"], 8080);
  EXPECT_EQ(ports["e3"], 9090);
}

TEST(Resolve, TargetPortZeroKeepsTheServicePort) {
  auto snap = mesh();
  Route r = resolve(snap, *Endpoint::parse("10.96.0.10:81"));
  ASSERT_TRUE(r.error.empty());
  EXPECT_EQ(r.target.port, 81);
}

TEST(Resolve, UnknownServicePortIsAnError) {
  auto snap = mesh();
  Route r = resolve(snap, *Endpoint::parse("10.96.0.10:443"));
  EXPECT_NE(r.error.find("has no port 443"), std::string::npos) << r.error;
}

TEST(Resolve, WorkloadIpIsUsedAsIs) {
  auto snap = mesh();
  Route r = resolve(snap, *Endpoint::parse("10.0.0.2:7000"));
  ASSERT_NE(r.workload, nullptr);
  EXPECT_EQ(r.workload->uid, "e2");
  EXPECT_EQ(r.service, nullptr);
  EXPECT_EQ(r.target.to_string(), "10.0.0.2:7000");
}

TEST(Resolve, OutsideTheMeshHasNoWorkload) {
  auto snap = mesh();
  Route r = resolve(snap, *Endpoint::parse("192.0.2.1:443"));
  EXPECT_EQ(r.workload, nullptr);
  EXPECT_TRUE(r.error.empty());
  EXPECT_EQ(r.target.to_string(), "192.0.2.1:443");
}

TEST(Resolve, ServiceWithoutEndpointsIsAnError) {
  state::Service svc;
  svc.name = "empty";
  svc.namespace_name = "default";
  svc.hostname = "empty.default.svc.cluster.local";
  svc.vips = {{"", *IpAddress::parse("10.96.0.11")}};
  svc.ports = {{80, 80}};
  state::Snapshot snap({}, {svc}, {});
  Route r = resolve(snap, *Endpoint::parse("10.96.0.11:80"));
  EXPECT_NE(r.error.find("no endpoints"), std::string::npos) << r.error;
}

}  // namespace
}  // namespace sockmesh::proxy
