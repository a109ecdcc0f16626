#include "proxy/connection_limits.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace sockmesh::proxy {
namespace {

IpAddress ip(const char* s) { return *IpAddress::parse(s); }

struct Admission {
  ConnectionLimits::Ticket ticket;
  ConnectionLimits::Refusal why = ConnectionLimits::Refusal::kNone;
  bool log_now = false;
  uint64_t suppressed = 0;
};

Admission admit(ConnectionLimits& l, const char* source) {
  Admission a;
  a.ticket = l.admit(ip(source), &a.why, &a.log_now, &a.suppressed);
  return a;
}

TEST(ConnectionLimits, PerSourceCapLeavesOtherSourcesAlone) {
  auto limits = std::make_shared<ConnectionLimits>(0, 2);
  auto a1 = admit(*limits, "10.0.0.1");
  auto a2 = admit(*limits, "10.0.0.1");
  auto a3 = admit(*limits, "10.0.0.1");
  auto b1 = admit(*limits, "10.0.0.2");
  EXPECT_TRUE(a1.ticket && a2.ticket && b1.ticket);
  EXPECT_FALSE(a3.ticket);
  EXPECT_EQ(a3.why, ConnectionLimits::Refusal::kPerSource);
  EXPECT_EQ(limits->open(), 3u);
  EXPECT_EQ(limits->open_from(ip("10.0.0.1")), 2u);
  a1.ticket.release();
  EXPECT_EQ(limits->open_from(ip("10.0.0.1")), 1u);
  EXPECT_TRUE(admit(*limits, "10.0.0.1").ticket) << "a place given back can be taken again";
}

TEST(ConnectionLimits, TotalCapCountsEverySource) {
  auto limits = std::make_shared<ConnectionLimits>(2, 0);
  auto a = admit(*limits, "10.0.0.1");
  auto b = admit(*limits, "10.0.0.2");
  auto c = admit(*limits, "10.0.0.3");
  EXPECT_TRUE(a.ticket && b.ticket);
  EXPECT_FALSE(c.ticket);
  EXPECT_EQ(c.why, ConnectionLimits::Refusal::kTotal);
  { ConnectionLimits::Ticket gone = std::move(a.ticket); }  // moved, then destroyed: released
  EXPECT_FALSE(a.ticket);
  EXPECT_EQ(limits->open(), 1u);
  EXPECT_TRUE(admit(*limits, "10.0.0.3").ticket);
}

TEST(ConnectionLimits, RefusalsAreLoggedOncePerInterval) {
  auto limits = std::make_shared<ConnectionLimits>(1, 0);
  auto held = admit(*limits, "10.0.0.1");
  auto first = admit(*limits, "10.0.0.2");
  auto second = admit(*limits, "10.0.0.2");
  auto third = admit(*limits, "10.0.0.2");
  EXPECT_TRUE(first.log_now);
  EXPECT_FALSE(second.log_now);
  EXPECT_FALSE(third.log_now);
}

TEST(ConnectionLimits, TicketsFromManyThreadsBalance) {
  auto limits = std::make_shared<ConnectionLimits>(0, 100000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) {
        auto a = admit(*limits, "10.0.0.9");
        ASSERT_TRUE(a.ticket);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(limits->open(), 0u);
  EXPECT_EQ(limits->open_from(ip("10.0.0.9")), 0u);
}

TEST(ConnectionLimits, ZeroMeansNoCap) {
  auto limits = std::make_shared<ConnectionLimits>(0, 0);
  std::vector<ConnectionLimits::Ticket> all;
  for (int i = 0; i < 1000; ++i) all.push_back(admit(*limits, "10.0.0.1").ticket);
  for (auto& t : all) EXPECT_TRUE(t);
  EXPECT_EQ(limits->open(), 1000u);
}

}  // namespace
}  // namespace sockmesh::proxy
