#include "dns/message.h"

#include <gtest/gtest.h>

namespace sockmesh::dns {
namespace {

std::vector<uint8_t> query_bytes(std::string_view name, uint16_t type, uint16_t id = 0x1234,
                                 uint16_t qdcount = 1) {
  std::vector<uint8_t> m{static_cast<uint8_t>(id >> 8),
                         static_cast<uint8_t>(id),
                         0x01,
                         0x00,
                         static_cast<uint8_t>(qdcount >> 8),
                         static_cast<uint8_t>(qdcount),
                         0,
                         0,
                         0,
                         0,
                         0,
                         0};
  EXPECT_TRUE(append_name(&m, name).ok());
  m.insert(m.end(), {static_cast<uint8_t>(type >> 8), static_cast<uint8_t>(type), 0, 1});
  return m;
}

TEST(DnsMessage, QueryRoundTrip) {
  auto bytes = query_bytes("Echo.Shop.svc.cluster.local", kTypeA);
  auto q = parse_query(bytes);
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(q->header.id, 0x1234);
  EXPECT_TRUE(q->header.rd());
  EXPECT_EQ(q->question.name, "echo.shop.svc.cluster.local");  // lower-cased
  EXPECT_EQ(q->question.type, kTypeA);
  EXPECT_EQ(q->question.klass, kClassIn);
}

TEST(DnsMessage, AnswerCarriesAddressesOfTheAskedFamily) {
  auto q = parse_query(query_bytes("echo", kTypeAAAA));
  ASSERT_TRUE(q.ok());
  auto v4 = *IpAddress::parse("10.96.0.1");
  auto v6 = *IpAddress::parse("fd00::1");
  auto reply = build_answer(*q, {v4, v6}, 30);
  auto h = parse_header(reply);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->id, 0x1234);
  EXPECT_TRUE(h->qr());
  EXPECT_TRUE(h->rd());
  EXPECT_EQ(h->rcode(), Rcode::kNoError);
  EXPECT_EQ(h->qdcount, 1);
  ASSERT_EQ(h->ancount, 1);
  // Question echoed, then one AAAA with a pointer to it, TTL 30 and the 16 address bytes.
  size_t off = kHeaderSize;
  auto name = read_name(reply, &off);
  ASSERT_TRUE(name.ok());
  EXPECT_EQ(*name, "echo");
  off += 4;
  auto aname = read_name(reply, &off);
  ASSERT_TRUE(aname.ok());
  EXPECT_EQ(*aname, "echo");
  ASSERT_EQ(reply.size(), off + 10 + 16);
  EXPECT_EQ(reply[off + 1], kTypeAAAA);
  EXPECT_EQ(reply[off + 7], 30);
  EXPECT_EQ(reply[off + 9], 16);
  EXPECT_EQ(reply[off + 10], 0xfd);
  EXPECT_EQ(reply.back(), 1);
}

TEST(DnsMessage, ErrorRepliesEchoIdAndQuestion) {
  auto q = parse_query(query_bytes("nope.example", kTypeA, 0xbeef));
  ASSERT_TRUE(q.ok());
  for (Rcode rc : {Rcode::kNxDomain, Rcode::kFormErr, Rcode::kServFail, Rcode::kNotImp}) {
    auto r = build_error(q->header.id, q->header.flags, &q->question, rc);
    auto h = parse_header(r);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(h->id, 0xbeef);
    EXPECT_EQ(h->rcode(), rc);
    EXPECT_EQ(h->qdcount, 1);
    size_t off = kHeaderSize;
    auto n = read_name(r, &off);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, "nope.example");
  }
  auto no_q = build_error(7, 0, nullptr, Rcode::kFormErr);
  EXPECT_EQ(no_q.size(), kHeaderSize);
  EXPECT_EQ(parse_header(no_q)->qdcount, 0);
}

TEST(DnsMessage, TruncatedHeaderIsAnError) {
  std::vector<uint8_t> m(11, 0);
  auto h = parse_header(m);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().message.find("shorter than the 12-byte header"), std::string::npos);
  EXPECT_FALSE(parse_query(m).ok());
}

TEST(DnsMessage, QuestionCountMustBeOne) {
  EXPECT_FALSE(parse_query(query_bytes("a", kTypeA, 1, 0)).ok());
  auto two = parse_query(query_bytes("a", kTypeA, 1, 2));
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.error().message.find("2 questions"), std::string::npos);
}

TEST(DnsMessage, CompressionLoopIsRejected) {
  std::vector<uint8_t> m{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
  m.insert(m.end(), {0xC0, 12, 0, 1, 0, 1});  // a pointer to itself
  auto q = parse_query(m);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message.find("loop"), std::string::npos);
  // Two labels pointing at each other: the second pointer goes forward.
  std::vector<uint8_t> m2{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 'a', 0xC0, 16, 1, 'b', 0xC0, 12};
  size_t off = 16;
  EXPECT_FALSE(read_name(m2, &off).ok());
}

TEST(DnsMessage, CompressedNameIsExpanded) {
  std::vector<uint8_t> m{0, 1,   0,   0,   0, 1, 0,   0,   0,   0,    0, 0,
                         3, 'c', 'o', 'm', 0, 3, 'f', 'o', 'o', 0xC0, 12};
  size_t off = 17;
  auto n = read_name(m, &off);
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(*n, "foo.com");
  EXPECT_EQ(off, m.size());
}

TEST(DnsMessage, LabelOver63IsRejected) {
  std::vector<uint8_t> m{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 64};
  m.insert(m.end(), 64, 'a');
  m.insert(m.end(), {0, 0, 1, 0, 1});
  EXPECT_FALSE(parse_query(m).ok());
  std::vector<uint8_t> out;
  EXPECT_FALSE(append_name(&out, std::string(64, 'a')).ok());
  EXPECT_TRUE(append_name(&out, std::string(63, 'a')).ok());
}

TEST(DnsMessage, NameOver255IsRejected) {
  std::vector<uint8_t> m{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < 5; ++i) {  // 5 * 64 = 320 octets
    m.push_back(63);
    m.insert(m.end(), 63, 'a');
  }
  m.insert(m.end(), {0, 0, 1, 0, 1});
  auto q = parse_query(m);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message.find("255"), std::string::npos);
  std::vector<uint8_t> out;
  std::string long_name;
  for (int i = 0; i < 5; ++i) long_name += std::string(60, 'b') + ".";
  long_name.pop_back();
  EXPECT_FALSE(append_name(&out, long_name).ok());
}

TEST(DnsMessage, DotInsideALabelIsRejected) {
  // Found by dns_message_fuzz: "a.b" as one label would read back as two.
  std::vector<uint8_t> m{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'a', '.', 'b', 0, 0, 1, 0, 1};
  auto q = parse_query(m);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message.find("'.'"), std::string::npos);
}

TEST(DnsMessage, TruncatedQuestionIsAnError) {
  auto m = query_bytes("echo", kTypeA);
  for (size_t n = kHeaderSize; n < m.size(); ++n) {
    std::vector<uint8_t> cut(m.begin(), m.begin() + static_cast<long>(n));
    EXPECT_FALSE(parse_query(cut).ok()) << "length " << n;
  }
}

TEST(DnsMessage, ResponseIsNotAQuery) {
  auto m = query_bytes("echo", kTypeA);
  m[2] |= 0x80;
  EXPECT_FALSE(parse_query(m).ok());
}

}  // namespace
}  // namespace sockmesh::dns
