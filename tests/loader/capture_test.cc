// Capture with real traffic: a pod and a peer in network namespaces of the test's own, sockmesh
// installed under a pin root of its own with sockops on a cgroup of its own, and a small relay in
// the pod standing in for the proxy (a transparent listener registered in the listener SOCKHASH).
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>
#include <tuple>
#include <vector>

#include "base/log.h"
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
using testing::EchoServer;
using testing::Relay;

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new testing::PrivilegedEnvironment);

constexpr int kTimeoutMs = 5000;

// Declaration order is teardown order reversed: the pod's namespaces go first (taking its tc
// programs with them), then the install, then the cgroup.
class CaptureFlowTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    // The app's sockets are the cgroup's, as a pod's are the node's: sockops marks them.
    cgroup_.enter();
    auto l = maps::ListenerMap::open(install_.root());
    ASSERT_TRUE(l) << l.error().message;
    listeners_.emplace(std::move(l).value());
  }

  bool v6() const { return GetParam() == AF_INET6; }
  IpAddress pod_ip() const { return v6() ? topo_.pod_v6 : topo_.pod_v4; }
  IpAddress peer_ip() const { return v6() ? topo_.peer_v6 : topo_.peer_v4; }

  void enroll(bool capture_inbound = true) {
    loader::PodSpec pod;
    pod.netns_path = topo_.pod.path();
    pod.ifname = "eth0";
    pod.ips = {topo_.pod_v4, topo_.pod_v6};
    pod.identity.uid = "pod-a";
    pod.identity.namespace_name = "default";
    pod.identity.service_account = "sa-a";
    pod.identity.capture_inbound = capture_inbound;
    auto report = loader::enroll(install_.root(), pod);
    ASSERT_TRUE(report) << report.error().message;
  }

  void unenroll() {
    auto report = loader::unenroll(install_.root(), topo_.pod.path(), "eth0", {});
    ASSERT_TRUE(report) << report.error().message;
  }

  uint64_t counter(sm_counter c) { return testing::datapath_counter(install_.root(), c); }

  // net1 in the pod, its peer in the peer's netns: 10.201.0.2/24 and fd00:201::2/64 against .1.
  void add_second_network() {
    topo_.pod.ip({"link", "add", "net1", "type", "veth", "peer", "name", "net1", "netns",
                  topo_.peer.name()});
    for (auto [ns, v4, v6] : {std::tuple{&topo_.pod, "10.201.0.2/24", "fd00:201::2/64"},
                              std::tuple{&topo_.peer, "10.201.0.1/24", "fd00:201::1/64"}}) {
      ns->ip({"addr", "add", v4, "dev", "net1"});
      ns->ip({"addr", "add", v6, "dev", "net1", "nodad"});
      ns->ip({"link", "set", "net1", "up"});
    }
  }

  testing::TestCgroup cgroup_;
  testing::TestInstall install_{cgroup_.path()};
  testing::PodTopology topo_;
  std::optional<maps::ListenerMap> listeners_;
};

INSTANTIATE_TEST_SUITE_P(Families, CaptureFlowTest, ::testing::Values(AF_INET, AF_INET6),
                         [](const auto& info) { return info.param == AF_INET ? "IPv4" : "IPv6"; });

TEST_P(CaptureFlowTest, OutboundConnectionReachesTheProxyWithItsOriginalDestination) {
  EchoServer server(topo_.peer.path(), Endpoint{peer_ip(), 8080});
  Relay proxy(topo_.pod.path(), *listeners_, pod_ip(), ListenerKind::kOutbound,
              SM_MARK_PROXY_UPSTREAM);
  enroll();

  auto app = testing::connect_in(topo_.pod.path(), Endpoint{peer_ip(), 8080});
  ASSERT_TRUE(app.valid()) << strerror(errno);
  EXPECT_TRUE(
      testing::echo_round_trip(app.get(), testing::pattern(size_t{256} * 1024, 1), kTimeoutMs));

  auto captured = proxy.connections();
  ASSERT_EQ(captured.size(), 1u) << "the connection must arrive at the proxy's 15001 listener";
  EXPECT_EQ(captured[0].first, testing::local_of(app.get())) << "peer: the app's own socket";
  EXPECT_EQ(captured[0].second, (Endpoint{peer_ip(), 8080})) << "local: the original destination";
  auto served = server.connections();
  ASSERT_EQ(served.size(), 1u);
  EXPECT_EQ(served[0].first.ip, pod_ip()) << "the relay dialled out from the pod";
  EXPECT_EQ(counter(SM_CNT_CAPTURED_OUTBOUND), 1u);
  // Both ends of the hop between app and relay send lo-sized segments: the app's socket was
  // marked as it connected and took the pod's routes with a lo-sized MTU, and tc raised the MSS
  // its SYN offered as it bounced it. The relay's dial out of eth0 keeps eth0's size.
  auto mss = proxy.segment_sizes();
  ASSERT_EQ(mss.size(), 1u);
  EXPECT_GT(mss[0].accepted, 16000) << "the relay's segments to the app";
  EXPECT_LE(mss[0].upstream, 1460) << "the relay's dial out of eth0";
  EXPECT_GT(testing::max_segment(app.get()), 16000) << "the app's own segments to the relay";
  EXPECT_EQ(counter(SM_CNT_APP_ROUTED), 1u);
  EXPECT_EQ(counter(SM_CNT_MSS_RAISED), 1u);
  EXPECT_EQ(counter(SM_CNT_MSS_CLAMPED), 0u) << "nothing offered more than eth0 takes";
  // Once established, the app's socket (whose SYN tc gave the relay) was routed over lo: tc
  // bounced its SYN and nothing after it, not even the handshake's last ACK.
  EXPECT_EQ(testing::socket_mark(app.get()), SM_MARK_BOUNCED);
  EXPECT_EQ(counter(SM_CNT_LOCAL_ROUTED), 1u);
  EXPECT_EQ(counter(SM_CNT_BOUNCED), 1u) << "the SYN only";
}

// The same without the bypass, so that the app's bytes take TCP: over lo, every byte intact, and
// tc sees only the SYN. With --no-app-route the socket keeps the pod's routes: tc bounces its
// segments, as before there was a local route.
TEST_P(CaptureFlowTest, AppSocketToTheProxyTakesLoOnceEstablishedUnlessTheAppRouteIsOff) {
  EchoServer server(topo_.peer.path(), Endpoint{peer_ip(), 8080});
  Relay proxy(topo_.pod.path(), *listeners_, pod_ip(), ListenerKind::kOutbound,
              SM_MARK_PROXY_UPSTREAM);
  for (bool app_route : {true, false}) {
    SCOPED_TRACE(app_route ? "app route" : "--no-app-route");
    loader::InstallOptions options = install_.options();
    options.bypass = false;
    options.app_route = app_route;
    auto reinstalled = loader::install(options);
    ASSERT_TRUE(reinstalled) << reinstalled.error().message;
    enroll();
    uint64_t bounced = counter(SM_CNT_BOUNCED);
    uint64_t payload = counter(SM_CNT_TC_PAYLOAD);
    uint64_t routed = counter(SM_CNT_LOCAL_ROUTED);
    auto app = testing::connect_in(topo_.pod.path(), Endpoint{peer_ip(), 8080});
    ASSERT_TRUE(app.valid()) << strerror(errno);
    EXPECT_TRUE(
        testing::echo_round_trip(app.get(), testing::pattern(size_t{4} << 20, 9), kTimeoutMs));
    if (app_route) {
      EXPECT_EQ(testing::socket_mark(app.get()), SM_MARK_BOUNCED);
      EXPECT_EQ(counter(SM_CNT_LOCAL_ROUTED) - routed, 1u);
      EXPECT_EQ(counter(SM_CNT_BOUNCED) - bounced, 1u) << "the SYN only";
      EXPECT_EQ(counter(SM_CNT_TC_PAYLOAD) - payload, 0u);
    } else {
      EXPECT_EQ(testing::socket_mark(app.get()), 0u);
      EXPECT_EQ(counter(SM_CNT_LOCAL_ROUTED) - routed, 0u);
      EXPECT_GT(counter(SM_CNT_TC_PAYLOAD) - payload, 10u) << "4 MiB in eth0-sized segments";
    }
  }
  EXPECT_EQ(proxy.accepted(), 2);
}

// A socket routed over lo that disconnects (connect(AF_UNSPEC)) and connects again must be
// captured again: with the bounce mark kept, its new SYN would be delivered in the pod past tc
// (refused here, as nothing in the pod listens on the destination's port).
TEST_P(CaptureFlowTest, ARoutedSocketThatConnectsAgainIsCapturedAgain) {
  EchoServer server(topo_.peer.path(), Endpoint{peer_ip(), 8080});
  Relay proxy(topo_.pod.path(), *listeners_, pod_ip(), ListenerKind::kOutbound,
              SM_MARK_PROXY_UPSTREAM);
  enroll();
  auto app = testing::connect_in(topo_.pod.path(), Endpoint{peer_ip(), 8080});
  ASSERT_TRUE(app.valid()) << strerror(errno);
  EXPECT_TRUE(testing::echo_round_trip(app.get(), testing::pattern(65536, 10), kTimeoutMs));
  ASSERT_EQ(testing::socket_mark(app.get()), SM_MARK_BOUNCED);

  sockaddr_storage unspec{};
  unspec.ss_family = AF_UNSPEC;
  ASSERT_EQ(connect(app.get(), reinterpret_cast<sockaddr*>(&unspec), sizeof(sa_family_t)), 0)
      << strerror(errno);
  sockaddr_storage to{};
  socklen_t len = Endpoint{peer_ip(), 8080}.to_sockaddr(&to);
  ASSERT_EQ(connect(app.get(), reinterpret_cast<sockaddr*>(&to), len), 0)
      << "the second connect: " << strerror(errno);
  EXPECT_TRUE(testing::echo_round_trip(app.get(), testing::pattern(65536, 11), kTimeoutMs));
  EXPECT_EQ(proxy.accepted(), 2) << "both connections captured";
  EXPECT_EQ(testing::socket_mark(app.get()), SM_MARK_BOUNCED) << "and routed over lo again";
  EXPECT_EQ(counter(SM_CNT_CAPTURED_OUTBOUND), 2u);
  EXPECT_EQ(counter(SM_CNT_LOCAL_ROUTED), 2u);
}

// The apps' table: the pod's routes, the large MTU only on the unicast ones out of eth0 that have
// no MTU of their own (tc clamps the wire's MSS to eth0's MTU, which is then their path's). A
// route with its own MTU (as some CNIs set below the device's), a second network's routes and a
// blackhole are copied as they are, so that the table picks what the main one would. Unenroll
// takes the table and its rule away (PodIsUntouched... checks the whole pod).
TEST_P(CaptureFlowTest, AppRouteTableCopiesThePodsRoutesWithTheLargeMtuOnlyWhereEth0IsThePath) {
  add_second_network();
  std::string family = v6() ? "-6" : "-4";
  // Each: the route as `ip route show` prints it (and `ip route add` takes it, with `own_mtu`),
  // and the MTU its copy must have ("" for none). The last two are the connected subnets.
  struct Route {
    std::string spec;
    std::string own_mtu;
    std::string copy_mtu;
  };
  std::vector<Route> routes =
      v6() ? std::vector<Route>{{"default via fd00:200::1 dev eth0", "", "mtu 65520"},
                                {"fd00:203::/48 via fd00:200::1 dev eth0", "1400", "mtu 1400"},
                                {"fd00:202::/48 via fd00:201::1 dev net1", "", ""},
                                {"blackhole fd00:204::/48", "", ""},
                                {"fd00:200::/64 dev eth0", "", "mtu 65520"},
                                {"fd00:201::/64 dev net1", "", ""}}
           : std::vector<Route>{{"default via 10.200.0.1 dev eth0", "", "mtu 65520"},
                                {"10.203.0.0/16 via 10.200.0.1 dev eth0", "1400", "mtu 1400"},
                                {"10.202.0.0/16 via 10.201.0.1 dev net1", "", ""},
                                {"blackhole 10.204.0.0/16", "", ""},
                                {"10.200.0.0/24 dev eth0", "", "mtu 65520"},
                                {"10.201.0.0/24 dev net1", "", ""}};
  for (size_t i = 0; i + 2 < routes.size(); ++i) {
    std::vector<std::string> argv = {family, "route", "add"};
    std::istringstream words(routes[i].spec);
    for (std::string w; words >> w;) argv.push_back(w);
    if (!routes[i].own_mtu.empty()) argv.insert(argv.end(), {"mtu", routes[i].own_mtu});
    topo_.pod.ip(argv);
  }
  enroll();
  std::string table =
      topo_.pod.ip({family, "route", "show", "table", std::to_string(SM_APP_ROUTE_TABLE)});
  auto line_of = [&](const std::string& start) {
    size_t at = table.find(start);
    if (at == std::string::npos) return std::string();
    return table.substr(at, table.find('\n', at) - at);
  };
  auto mtu_of = [](const std::string& line) {
    size_t at = line.find("mtu ");
    if (at == std::string::npos) return std::string();
    return line.substr(at, line.find(' ', at + 4) - at);
  };
  for (const auto& r : routes) {
    std::string line = line_of(r.spec);
    EXPECT_NE(line, "") << r.spec << " must be copied:\n" << table;
    EXPECT_EQ(mtu_of(line), r.copy_mtu) << line;
  }
  std::string rules = topo_.pod.ip({family, "rule", "show"});
  EXPECT_NE(rules.find("32100:\tfrom all fwmark 0x100000/0x100000 lookup 21326"), std::string::npos)
      << rules;
  unenroll();
  EXPECT_EQ(topo_.pod.ip({family, "route", "show", "table", std::to_string(SM_APP_ROUTE_TABLE)}),
            "");
}

// A second network attached after enrollment (as Multus does, after the primary chain): a
// socket whose source address is that network's is not the workload's, so sockops leaves it
// unmarked and it keeps the pod's routes.
TEST_P(CaptureFlowTest, SocketOnASecondNetworkAddedAfterEnrollmentKeepsThePodsRoutes) {
  enroll();
  add_second_network();
  IpAddress far = *IpAddress::parse(v6() ? "fd00:201::1" : "10.201.0.1");
  auto listener = testing::listen_in(topo_.peer.path(), Endpoint{far, 8080});
  ASSERT_TRUE(listener.valid()) << strerror(errno);
  auto app = testing::connect_in(topo_.pod.path(), Endpoint{far, 8080});
  ASSERT_TRUE(app.valid()) << strerror(errno);
  auto served = testing::accept_within(listener.get(), kTimeoutMs);
  ASSERT_TRUE(served.valid());
  EXPECT_EQ(testing::local_of(app.get()).ip.to_string(), v6() ? "fd00:201::2" : "10.201.0.2");
  EXPECT_EQ(testing::socket_mark(app.get()), 0u);
  EXPECT_EQ(counter(SM_CNT_APP_ROUTED), 0u);
}

TEST_P(CaptureFlowTest, AppSocketWithAMarkOfItsOwnKeepsThePodsRoutes) {
  EchoServer server(topo_.peer.path(), Endpoint{peer_ip(), 8080});
  Relay proxy(topo_.pod.path(), *listeners_, pod_ip(), ListenerKind::kOutbound,
              SM_MARK_PROXY_UPSTREAM);
  enroll();
  auto app = testing::connect_in(topo_.pod.path(), Endpoint{peer_ip(), 8080},
                                 testing::SocketOptions{.mark = 0x7});
  ASSERT_TRUE(app.valid()) << strerror(errno);
  EXPECT_TRUE(testing::echo_round_trip(app.get(), testing::pattern(65536, 5), kTimeoutMs));
  EXPECT_EQ(proxy.accepted(), 1) << "captured all the same";
  EXPECT_EQ(testing::socket_mark(app.get()), 0x7u);
  EXPECT_LE(testing::max_segment(app.get()), 1460) << "its route is the pod's own, out of eth0";
  EXPECT_EQ(counter(SM_CNT_APP_ROUTED), 0u);
}

// A marked app socket whose SYN reaches the wire after all (no listener, fail-open) must not send
// what eth0 cannot carry: tc lowers the MSS the app offers the peer, and the MSS the peer offers
// back, to eth0's. The peer's route to the pod claims MTU 9000 here, so without either clamp one
// side would send segments of about 8.9 KB through a 1500-byte eth0.
TEST_P(CaptureFlowTest, AppSocketWhoseSynFailsOpenAgreesOnEth0SizedSegments) {
  topo_.peer.ip(
      {"route", "add", v6() ? "fd00:200::2/128" : "10.200.0.2/32", "dev", "eth0", "mtu", "9000"});
  auto listener = testing::listen_in(topo_.peer.path(), Endpoint{peer_ip(), 8080});
  ASSERT_TRUE(listener.valid()) << strerror(errno);
  loader::InstallOptions open = install_.options();
  open.fail_open = true;
  auto reinstalled = loader::install(open);
  ASSERT_TRUE(reinstalled) << reinstalled.error().message;
  enroll();

  auto app = testing::connect_in(topo_.pod.path(), Endpoint{peer_ip(), 8080});
  ASSERT_TRUE(app.valid()) << strerror(errno);
  auto served = testing::accept_within(listener.get(), kTimeoutMs);
  ASSERT_TRUE(served.valid()) << "fail-open: the SYN goes to the peer";
  EXPECT_EQ(testing::socket_mark(app.get()), SM_MARK_APP_ROUTE) << "not routed over lo";
  EXPECT_EQ(counter(SM_CNT_LOCAL_ROUTED), 0u) << "its peer is on the wire";
  EXPECT_EQ(counter(SM_CNT_SOCKOPS_INSERTED), 0u) << "so it stays out of the bypass too";
  EXPECT_EQ(counter(SM_CNT_NO_LISTENER), 1u);
  EXPECT_EQ(counter(SM_CNT_MSS_CLAMPED), 2u) << "the app's SYN out, the peer's SYN-ACK in";
  EXPECT_LE(testing::max_segment(app.get()), 1460) << "the app's segments to the wire";
  EXPECT_LE(testing::max_segment(served.get()), 1460) << "the peer's segments to the pod";
  // And bytes cross both ways at that size.
  EXPECT_TRUE(testing::send_and_receive(app.get(), served.get(),
                                        testing::pattern(size_t{512} * 1024, 6), kTimeoutMs))
      << "app -> peer";
  EXPECT_TRUE(testing::send_and_receive(served.get(), app.get(),
                                        testing::pattern(size_t{512} * 1024, 7), kTimeoutMs))
      << "peer -> app";
}

TEST_P(CaptureFlowTest, InboundConnectionToAnAppPortLandsOn15006) {
  EchoServer app(topo_.pod.path(), Endpoint{pod_ip(), 8080});
  Relay proxy(topo_.pod.path(), *listeners_, pod_ip(), ListenerKind::kInboundPlain,
              SM_MARK_PROXY_TO_APP);
  enroll();

  auto client = testing::connect_in(topo_.peer.path(), Endpoint{pod_ip(), 8080});
  ASSERT_TRUE(client.valid()) << strerror(errno);
  EXPECT_TRUE(
      testing::echo_round_trip(client.get(), testing::pattern(size_t{256} * 1024, 2), kTimeoutMs));

  auto captured = proxy.connections();
  ASSERT_EQ(captured.size(), 1u) << "the connection must arrive at the proxy's 15006 listener";
  EXPECT_EQ(captured[0].first, testing::local_of(client.get()));
  EXPECT_EQ(captured[0].second, (Endpoint{pod_ip(), 8080}));
  auto direct = app.connections();
  ASSERT_EQ(direct.size(), 1u);
  EXPECT_EQ(direct[0].first.ip, pod_ip()) << "the app sees the relay, not the client";
  EXPECT_EQ(counter(SM_CNT_CAPTURED_INBOUND), 1u);
}

TEST_P(CaptureFlowTest, InboundRelayMayKeepTheClientAddressTowardsTheApp) {
  // The app's replies to the client's (non-local) address leave through eth0; tc egress finds the
  // proxy's transparent socket for them and bounces them back to it.
  EchoServer app(topo_.pod.path(), Endpoint{pod_ip(), 8080});
  Relay proxy(topo_.pod.path(), *listeners_, pod_ip(), ListenerKind::kInboundPlain,
              SM_MARK_PROXY_TO_APP, /*keep_source=*/true);
  enroll();

  auto client = testing::connect_in(topo_.peer.path(), Endpoint{pod_ip(), 8080});
  ASSERT_TRUE(client.valid()) << strerror(errno);
  EXPECT_TRUE(
      testing::echo_round_trip(client.get(), testing::pattern(size_t{256} * 1024, 4), kTimeoutMs));
  auto direct = app.connections();
  ASSERT_EQ(direct.size(), 1u);
  EXPECT_EQ(direct[0].first.ip, peer_ip()) << "the app sees the client's address";
  EXPECT_EQ(counter(SM_CNT_CAPTURED_INBOUND), 1u);
  EXPECT_GT(counter(SM_CNT_BOUNCED), 0u);
  // The app's SYN-ACK to the client's address carried eth0's MSS; bounced to the relay's
  // transparent socket with the local hop's instead, so the relay sends to the app in lo-sized
  // segments, as it does when it dials from the pod's own address.
  auto mss = proxy.segment_sizes();
  ASSERT_EQ(mss.size(), 1u);
  EXPECT_GT(mss[0].upstream, 16000) << "the relay's segments to the app";
  EXPECT_EQ(counter(SM_CNT_MSS_RAISED), 1u);
  // Once the relay's dial was established, the app's accepted socket (its peer proven by the
  // bypass's pairing note) was routed over lo: tc bounced its SYN-ACK only.
  EXPECT_EQ(counter(SM_CNT_LOCAL_ROUTED), 1u);
  EXPECT_EQ(counter(SM_CNT_BOUNCED), 1u) << "the app's SYN-ACK only";
}

// The app's socket accepted from a relay that kept the client's address answers to a remote
// address, whose route is eth0's; sockops marks it once accepted, so it sends to the relay in
// lo-sized segments too (the relay offered lo's MSS in its SYN). Without the bypass, so that its
// sends take TCP (bypassed, they skip segmentation altogether until the flow is pinned to the
// stack).
TEST_P(CaptureFlowTest, AppsAcceptedSocketAnswersTheRelayInLoSizedSegments) {
  loader::InstallOptions no_bypass = install_.options();
  no_bypass.bypass = false;
  auto reinstalled = loader::install(no_bypass);
  ASSERT_TRUE(reinstalled) << reinstalled.error().message;
  auto app_listener = testing::listen_in(topo_.pod.path(), Endpoint{pod_ip(), 8080});
  ASSERT_TRUE(app_listener.valid()) << strerror(errno);
  Relay proxy(topo_.pod.path(), *listeners_, pod_ip(), ListenerKind::kInboundPlain,
              SM_MARK_PROXY_TO_APP, /*keep_source=*/true);
  enroll();

  auto client = testing::connect_in(topo_.peer.path(), Endpoint{pod_ip(), 8080});
  ASSERT_TRUE(client.valid()) << strerror(errno);
  auto app = testing::accept_within(app_listener.get(), kTimeoutMs);
  ASSERT_TRUE(app.valid()) << "the relay's dial must reach the app";
  EXPECT_EQ(testing::peer_of(app.get()).ip, peer_ip()) << "the client's address, kept";
  EXPECT_TRUE(testing::send_and_receive(app.get(), client.get(),
                                        testing::pattern(size_t{512} * 1024, 8), kTimeoutMs))
      << "the app's answer, through the relay, to the client";
  EXPECT_EQ(testing::socket_mark(app.get()), SM_MARK_APP_ROUTE)
      << "without the bypass's pairing note, not routed over lo";
  EXPECT_GT(testing::max_segment(app.get()), 16000) << "the app's segments to the relay";
  EXPECT_EQ(counter(SM_CNT_APP_ROUTED), 1u) << "the app's accepted socket; not the relay's dial";
}

TEST_P(CaptureFlowTest, HboneOn15008IsNotCaptured) {
  Relay proxy(topo_.pod.path(), *listeners_, pod_ip(), ListenerKind::kInboundPlain,
              SM_MARK_PROXY_TO_APP);
  auto hbone = testing::listen_in(topo_.pod.path(), Endpoint{pod_ip(), SM_PORT_HBONE},
                                  testing::SocketOptions{.mark = SM_MARK_PROXY});
  enroll();

  auto client = testing::connect_in(topo_.peer.path(), Endpoint{pod_ip(), SM_PORT_HBONE});
  ASSERT_TRUE(client.valid()) << strerror(errno);
  auto accepted = testing::accept_within(hbone.get(), kTimeoutMs);
  ASSERT_TRUE(accepted.valid()) << "HBONE must reach the 15008 listener";
  EXPECT_EQ(testing::peer_of(accepted.get()), testing::local_of(client.get()));
  EXPECT_EQ(proxy.accepted(), 0);
  EXPECT_EQ(counter(SM_CNT_CAPTURED_INBOUND), 0u);
}

TEST_P(CaptureFlowTest, PodIsUntouchedBeforeEnrollAndAfterUnenroll) {
  EchoServer server(topo_.peer.path(), Endpoint{peer_ip(), 8080});
  Relay proxy(topo_.pod.path(), *listeners_, pod_ip(), ListenerKind::kOutbound,
              SM_MARK_PROXY_UPSTREAM);
  auto direct_connection = [&] {
    auto app = testing::connect_in(topo_.pod.path(), Endpoint{peer_ip(), 8080});
    ASSERT_TRUE(app.valid()) << strerror(errno);
    EXPECT_TRUE(testing::echo_round_trip(app.get(), testing::pattern(4096, 3), kTimeoutMs));
  };
  std::string before = topo_.pod_snapshot();

  direct_connection();
  EXPECT_EQ(proxy.accepted(), 0) << "not enrolled: not captured";

  enroll();
  EXPECT_NE(topo_.pod_snapshot(), before);
  direct_connection();
  EXPECT_EQ(proxy.accepted(), 1) << "enrolled: captured";

  unenroll();
  EXPECT_EQ(topo_.pod_snapshot(), before) << "unenroll must restore the pod exactly";
  direct_connection();
  EXPECT_EQ(proxy.accepted(), 1) << "unenrolled: not captured any more";
  EXPECT_EQ(server.accepted(), 3);
}

}  // namespace
}  // namespace sockmesh
