#include "dns/names.h"

#include <gtest/gtest.h>

#include "dns/message.h"

namespace sockmesh::dns {
namespace {

IpAddress ip(const char* s) { return *IpAddress::parse(s); }

state::Snapshot mesh() {
  state::Service echo;
  echo.name = "echo";
  echo.namespace_name = "shop";
  echo.hostname = "echo.shop.svc.cluster.local";
  echo.vips = {{"", ip("10.96.0.20")}, {"", ip("fd00:96::20")}};
  state::Service v4only;
  v4only.name = "legacy";
  v4only.namespace_name = "shop";
  v4only.hostname = "legacy.shop.svc.cluster.local";
  v4only.vips = {{"", ip("10.96.0.21")}};
  state::Service external;
  external.name = "api";
  external.namespace_name = "shop";
  external.hostname = "api.example.com";
  external.vips = {{"", ip("240.240.0.1")}};
  state::Workload db;
  db.uid = "db";
  db.name = "db-0";
  db.namespace_name = "shop";
  db.hostname = "db-0.db.shop.svc.cluster.local";
  db.ips = {ip("10.0.1.5")};
  return state::Snapshot({db}, {echo, v4only, external}, {});
}

TEST(DnsNames, FullNameAnswersWithVips) {
  auto snap = mesh();
  NameTable t(snap);
  auto a = t.lookup("echo.shop.svc.cluster.local", kTypeA, "");
  EXPECT_TRUE(a.known);
  ASSERT_EQ(a.addresses.size(), 1u);
  EXPECT_EQ(a.addresses[0], ip("10.96.0.20"));
  auto aaaa = t.lookup("echo.shop.svc.cluster.local", kTypeAAAA, "other");
  ASSERT_EQ(aaaa.addresses.size(), 1u);
  EXPECT_EQ(aaaa.addresses[0], ip("fd00:96::20"));
}

TEST(DnsNames, ShortFormsFollowTheClientsSearchPath) {
  auto snap = mesh();
  NameTable t(snap);
  for (const char* n : {"echo", "echo.shop", "echo.shop.svc"}) {
    auto a = t.lookup(n, kTypeA, "shop");
    EXPECT_TRUE(a.known) << n;
    EXPECT_EQ(a.matched, "echo.shop.svc.cluster.local") << n;
    ASSERT_EQ(a.addresses.size(), 1u) << n;
  }
  // A client in another namespace: "echo" is not ours, "echo.shop" still is.
  EXPECT_FALSE(t.lookup("echo", kTypeA, "other").known);
  EXPECT_TRUE(t.lookup("echo.shop", kTypeA, "other").known);
  EXPECT_FALSE(t.lookup("echo", kTypeA, "").known);
}

TEST(DnsNames, KnownNameWithoutTheFamilyIsEmptyNotUnknown) {
  auto snap = mesh();
  NameTable t(snap);
  auto a = t.lookup("legacy", kTypeAAAA, "shop");
  EXPECT_TRUE(a.known);
  EXPECT_TRUE(a.addresses.empty());
  auto mx = t.lookup("echo", 15, "shop");
  EXPECT_TRUE(mx.known);
  EXPECT_TRUE(mx.addresses.empty());
}

TEST(DnsNames, WorkloadHostnamesAndExternalHosts) {
  auto snap = mesh();
  NameTable t(snap);
  auto w = t.lookup("db-0.db.shop.svc.cluster.local", kTypeA, "");
  ASSERT_EQ(w.addresses.size(), 1u);
  EXPECT_EQ(w.addresses[0], ip("10.0.1.5"));
  EXPECT_TRUE(t.lookup("api.example.com", kTypeA, "shop").known);
  EXPECT_FALSE(t.lookup("example.com", kTypeA, "shop").known);
  EXPECT_FALSE(t.lookup("www.google.com", kTypeA, "shop").known);
}

TEST(DnsNames, CaseInsensitive) {
  state::Service s;
  s.name = "Mixed";
  s.namespace_name = "shop";
  s.hostname = "Mixed.Shop.svc.Cluster.Local.";
  s.vips = {{"", ip("10.96.0.30")}};
  state::Snapshot snap({}, {s}, {});
  NameTable t(snap);
  // Queries come lower-cased from parse_query.
  EXPECT_EQ(t.lookup("mixed.shop.svc.cluster.local", kTypeA, "").addresses.size(), 1u);
  EXPECT_EQ(t.lookup("mixed", kTypeA, "shop").addresses.size(), 1u);
}

}  // namespace
}  // namespace sockmesh::dns
