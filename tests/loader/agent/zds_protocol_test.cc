// The ZDS wire format: bytes compared with what protoc 3.21 encodes from istio/ztunnel's
// proto/zds.proto (text format in each comment), decoding of unknown and malformed input, and
// one packet with a descriptor over a real SOCK_SEQPACKET pair.
#include "loader/agent/zds_protocol.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>

namespace sockmesh::zds {
namespace {

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string unhex(std::string_view h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

AddWorkload pod_a() {
  AddWorkload add;
  add.uid = "pod-a";
  add.info = {"a", "ns-a", "sa-a"};
  return add;
}

TEST(ZdsProtocol, EncodesLikeProtoc) {
  // ZdsHello { version: V1 }
  EXPECT_EQ(hex(encode(Hello{})), "0801");
  // WorkloadRequest { add { uid: "pod-a" workload_info { name: "a" namespace: "ns-a"
  //                   service_account: "sa-a" } } }
  EXPECT_EQ(hex(encode(Request{pod_a()})), "0a180a05706f642d61120f0a016112046e732d611a0473612d61");
  // The same with sockmesh_ips = 1000: "10.1.1.2" and "fd00::2" as 4 and 16 bytes.
  AddWorkload with_ips = pod_a();
  with_ips.ips = {*IpAddress::parse("10.1.1.2"), *IpAddress::parse("fd00::2")};
  EXPECT_EQ(hex(encode(Request{with_ips})),
            "0a320a05706f642d61120f0a016112046e732d611a0473612d61c23e040a010102c23e10fd0000000000"
            "00000000000000000002");
  // keep { uid: "pod-b" }, del { uid: "pod-b" } (uid is field 2 in DelWorkload), snapshot_sent {}
  EXPECT_EQ(hex(encode(Request{KeepWorkload{"pod-b"}})), "2a070a05706f642d62");
  EXPECT_EQ(hex(encode(Request{DelWorkload{"pod-b"}})), "12071205706f642d62");
  EXPECT_EQ(hex(encode(Request{SnapshotSent{}})), "1a00");
  // WorkloadResponse { ack {} } and { ack { error: "no" } }
  EXPECT_EQ(hex(encode(Ack{})), "0a00");
  EXPECT_EQ(hex(encode(Ack{"no"})), "0a040a026e6f");
}

TEST(ZdsProtocol, RoundTrips) {
  AddWorkload add = pod_a();
  add.ips = {*IpAddress::parse("10.1.1.2"), *IpAddress::parse("fd00::2")};
  std::string err;
  auto got = decode_request(encode(Request{add}), &err);
  ASSERT_TRUE(got) << err;
  const auto* a = std::get_if<AddWorkload>(&*got);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->uid, "pod-a");
  EXPECT_EQ(a->info.name, "a");
  EXPECT_EQ(a->info.namespace_name, "ns-a");
  EXPECT_EQ(a->info.service_account, "sa-a");
  EXPECT_EQ(a->ips, add.ips);

  for (const Request& r :
       {Request{KeepWorkload{"k"}}, Request{DelWorkload{"d"}}, Request{SnapshotSent{}}}) {
    auto back = decode_request(encode(r), &err);
    ASSERT_TRUE(back) << err;
    EXPECT_EQ(back->index(), r.index());
    EXPECT_EQ(describe(*back), describe(r));
  }
  auto ack = decode_ack(encode(Ack{"listener map missing"}), &err);
  ASSERT_TRUE(ack) << err;
  EXPECT_EQ(ack->error, "listener map missing");
  auto hello = decode_hello(unhex("0801"), &err);
  ASSERT_TRUE(hello) << err;
  EXPECT_EQ(hello->version, kVersionV1);
}

TEST(ZdsProtocol, SkipsUnknownFieldsAsProtobufDoes) {
  // add { uid: "pod-a" } with unknown fields of every wire type before and inside it.
  std::string bytes = unhex("f80701") +                // field 127, varint 1
                      unhex("f9070102030405060708") +  // field 127, fixed64
                      unhex("fd0701020304") +          // field 127, fixed32
                      unhex("0a0e") + unhex("0a05706f642d61") + unhex("aa0604ffffffff");
  std::string err;
  auto got = decode_request(bytes, &err);
  ASSERT_TRUE(got) << err;
  ASSERT_TRUE(std::holds_alternative<AddWorkload>(*got));
  EXPECT_EQ(std::get<AddWorkload>(*got).uid, "pod-a");
}

TEST(ZdsProtocol, RefusesMalformedInput) {
  std::string err;
  EXPECT_FALSE(decode_request("", &err));
  EXPECT_NE(err.find("without a payload"), std::string::npos) << err;
  EXPECT_FALSE(decode_request(unhex("0a05"), &err)) << "length past the end";
  EXPECT_FALSE(decode_request(unhex("0aff"), &err)) << "truncated varint";
  EXPECT_FALSE(decode_request(unhex("0801"), &err)) << "add as a varint";
  EXPECT_FALSE(decode_request(unhex("0a05c23e020a01"), &err)) << "a 2-byte IP";
  EXPECT_NE(err.find("4 or 16"), std::string::npos) << err;
  EXPECT_FALSE(decode_ack(unhex("1a00"), &err)) << "no ack";
  EXPECT_FALSE(decode_request(unhex("0b"), &err)) << "group wire type";
}

TEST(ZdsProtocol, CarriesOneDescriptorPerPacket) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  maps::UniqueFd a(pair[0]), b(pair[1]);
  maps::UniqueFd netns(open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(netns.valid());
  ASSERT_FALSE(send_packet(a.get(), encode(Request{pod_a()}), netns.get()));
  ASSERT_FALSE(send_packet(a.get(), encode(Request{SnapshotSent{}})));

  auto first = receive_packet(b.get(), 1000);
  ASSERT_EQ(first.status, ReceiveStatus::kOk) << first.error;
  ASSERT_TRUE(first.packet.fd.valid());
  struct stat sent {
  }, got{};
  fstat(netns.get(), &sent);
  fstat(first.packet.fd.get(), &got);
  EXPECT_EQ(sent.st_ino, got.st_ino) << "the same namespace arrived";
  EXPECT_EQ(fcntl(first.packet.fd.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);

  auto second = receive_packet(b.get(), 1000);
  ASSERT_EQ(second.status, ReceiveStatus::kOk);
  EXPECT_FALSE(second.packet.fd.valid());
  EXPECT_EQ(hex(second.packet.bytes), "1a00");

  EXPECT_EQ(receive_packet(b.get(), 10).status, ReceiveStatus::kTimeout);
  a.reset();
  EXPECT_EQ(receive_packet(b.get(), 1000).status, ReceiveStatus::kClosed);
}

}  // namespace
}  // namespace sockmesh::zds
