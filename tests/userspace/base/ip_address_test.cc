#include "base/ip_address.h"

#include <gtest/gtest.h>

namespace sockmesh {
namespace {

TEST(IpAddress, ParsesV4AndV6) {
  auto a = IpAddress::parse("10.1.2.3");
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->is_v4());
  EXPECT_EQ(a->to_string(), "10.1.2.3");
  auto b = IpAddress::parse("fd00::1");
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->is_v4());
  EXPECT_EQ(b->to_string(), "fd00::1");
  EXPECT_FALSE(IpAddress::parse("10.1.2"));
  EXPECT_FALSE(IpAddress::parse("10.1.2.3 "));
  EXPECT_FALSE(IpAddress::parse(""));
}

TEST(Endpoint, ParsesAuthorityForms) {
  auto e = Endpoint::parse("127.0.0.1:8080");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->port, 8080);
  EXPECT_EQ(e->to_string(), "127.0.0.1:8080");
  auto v6 = Endpoint::parse("[fd00::2]:15008");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->to_string(), "[fd00::2]:15008");
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536",
                          "fd00::2:80", "[fd00::2]80", "host:80", "1.2.3.4:8x", ":80"}) {
    EXPECT_FALSE(Endpoint::parse(bad)) << bad;
  }
}

TEST(IpNetwork, ContainsHonoursPrefix) {
  auto n = IpNetwork::parse("10.0.0.0/8");
  ASSERT_TRUE(n);
  EXPECT_TRUE(n->contains(*IpAddress::parse("10.200.1.1")));
  EXPECT_FALSE(n->contains(*IpAddress::parse("11.0.0.1")));
  EXPECT_FALSE(n->contains(*IpAddress::parse("::a00:1")));
  auto host = IpNetwork::parse("192.168.1.7");
  ASSERT_TRUE(host);
  EXPECT_TRUE(host->contains(*IpAddress::parse("192.168.1.7")));
  EXPECT_FALSE(host->contains(*IpAddress::parse("192.168.1.8")));
  EXPECT_EQ(IpNetwork::parse("10.1.2.3/16")->to_string(), "10.1.0.0/16");
  EXPECT_FALSE(IpNetwork::parse("10.0.0.0/33"));
  auto v6 = IpNetwork::parse("fd00::/64");
  ASSERT_TRUE(v6);
  EXPECT_TRUE(v6->contains(*IpAddress::parse("fd00::99")));
  EXPECT_FALSE(v6->contains(*IpAddress::parse("fd01::99")));
}

}  // namespace
}  // namespace sockmesh
