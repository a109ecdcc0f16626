// DNS capture with real traffic (bpf/capture.bpf.c, #15): a pod and a peer in namespaces of the
// test's own, sockmesh installed under a pin root of its own, and in the pod the two sockets the
// proxy's DNS server opens (a transparent UDP socket and a transparent TCP listener on 15053,
// registered as dns-udp and dns-tcp). The pod's resolver address, 10.96.0.10 (fd00:96::10), does
// not exist anywhere: every answer the client gets proves the query was captured.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "loader/attach/netns.h"
#include "loader/attach/pod.h"
#include "loader/maps/counters.h"
#include "loader/maps/listener_map.h"
#include "sockmesh/consts.h"
#include "testing/privileged.h"
#include "testing/sockets.h"
#include "testing/system.h"

namespace sockmesh {
namespace {

using maps::ListenerKind;
using testing::UniqueFd;

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new testing::PrivilegedEnvironment);

constexpr int kTimeoutMs = 3000;
// Long enough for a datagram that was going to arrive to arrive (they take microseconds here).
constexpr int kAbsentMs = 300;

bool readable_within(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN) != 0;
}

// A datagram socket in the netns at `netns_path`, with the options the DNS proxy sets.
struct UdpOptions {
  bool transparent = false;  // IP_TRANSPARENT / IPV6_TRANSPARENT
  bool orig_dst = false;     // IP_RECVORIGDSTADDR / IPV6_RECVORIGDSTADDR
  uint32_t mark = 0;         // SO_MARK
  bool reuse = false;        // SO_REUSEADDR
};

UniqueFd udp_socket(const std::string& netns_path, int family, const UdpOptions& o) {
  auto scope = loader::NetnsScope::enter(netns_path);
  EXPECT_TRUE(scope) << scope.error().message;
  if (!scope) return UniqueFd();
  UniqueFd fd(socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  EXPECT_TRUE(fd.valid()) << strerror(errno);
  int one = 1;
  bool v4 = family == AF_INET;
  if (o.transparent) {
    EXPECT_EQ(setsockopt(fd.get(), v4 ? SOL_IP : SOL_IPV6, v4 ? IP_TRANSPARENT : IPV6_TRANSPARENT,
                         &one, sizeof(one)),
              0)
        << "IP_TRANSPARENT: " << strerror(errno);
  }
  if (o.orig_dst) {
    EXPECT_EQ(setsockopt(fd.get(), v4 ? SOL_IP : SOL_IPV6,
                         v4 ? IP_RECVORIGDSTADDR : IPV6_RECVORIGDSTADDR, &one, sizeof(one)),
              0)
        << "IP_RECVORIGDSTADDR: " << strerror(errno);
  }
  if (o.mark != 0) {
    EXPECT_EQ(setsockopt(fd.get(), SOL_SOCKET, SO_MARK, &o.mark, sizeof(o.mark)), 0)
        << "SO_MARK: " << strerror(errno);
  }
  if (o.reuse) setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (!v4) setsockopt(fd.get(), SOL_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  return fd;
}

bool bind_to(int fd, const Endpoint& at) {
  sockaddr_storage ss{};
  socklen_t len = at.to_sockaddr(&ss);
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0;
  EXPECT_TRUE(ok) << "bind " << at.to_string() << ": " << strerror(errno);
  return ok;
}

bool connect_to(int fd, const Endpoint& to) {
  sockaddr_storage ss{};
  socklen_t len = to.to_sockaddr(&ss);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0;
  EXPECT_TRUE(ok) << "connect " << to.to_string() << ": " << strerror(errno);
  return ok;
}

struct Datagram {
  std::string payload;
  Endpoint from;
  std::optional<Endpoint> orig_dst;  // from IP_ORIGDSTADDR / IPV6_ORIGDSTADDR
};

// One datagram within `timeout_ms`, or nullopt.
std::optional<Datagram> receive(int fd, int timeout_ms) {
  if (!readable_within(fd, timeout_ms)) return std::nullopt;
  char buf[2048];
  alignas(cmsghdr) char control[256];
  sockaddr_storage from{};
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_name = &from;
  msg.msg_namelen = sizeof(from);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT);
  if (n < 0) return std::nullopt;
  Datagram d;
  d.payload.assign(buf, static_cast<size_t>(n));
  d.from = *Endpoint::from_sockaddr(reinterpret_cast<sockaddr*>(&from));
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if ((c->cmsg_level == SOL_IP && c->cmsg_type == IP_ORIGDSTADDR) ||
        (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_ORIGDSTADDR)) {
      d.orig_dst = Endpoint::from_sockaddr(reinterpret_cast<sockaddr*>(CMSG_DATA(c)));
    }
  }
  return d;
}

// sendmsg to `to`, with IP_PKTINFO / IPV6_PKTINFO naming `source` as the source address.
bool send_with_pktinfo(int fd, const std::string& payload, const Endpoint& to,
                       const IpAddress& source) {
  sockaddr_storage dst{};
  socklen_t dst_len = to.to_sockaddr(&dst);
  iovec iov{const_cast<char*>(payload.data()), payload.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(in6_pktinfo))] = {};
  msghdr msg{};
  msg.msg_name = &dst;
  msg.msg_namelen = dst_len;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  cmsghdr* c = reinterpret_cast<cmsghdr*>(control);
  if (source.is_v4()) {
    in_pktinfo info{};
    info.ipi_spec_dst.s_addr = source.v4_network_order();
    c->cmsg_level = SOL_IP;
    c->cmsg_type = IP_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(info));
    std::memcpy(CMSG_DATA(c), &info, sizeof(info));
    msg.msg_controllen = CMSG_SPACE(sizeof(info));
  } else {
    in6_pktinfo info{};
    std::memcpy(&info.ipi6_addr, source.bytes16().data(), 16);
    c->cmsg_level = SOL_IPV6;
    c->cmsg_type = IPV6_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(info));
    std::memcpy(CMSG_DATA(c), &info, sizeof(info));
    msg.msg_controllen = CMSG_SPACE(sizeof(info));
  }
  ssize_t n = sendmsg(fd, &msg, 0);
  EXPECT_EQ(n, static_cast<ssize_t>(payload.size())) << "sendmsg: " << strerror(errno);
  return n == static_cast<ssize_t>(payload.size());
}

class DnsCaptureTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    auto l = maps::ListenerMap::open(install_.root());
    ASSERT_TRUE(l) << l.error().message;
    listeners_.emplace(std::move(l).value());
    // The resolver's address is off the pod's subnet: routed via the peer, where nothing has it.
    topo_.pod.ip({"-4", "route", "add", "default", "via", topo_.peer_v4.to_string()});
    topo_.pod.ip({"-6", "route", "add", "default", "via", topo_.peer_v6.to_string()});
  }

  bool v6() const { return GetParam() == AF_INET6; }
  int family() const { return GetParam(); }
  IpAddress pod_ip() const { return v6() ? topo_.pod_v6 : topo_.pod_v4; }
  IpAddress peer_ip() const { return v6() ? topo_.peer_v6 : topo_.peer_v4; }
  Endpoint resolver() const {
    return Endpoint{*IpAddress::parse(v6() ? "fd00:96::10" : "10.96.0.10"), SM_PORT_DNS_QUERY};
  }
  Endpoint any(uint16_t port) const {
    return Endpoint{*IpAddress::parse(v6() ? "::" : "0.0.0.0"), port};
  }

  void enroll(bool capture_dns = true) {
    loader::PodSpec pod;
    pod.netns_path = topo_.pod.path();
    pod.ifname = "eth0";
    pod.ips = {topo_.pod_v4, topo_.pod_v6};
    pod.identity.uid = "pod-a";
    pod.identity.namespace_name = "default";
    pod.identity.service_account = "sa-a";
    pod.identity.capture_dns = capture_dns;
    auto report = loader::enroll(install_.root(), pod);
    ASSERT_TRUE(report) << report.error().message;
  }

  // The proxy's DNS UDP socket: transparent, IP_RECVORIGDSTADDR, the proxy's mark, on 15053,
  // registered as dns-udp for the pod.
  UniqueFd dns_udp_socket(bool register_it = true) {
    UniqueFd fd = udp_socket(topo_.pod.path(), family(),
                             {.transparent = true, .orig_dst = true, .mark = SM_MARK_PROXY});
    if (!fd.valid() || !bind_to(fd.get(), any(SM_PORT_DNS))) return UniqueFd();
    if (register_it) {
      auto s = listeners_->add(pod_ip(), ListenerKind::kDnsUdp, fd.get());
      EXPECT_TRUE(s) << s.error().message;
    }
    return fd;
  }

  // The app's resolver socket, connected to `to` as glibc's is.
  UniqueFd client_to(const Endpoint& to, uint32_t mark = 0) {
    UniqueFd fd = udp_socket(topo_.pod.path(), family(), {.mark = mark});
    if (!fd.valid() || !connect_to(fd.get(), to)) return UniqueFd();
    return fd;
  }

  // What stands at the resolver's address for the answer: a transparent socket bound to the
  // original destination (port 53 included) in the pod's netns, replying to the client.
  void answer_from(const Endpoint& orig_dst, const Endpoint& client, const std::string& payload) {
    UniqueFd reply = udp_socket(topo_.pod.path(), family(),
                                {.transparent = true, .mark = SM_MARK_PROXY, .reuse = true});
    ASSERT_TRUE(reply.valid());
    ASSERT_TRUE(bind_to(reply.get(), orig_dst));
    send_with_pktinfo(reply.get(), payload, client, orig_dst.ip);
  }

  uint64_t counter(sm_counter c) { return testing::datapath_counter(install_.root(), c); }

  // A query from the pod to the peer's port 53 reaches a server there: it was not captured.
  void expect_query_leaves_the_pod(uint32_t client_mark, const char* why) {
    UniqueFd server = udp_socket(topo_.peer.path(), family(), {});
    ASSERT_TRUE(server.valid());
    ASSERT_TRUE(bind_to(server.get(), Endpoint{peer_ip(), SM_PORT_DNS_QUERY}));
    UniqueFd client = client_to(Endpoint{peer_ip(), SM_PORT_DNS_QUERY}, client_mark);
    ASSERT_TRUE(client.valid());
    uint64_t captured = counter(SM_CNT_CAPTURED_DNS);
    ASSERT_EQ(send(client.get(), "query", 5, 0), 5) << strerror(errno);
    auto got = receive(server.get(), kTimeoutMs);
    ASSERT_TRUE(got) << why << ": the query must leave the pod and reach the peer";
    EXPECT_EQ(got->payload, "query");
    EXPECT_EQ(got->from, testing::local_of(client.get()));
    EXPECT_EQ(counter(SM_CNT_CAPTURED_DNS), captured) << why;
  }

  testing::TestCgroup cgroup_;
  testing::TestInstall install_{cgroup_.path()};
  testing::PodTopology topo_;
  std::optional<maps::ListenerMap> listeners_;
};

INSTANTIATE_TEST_SUITE_P(Families, DnsCaptureTest, ::testing::Values(AF_INET, AF_INET6),
                         [](const auto& info) { return info.param == AF_INET ? "IPv4" : "IPv6"; });

// Every datagram of a connected client socket is captured (UDP has no flow the kernel could find
// again: tc assigns each one), arrives with its original destination, and the answer the
// proxy sends from that destination is what the client receives.
TEST_P(DnsCaptureTest, UdpQueriesReachTheProxyAndTheAnswerComesFromTheResolver) {
  UniqueFd dns = dns_udp_socket();
  ASSERT_TRUE(dns.valid());
  enroll();
  UniqueFd client = client_to(resolver());
  ASSERT_TRUE(client.valid());
  Endpoint client_ep = testing::local_of(client.get());
  EXPECT_EQ(client_ep.ip, pod_ip());

  constexpr int kQueries = 5;
  for (int i = 0; i < kQueries; ++i) {
    std::string query = "query-" + std::to_string(i);
    ASSERT_EQ(send(client.get(), query.data(), query.size(), 0), static_cast<ssize_t>(query.size()))
        << strerror(errno);
    auto got = receive(dns.get(), kTimeoutMs);
    ASSERT_TRUE(got) << "query " << i << " must arrive at the proxy's 15053 socket";
    EXPECT_EQ(got->payload, query);
    EXPECT_EQ(got->from, client_ep);
    ASSERT_TRUE(got->orig_dst) << "IP_ORIGDSTADDR missing";
    EXPECT_EQ(*got->orig_dst, resolver()) << "the original destination, port 53 included";

    std::string answer = "answer-" + std::to_string(i);
    answer_from(*got->orig_dst, got->from, answer);
    auto reply = receive(client.get(), kTimeoutMs);
    ASSERT_TRUE(reply) << "answer " << i << " must reach the client's connected socket";
    EXPECT_EQ(reply->payload, answer);
    EXPECT_EQ(reply->from, resolver());
  }
  EXPECT_EQ(counter(SM_CNT_CAPTURED_DNS), static_cast<uint64_t>(kQueries));
  EXPECT_EQ(counter(SM_CNT_ASSIGN_FAILED), 0u);
}

// A kernel fact for the proxy's side: IP_PKTINFO sets the source address of an answer sent from
// the 15053 socket, but not its port; a connected resolver socket never sees that answer (its
// peer is :53). Answers go from a socket bound to the original destination (answer_from above).
TEST_P(DnsCaptureTest, PktinfoOnThe15053SocketAnswersFromTheWrongPort) {
  UniqueFd dns = dns_udp_socket();
  ASSERT_TRUE(dns.valid());
  enroll();
  UniqueFd client = udp_socket(topo_.pod.path(), family(), {});  // unconnected: sees any source
  ASSERT_TRUE(client.valid());
  sockaddr_storage to{};
  socklen_t to_len = resolver().to_sockaddr(&to);
  ASSERT_EQ(sendto(client.get(), "q", 1, 0, reinterpret_cast<sockaddr*>(&to), to_len), 1)
      << strerror(errno);
  auto got = receive(dns.get(), kTimeoutMs);
  ASSERT_TRUE(got && got->orig_dst);
  send_with_pktinfo(dns.get(), "a", got->from, got->orig_dst->ip);
  auto reply = receive(client.get(), kTimeoutMs);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->from, (Endpoint{resolver().ip, SM_PORT_DNS}));
}

TEST_P(DnsCaptureTest, TcpQueryIsAcceptedByTheDnsListenerWithItsOriginalDestination) {
  auto listener =
      testing::listen_in(topo_.pod.path(), any(SM_PORT_DNS),
                         testing::SocketOptions{.transparent = true, .mark = SM_MARK_PROXY});
  ASSERT_TRUE(listener.valid());
  ASSERT_TRUE(listeners_->add(pod_ip(), ListenerKind::kDnsTcp, listener.get()));
  // The outbound listener too: a DNS connection must pick the DNS listener over it.
  auto outbound =
      testing::listen_in(topo_.pod.path(), any(SM_PORT_OUTBOUND),
                         testing::SocketOptions{.transparent = true, .mark = SM_MARK_PROXY});
  ASSERT_TRUE(listeners_->add(pod_ip(), ListenerKind::kOutbound, outbound.get()));
  enroll();

  auto app = testing::connect_in(topo_.pod.path(), resolver());
  ASSERT_TRUE(app.valid()) << "connect to the resolver: " << strerror(errno);
  auto accepted = testing::accept_within(listener.get(), kTimeoutMs);
  ASSERT_TRUE(accepted.valid()) << "the connection must arrive at the 15053 TCP listener";
  EXPECT_EQ(testing::local_of(accepted.get()), resolver()) << "getsockname: original destination";
  EXPECT_EQ(testing::peer_of(accepted.get()), testing::local_of(app.get()));
  EXPECT_FALSE(testing::accept_within(outbound.get(), 0).valid());

  auto query = testing::pattern(64 * 1024, 7);
  ASSERT_TRUE(testing::send_all(app.get(), query.data(), query.size()));
  std::vector<uint8_t> got(query.size());
  ASSERT_TRUE(testing::recv_exact(accepted.get(), got.data(), got.size(), kTimeoutMs));
  EXPECT_EQ(got, query);
  auto answer = testing::pattern(64 * 1024, 8);
  ASSERT_TRUE(testing::send_all(accepted.get(), answer.data(), answer.size()));
  ASSERT_TRUE(testing::recv_exact(app.get(), got.data(), got.size(), kTimeoutMs));
  EXPECT_EQ(got, answer);
  EXPECT_EQ(counter(SM_CNT_CAPTURED_DNS), 1u);
  EXPECT_EQ(counter(SM_CNT_CAPTURED_OUTBOUND), 0u);
}

TEST_P(DnsCaptureTest, TheProxysOwnQueriesAreNotCaptured) {
  UniqueFd dns = dns_udp_socket();
  ASSERT_TRUE(dns.valid());
  enroll();
  expect_query_leaves_the_pod(SM_MARK_PROXY_UPSTREAM, "a socket with SM_MARK_PROXY");
  EXPECT_FALSE(readable_within(dns.get(), 0)) << "nothing may reach the proxy's DNS socket";
}

TEST_P(DnsCaptureTest, AWorkloadWithoutTheFlagIsNotCaptured) {
  UniqueFd dns = dns_udp_socket();
  ASSERT_TRUE(dns.valid());
  enroll(/*capture_dns=*/false);
  expect_query_leaves_the_pod(0, "a workload without SM_WL_CAPTURE_DNS");
  EXPECT_FALSE(readable_within(dns.get(), 0));
}

// Without the proxy's DNS socket, DNS works as if sockmesh were not there.
TEST_P(DnsCaptureTest, WithoutARegisteredDnsSocketQueriesGoOut) {
  UniqueFd dns = dns_udp_socket(/*register_it=*/false);
  ASSERT_TRUE(dns.valid());
  enroll();
  expect_query_leaves_the_pod(0, "no dns-udp socket registered");
  EXPECT_FALSE(readable_within(dns.get(), kAbsentMs));
}

}  // namespace
}  // namespace sockmesh
