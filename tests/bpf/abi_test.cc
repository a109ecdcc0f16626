// The kernel ABI header (bpf/include/sockmesh/maps.h) is one definition for BPF C, C and C++:
// both languages must see the same layout, and the C++ conversions must produce the bytes the
// BPF programs build from packets.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

#include "base/ip_address.h"
#include "loader/maps/counters.h"
#include "loader/maps/listener_map.h"
#include "loader/maps/workload_map.h"
#include "sockmesh/maps.h"

extern "C" size_t sm_abi_c_layout(int what);

namespace sockmesh {
namespace {

TEST(Abi, CAndCppAgreeOnEveryLayout) {
  EXPECT_EQ(sm_abi_c_layout(0), sizeof(sm_ip));
  EXPECT_EQ(sm_abi_c_layout(1), sizeof(sm_workload));
  EXPECT_EQ(sm_abi_c_layout(2), offsetof(sm_workload, flags));
  EXPECT_EQ(sm_abi_c_layout(3), offsetof(sm_workload, ifindex));
  EXPECT_EQ(sm_abi_c_layout(4), offsetof(sm_workload, netns_cookie));
  EXPECT_EQ(sm_abi_c_layout(5), sizeof(sm_listener_key));
  EXPECT_EQ(sm_abi_c_layout(6), offsetof(sm_listener_key, kind));
  EXPECT_EQ(sm_abi_c_layout(7), sizeof(sm_flow_key));
  EXPECT_EQ(sm_abi_c_layout(8), offsetof(sm_flow_key, local_port));
  EXPECT_EQ(sm_abi_c_layout(9), static_cast<size_t>(SM_CNT_COUNT));
}

TEST(Abi, MapNamesFitTheKernelLimit) {
  for (const char* name : {SM_MAP_WORKLOADS, SM_MAP_LISTENERS, SM_MAP_COUNTERS, SM_MAP_BYPASS,
                           SM_MAP_BYPASS_PROXY, SM_MAP_STACK_FLOWS, SM_MAP_AWAIT_PEER,
                           SM_MAP_NODE_ADDRS, SM_MAP_TIME_WAIT_SYNS, SM_MAP_PROXY_SYNS}) {
    EXPECT_LE(std::strlen(name), 15u) << name;
  }
}

TEST(Abi, IpKeysAreIpv4MappedLikeTheBpfSide) {
  sm_ip v4 = maps::to_kernel(*IpAddress::parse("10.1.2.3"));
  const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3};
  EXPECT_EQ(std::memcmp(v4.addr, want, 16), 0);
  EXPECT_EQ(maps::from_kernel(v4).to_string(), "10.1.2.3");
  sm_ip v6 = maps::to_kernel(*IpAddress::parse("fd00::7"));
  EXPECT_EQ(v6.addr[0], 0xfd);
  EXPECT_EQ(v6.addr[15], 7);
  EXPECT_EQ(maps::from_kernel(v6).to_string(), "fd00::7");
}

TEST(Abi, WorkloadRecordRoundTripsAndRefusesOversizedFields) {
  maps::WorkloadRecord r;
  r.uid = "0b8f0f6e-1c1d-4a51-9b0a-0e4e1f5d2c3b";
  r.namespace_name = "shop";
  r.service_account = "checkout";
  r.trust_domain = "example.org";
  r.capture_inbound = false;
  r.ifindex = 7;
  r.netns_cookie = 4242;
  r.loader_flags = SM_WL_SET_ACCEPT_LOCAL;
  auto raw = r.to_kernel();
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->flags, SM_WL_ENROLLED | SM_WL_CAPTURE_DNS | SM_WL_SET_ACCEPT_LOCAL);  // DNS: on by default
  EXPECT_STREQ(raw->service_account, "checkout");
  EXPECT_EQ(maps::WorkloadRecord::from_kernel(*raw), r);
  EXPECT_EQ(r.spiffe_id(), "spiffe://example.org/ns/shop/sa/checkout");

  r.namespace_name = std::string(SM_NAMESPACE_LEN, 'n');
  auto too_long = r.to_kernel();
  ASSERT_FALSE(too_long);
  EXPECT_NE(too_long.error().message.find("at most 63"), std::string::npos)
      << too_long.error().message;
  r.namespace_name = std::string("a\0b", 3);
  EXPECT_FALSE(r.to_kernel());
}

TEST(Abi, EveryCounterHasAName) {
  for (int i = 0; i < SM_CNT_COUNT; ++i) {
    auto name = maps::counter_name(static_cast<sm_counter>(i));
    EXPECT_FALSE(name.empty());
    EXPECT_NE(name, "unknown");
  }
  EXPECT_EQ(maps::counter_name(SM_CNT_BYPASS_MISSES), "bypass_misses");
}

TEST(Abi, ListenerKindsMatchTheirPorts) {
  EXPECT_EQ(maps::port_of(maps::ListenerKind::kOutbound), 15001);
  EXPECT_EQ(maps::port_of(maps::ListenerKind::kInboundPlain), 15006);
  EXPECT_EQ(maps::port_of(maps::ListenerKind::kHbone), 15008);
}

}  // namespace
}  // namespace sockmesh
