#include "base/byte_queue.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sockmesh {
namespace {

// Everything queued, front to back, through gather() as a writer would see it.
std::string contents(const ByteQueue& q) {
  std::vector<std::span<const uint8_t>> runs(1024);
  size_t n = q.gather(runs);
  std::string out;
  for (size_t i = 0; i < n; ++i) out.append(runs[i].begin(), runs[i].end());
  return out;
}

TEST(ByteQueue, EmptyHoldsNothing) {
  ByteQueue q(16);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(q.allocated(), 0u);
  EXPECT_TRUE(q.front().empty());
  std::span<const uint8_t> runs[4];
  EXPECT_EQ(q.gather(runs), 0u);
  q.append("", 0);
  EXPECT_EQ(q.allocated(), 0u);
}

TEST(ByteQueue, TinyAppendsShareChunks) {
  // The case this class exists for: a million one-byte appends take size/chunk allocations,
  // not a million.
  ByteQueue q(64 * 1024);
  std::string expected;
  for (int i = 0; i < 1'000'000; ++i) {
    char c = static_cast<char>('a' + i % 26);
    q.append(&c, 1);
    expected.push_back(c);
  }
  EXPECT_EQ(q.size(), expected.size());
  EXPECT_LE(q.allocated(), expected.size() + 64 * 1024);
  EXPECT_EQ(contents(q), expected);
}

TEST(ByteQueue, AppendsSpanChunksAndKeepOrder) {
  ByteQueue q(10);
  q.append("0123456", 7);
  q.append("789abcdefghij", 13);  // fills the first chunk, a whole one and part of a third
  q.append("k", 1);
  EXPECT_EQ(q.size(), 21u);
  EXPECT_EQ(q.allocated(), 30u);
  EXPECT_EQ(contents(q), "0123456789abcdefghijk");
  auto f = q.front();
  EXPECT_EQ(std::string(f.begin(), f.end()), "0123456789");
}

TEST(ByteQueue, GatherStopsAtTheRunsGiven) {
  ByteQueue q(4);
  q.append("aaaabbbbcccc", 12);
  std::span<const uint8_t> runs[2];
  ASSERT_EQ(q.gather(runs), 2u);
  EXPECT_EQ(std::string(runs[0].begin(), runs[0].end()), "aaaa");
  EXPECT_EQ(std::string(runs[1].begin(), runs[1].end()), "bbbb");
}

TEST(ByteQueue, ConsumeFreesChunksAsTheyEmpty) {
  ByteQueue q(4);
  q.append("abcdefghij", 10);
  EXPECT_EQ(q.allocated(), 12u);
  q.consume(3);
  EXPECT_EQ(contents(q), "defghij");
  EXPECT_EQ(q.allocated(), 12u);  // "d" still holds the first chunk
  q.consume(1);
  EXPECT_EQ(q.allocated(), 8u);
  q.consume(5);  // across a chunk boundary
  EXPECT_EQ(contents(q), "j");
  EXPECT_EQ(q.allocated(), 4u);
  q.append("kl", 2);  // fills the tail's spare room
  EXPECT_EQ(contents(q), "jkl");
  EXPECT_EQ(q.allocated(), 4u);
  q.append("m", 1);  // the tail is full: a new chunk
  EXPECT_EQ(q.allocated(), 8u);
  q.consume(100);  // more than there is: everything
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.allocated(), 0u);
}

TEST(ByteQueue, FrontStaysValidWhileMoreIsAppended) {
  // A gather write may be under way while DATA keeps arriving: appended bytes never move.
  ByteQueue q(8);
  q.append("abc", 3);
  auto f = q.front();
  const uint8_t* before = f.data();
  for (int i = 0; i < 100; ++i) q.append("xyz", 3);
  EXPECT_EQ(q.front().data(), before);
  EXPECT_EQ(std::string(f.begin(), f.end()), "abc");
}

TEST(ByteQueue, MoveLeavesTheSourceEmpty) {
  ByteQueue a(4);
  a.append("hello", 5);
  ByteQueue b = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the state is specified
  EXPECT_EQ(a.allocated(), 0u);
  EXPECT_EQ(contents(b), "hello");
  a.append("again", 5);
  EXPECT_EQ(contents(a), "again");
  b = std::move(a);
  EXPECT_EQ(contents(b), "again");
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move)
}

}  // namespace
}  // namespace sockmesh
