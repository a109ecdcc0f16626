#include <gtest/gtest.h>

#include <unordered_set>

#include "proxy/pool.h"

namespace sockmesh::proxy {
namespace {

PoolKey key(const std::string& src_id, const std::string& src_ip, const std::string& dst_id,
            const std::string& dst, std::vector<std::string> acceptable = {}) {
  if (acceptable.empty()) acceptable.push_back(dst_id);
  return PoolKey::make(src_id, *IpAddress::parse(src_ip), dst_id, *Endpoint::parse(dst),
                       std::move(acceptable));
}

// Connections are shared only between tunnels that would present and expect the same things:
// a change in any part of the key must give a different pool entry.
TEST(PoolKey, EveryFieldSeparatesConnections) {
  const auto base =
      key("spiffe://td/ns/a/sa/x", "10.0.0.1", "spiffe://td/ns/b/sa/y", "10.0.1.1:15008");
  std::unordered_set<PoolKey, PoolKeyHash> keys{base};
  EXPECT_EQ(keys.count(key("spiffe://td/ns/a/sa/x", "10.0.0.1", "spiffe://td/ns/b/sa/y",
                           "10.0.1.1:15008")),
            1u);
  const PoolKey variants[] = {
      key("spiffe://td/ns/a/sa/OTHER", "10.0.0.1", "spiffe://td/ns/b/sa/y", "10.0.1.1:15008"),
      key("spiffe://td/ns/a/sa/x", "10.0.0.2", "spiffe://td/ns/b/sa/y", "10.0.1.1:15008"),
      key("spiffe://td/ns/a/sa/x", "10.0.0.1", "spiffe://td/ns/b/sa/OTHER", "10.0.1.1:15008"),
      key("spiffe://td/ns/a/sa/x", "10.0.0.1", "spiffe://td/ns/b/sa/y", "10.0.1.2:15008"),
      key("spiffe://td/ns/a/sa/x", "10.0.0.1", "spiffe://td/ns/b/sa/y", "10.0.1.1:15009"),
      // Two services in front of one workload, accepting different identities (issue 14, 5).
      key("spiffe://td/ns/a/sa/x", "10.0.0.1", "spiffe://td/ns/b/sa/y", "10.0.1.1:15008",
          {"spiffe://td/ns/b/sa/y", "spiffe://td/ns/b/sa/svc-san"}),
  };
  for (const auto& v : variants) {
    EXPECT_FALSE(v == base) << v.to_string();
    EXPECT_EQ(keys.count(v), 0u) << v.to_string();
    keys.insert(v);
  }
  EXPECT_EQ(keys.size(), 7u);
}

// The same set of acceptable identities in another order, or with repeats, is the same key.
TEST(PoolKey, AcceptableIdentitiesAreASet) {
  auto a = key("spiffe://td/ns/a/sa/x", "10.0.0.1", "spiffe://td/ns/b/sa/y", "10.0.1.1:15008",
               {"spiffe://td/ns/b/sa/y", "spiffe://td/ns/b/sa/z"});
  auto b = key("spiffe://td/ns/a/sa/x", "10.0.0.1", "spiffe://td/ns/b/sa/y", "10.0.1.1:15008",
               {"spiffe://td/ns/b/sa/z", "spiffe://td/ns/b/sa/y", "spiffe://td/ns/b/sa/z"});
  EXPECT_TRUE(a == b);
  EXPECT_EQ(PoolKeyHash()(a), PoolKeyHash()(b));
  EXPECT_NE(a.to_string().find("accepting"), std::string::npos) << a.to_string();
}

}  // namespace
}  // namespace sockmesh::proxy
