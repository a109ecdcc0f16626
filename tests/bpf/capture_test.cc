// In-kernel tests of the tc capture programs (bpf/capture.bpf.c): crafted frames through
// BPF_PROG_TEST_RUN, one test per decision, checking the verdict, the frame and mark that come
// out, and which counter moved. The programs run in a network namespace of the test's own, where
// real listening and connected sockets give bpf_skc_lookup_tcp and the listener SOCKHASH
// something to find.
//
// What test-run cannot show: test-run does not run the program at tc ingress (skb->tc_at_ingress
// is 0), so bpf_sk_assign answers -EOPNOTSUPP there. For the assigning decisions these tests check
// that the program found the right listener and reached the assign (assign_failed moves, with
// -EOPNOTSUPP, instead of no_listener); that the SYN then lands on the listener, and that bounced
// packets are delivered, tests/loader/capture_test.cc shows with real traffic in namespaces.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <linux/if.h>
#include <linux/pkt_cls.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <optional>

#include "capture.skel.h"
#include "loader/attach/bpffs.h"
#include "loader/attach/skeleton.h"
#include "loader/maps/bypass_flows.h"
#include "loader/maps/counters.h"
#include "loader/maps/listener_map.h"
#include "loader/maps/node_addrs.h"
#include "loader/maps/unique_fd.h"
#include "loader/maps/workload_map.h"
#include "sockmesh/consts.h"
#include "sockmesh/maps.h"
#include "testing/packet.h"
#include "testing/privileged.h"

namespace sockmesh {
namespace {

using loader::BpfSkeleton;
using maps::CounterValues;
using maps::ListenerKind;
using maps::UniqueFd;
using testing::kAck;
using testing::kPsh;
using testing::kSyn;
using testing::tcp_frame;
using testing::first_option_mss;
using testing::set_tcp_checksum;
using testing::tcp_checksum_residue;
using testing::with_tcp_options;

IpAddress ip(const char* text) { return *IpAddress::parse(text); }
Endpoint ep(const char* text) { return *Endpoint::parse(text); }

// The test binary runs in a network namespace of its own, with lo up: its sockets and the
// programs' lookups see nothing of the host's.
class IsolatedNetns : public ::testing::Environment {
 public:
  void SetUp() override {
    testing::require_root();
    if (unshare(CLONE_NEWNET) != 0) {
      testing::skip_privileged(std::string("unshare(CLONE_NEWNET): ") + strerror(errno));
    }
    UniqueFd s(socket(AF_INET, SOCK_DGRAM, 0));
    ifreq ifr{};
    std::strcpy(ifr.ifr_name, "lo");
    ASSERT_EQ(ioctl(s.get(), SIOCGIFFLAGS, &ifr), 0);
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
    ASSERT_EQ(ioctl(s.get(), SIOCSIFFLAGS, &ifr), 0);
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new IsolatedNetns);

UniqueFd tcp_listener(const char* addr) {
  auto at = Endpoint::parse(std::string(addr) + ":1");
  at->port = 0;
  sockaddr_storage ss{};
  socklen_t len = at->to_sockaddr(&ss);
  UniqueFd fd(socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len), 0) << strerror(errno);
  EXPECT_EQ(listen(fd.get(), 16), 0);
  return fd;
}

Endpoint local_endpoint(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return *Endpoint::from_sockaddr(reinterpret_cast<sockaddr*>(&ss));
}

// A real TCP connection on loopback from `from` (bound when given) to a listener on `to`: the
// accepted socket owns the flow's tuple, as the proxy's transparent socket owns a captured flow's.
struct Connection {
  UniqueFd server, client, accepted;
  Endpoint server_ep, client_ep;
};

Connection connect_on_loopback(const char* to, const char* from = nullptr) {
  Connection c;
  c.server = tcp_listener(to);
  c.server_ep = local_endpoint(c.server.get());
  sockaddr_storage dst{};
  socklen_t dst_len = c.server_ep.to_sockaddr(&dst);
  c.client = UniqueFd(socket(dst.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (from != nullptr) {
    auto at = Endpoint::parse(std::string(from) + ":1");
    at->port = 0;  // any port (parse refuses 0)
    sockaddr_storage src{};
    socklen_t src_len = at->to_sockaddr(&src);
    EXPECT_EQ(bind(c.client.get(), reinterpret_cast<sockaddr*>(&src), src_len), 0);
  }
  EXPECT_EQ(connect(c.client.get(), reinterpret_cast<sockaddr*>(&dst), dst_len), 0);
  c.accepted = UniqueFd(accept(c.server.get(), nullptr, nullptr));
  EXPECT_TRUE(c.accepted.valid());
  c.client_ep = local_endpoint(c.client.get());
  return c;
}

struct RunResult {
  int verdict = -1;
  uint32_t mark = 0;
  std::vector<uint8_t> frame;
};

class CaptureTest : public ::testing::Test {
 protected:
  void SetUp() override { load(/*fail_open=*/false); }

  void TearDown() override {
    skel_.reset();
    workloads_.reset();
    listeners_.reset();
    counters_.reset();
    for (const char* m : {SM_MAP_WORKLOADS, SM_MAP_LISTENERS, SM_MAP_COUNTERS, SM_MAP_BYPASS,
                          SM_MAP_BYPASS_PROXY, SM_MAP_STACK_FLOWS, SM_MAP_AWAIT_PEER,
                          SM_MAP_NODE_ADDRS, SM_MAP_TIME_WAIT_SYNS, SM_MAP_PROXY_SYNS}) {
      unlink((root_ + "/" + m).c_str());
    }
    rmdir(root_.c_str());
  }

  void load(bool fail_open) {
    if (!root_.empty()) TearDown();
    static std::atomic<int> counter{0};
    root_ = "/sys/fs/bpf/sockmesh-test-bpf-" + std::to_string(getpid()) + "-" +
            std::to_string(counter++);
    auto dir = loader::ensure_bpffs_dir(root_);
    ASSERT_TRUE(dir) << dir.error().message;
    auto skel = BpfSkeleton<capture_bpf>::open("capture", root_);
    ASSERT_TRUE(skel) << skel.error().message;
    skel.value()->rodata->cfg_fail_open = fail_open;
    auto loaded = skel->load();
    ASSERT_TRUE(loaded) << loaded.error().message;
    skel_.emplace(std::move(skel).value());
    auto w = maps::WorkloadMap::open(root_);
    ASSERT_TRUE(w) << w.error().message;
    workloads_.emplace(std::move(w).value());
    auto l = maps::ListenerMap::open(root_);
    ASSERT_TRUE(l) << l.error().message;
    listeners_.emplace(std::move(l).value());
    auto c = maps::CounterReader::open(root_);
    ASSERT_TRUE(c) << c.error().message;
    counters_.emplace(std::move(c).value());
    baseline_ = read_counters();
  }

  void enroll(const char* pod, bool capture_inbound = true) {
    maps::WorkloadRecord r;
    r.uid = "uid-" + std::string(pod);
    r.namespace_name = "default";
    r.service_account = "sa";
    r.capture_inbound = capture_inbound;
    auto s = workloads_->enroll(ip(pod), r);
    ASSERT_TRUE(s) << s.error().message;
  }

  // Registers a real listener (bound on loopback) as the pod's proxy listener of `kind`.
  UniqueFd register_listener(const char* pod, ListenerKind kind) {
    UniqueFd fd = tcp_listener(ip(pod).is_v4() ? "127.0.0.1" : "[::1]");
    auto s = listeners_->add(ip(pod), kind, fd.get());
    EXPECT_TRUE(s) << s.error().message;
    return fd;
  }

  RunResult run(bpf_program* prog, const std::vector<uint8_t>& frame, uint32_t mark = 0) {
    RunResult out;
    out.frame.resize(frame.size() + 256);
    __sk_buff ctx_in{};
    ctx_in.mark = mark;
    ctx_in.ifindex = 1;  // lo: the bounce redirects to skb->ifindex
    __sk_buff ctx_out{};
    LIBBPF_OPTS(bpf_test_run_opts, opts);
    opts.data_in = frame.data();
    opts.data_size_in = static_cast<uint32_t>(frame.size());
    opts.data_out = out.frame.data();
    opts.data_size_out = static_cast<uint32_t>(out.frame.size());
    opts.ctx_in = &ctx_in;
    opts.ctx_size_in = sizeof(ctx_in);
    opts.ctx_out = &ctx_out;
    opts.ctx_size_out = sizeof(ctx_out);
    int err = bpf_prog_test_run_opts(bpf_program__fd(prog), &opts);
    EXPECT_EQ(err, 0) << strerror(errno);
    out.verdict = static_cast<int>(opts.retval);
    out.mark = ctx_out.mark;
    out.frame.resize(opts.data_size_out);
    return out;
  }

  RunResult egress(const std::vector<uint8_t>& frame, uint32_t mark = 0) {
    return run(skel_.value()->progs.sm_tc_egress, frame, mark);
  }
  RunResult ingress(const std::vector<uint8_t>& frame, uint32_t mark = 0) {
    return run(skel_.value()->progs.sm_tc_ingress, frame, mark);
  }

  CounterValues read_counters() {
    auto v = counters_->read();
    EXPECT_TRUE(v) << v.error().message;
    return v ? *v : CounterValues{};
  }

  // Counters moved since the last call, as {counter: delta}; the rest must be still.
  std::map<std::string, uint64_t> moved() {
    CounterValues now = read_counters();
    std::map<std::string, uint64_t> out;
    for (int i = 0; i < SM_CNT_COUNT; ++i) {
      if (now[i] != baseline_[i]) {
        out[std::string(maps::counter_name(static_cast<sm_counter>(i)))] = now[i] - baseline_[i];
      }
    }
    baseline_ = now;
    return out;
  }

  // The decision reached bpf_sk_assign with a listener in hand; see the file comment.
  void expect_assign_attempted(const RunResult& r) {
    EXPECT_EQ(r.verdict, TC_ACT_SHOT) << "fail closed when the assign is refused";
    EXPECT_EQ(moved(), (Counts{{"assign_failed", 1}}));
    EXPECT_EQ(skel_.value()->bss->sm_last_assign_error, -EOPNOTSUPP);
    skel_.value()->bss->sm_last_assign_error = 0;
  }

  static bool dest_mac_is_source_mac(const std::vector<uint8_t>& frame) {
    return frame.size() >= 12 && std::memcmp(frame.data(), frame.data() + 6, 6) == 0;
  }

  using Counts = std::map<std::string, uint64_t>;

  std::string root_;
  std::optional<BpfSkeleton<capture_bpf>> skel_;
  std::optional<maps::WorkloadMap> workloads_;
  std::optional<maps::ListenerMap> listeners_;
  std::optional<maps::CounterReader> counters_;
  CounterValues baseline_{};
};

TEST_F(CaptureTest, EgressBouncesNewOutboundSynIntoIngress) {
  enroll("10.0.0.2");
  UniqueFd proxy = register_listener("10.0.0.2", ListenerKind::kOutbound);
  auto r = egress(tcp_frame(ep("10.0.0.2:40000"), ep("10.9.0.1:80"), kSyn));
  EXPECT_EQ(r.verdict, TC_ACT_REDIRECT);
  EXPECT_TRUE(dest_mac_is_source_mac(r.frame)) << "the bounced frame must be for this host";
  EXPECT_EQ(r.mark & SM_MARK_MASK, SM_MARK_BOUNCED);
  EXPECT_EQ(moved(), (Counts{{"bounced", 1}}));
}

// The options a Linux SYN carries: MSS first, then SACK-permitted, timestamps, NOP, window scale.
std::vector<uint8_t> syn_options(uint16_t mss) {
  return {2, 4, static_cast<uint8_t>(mss >> 8), static_cast<uint8_t>(mss & 0xff), 4, 2, 8, 10,
          0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7};
}

TEST_F(CaptureTest, BouncedSynOffersTheProxyTheLocalHopMss) {
  enroll("10.0.0.2");
  enroll("fd00::2");
  UniqueFd proxy = register_listener("10.0.0.2", ListenerKind::kOutbound);
  UniqueFd proxy6 = register_listener("fd00::2", ListenerKind::kOutbound);
  for (const char* to : {"10.9.0.1:80", "[fd00:9::1]:443"}) {
    bool v6 = to[0] == '[';
    auto frame = with_tcp_options(
        tcp_frame(ep(v6 ? "[fd00::2]:40000" : "10.0.0.2:40000"), ep(to), kSyn), syn_options(1460));
    set_tcp_checksum(frame);
    ASSERT_EQ(tcp_checksum_residue(frame), 0) << "the test's own checksum";
    auto r = egress(frame);
    EXPECT_EQ(r.verdict, TC_ACT_REDIRECT) << to;
    EXPECT_EQ(first_option_mss(r.frame), SM_LOCAL_HOP_MSS) << to;
    EXPECT_EQ(tcp_checksum_residue(r.frame), 0) << to << ": the checksum follows the option";
    // Nothing else changed but the destination MAC: the segment is the one with that MSS.
    auto expected = with_tcp_options(
        tcp_frame(ep(v6 ? "[fd00::2]:40000" : "10.0.0.2:40000"), ep(to), kSyn),
        syn_options(SM_LOCAL_HOP_MSS));
    set_tcp_checksum(expected);
    ASSERT_EQ(r.frame.size(), expected.size());
    EXPECT_TRUE(std::equal(expected.begin() + 6, expected.end(), r.frame.begin() + 6)) << to;
    EXPECT_EQ(moved(), (Counts{{"bounced", 1}, {"mss_raised", 1}})) << to;
  }
}

// A frame that ends inside its headers: the parser finds the header short, has nothing to pull,
// and lets the frame through as unparsed, for an enrolled pod with a listener as for any other.
TEST_F(CaptureTest, FramesCutShortInTheirHeadersAreLetThroughAsUnparsed) {
  enroll("10.0.0.2");
  enroll("fd00::2");
  UniqueFd proxy = register_listener("10.0.0.2", ListenerKind::kOutbound);
  UniqueFd proxy6 = register_listener("fd00::2", ListenerKind::kOutbound);
  auto v4 = tcp_frame(ep("10.0.0.2:40000"), ep("10.9.0.1:80"), kSyn);
  auto v6 = tcp_frame(ep("[fd00::2]:40000"), ep("[fd00:9::1]:443"), kSyn);
  ASSERT_EQ(egress(v4).verdict, TC_ACT_REDIRECT) << "the whole frame is captured";
  ASSERT_EQ(egress(v6).verdict, TC_ACT_REDIRECT);
  moved();
  size_t tcp4 = testing::l4_offset(v4), tcp6 = testing::l4_offset(v6);
  // Cut in the TCP header (the kernel's test run refuses a frame cut in its IP header).
  std::vector<std::vector<uint8_t>> cut = {
      {v4.begin(), v4.begin() + static_cast<std::ptrdiff_t>(tcp4 + 10)},
      {v6.begin(), v6.begin() + static_cast<std::ptrdiff_t>(tcp6 + 12)},
  };
  for (size_t i = 0; i < cut.size(); ++i) {
    auto r = egress(cut[i]);
    EXPECT_EQ(r.verdict, TC_ACT_OK) << i;
    EXPECT_EQ(ingress(cut[i]).verdict, TC_ACT_OK) << i;
    EXPECT_EQ(moved(), (Counts{{"unparsed", 2}})) << i;
  }
}

// The MSS option is found after the IPv6 extension headers the parser steps over: a SYN behind a
// Hop-by-Hop header has its MSS raised and its checksum kept right, and the header is untouched.
TEST_F(CaptureTest, MssIsRewrittenBehindIpv6ExtensionHeaders) {
  enroll("fd00::2");
  UniqueFd proxy6 = register_listener("fd00::2", ListenerKind::kOutbound);
  auto syn = [](uint16_t mss) {
    auto frame = with_tcp_options(tcp_frame(ep("[fd00::2]:40000"), ep("[fd00:9::1]:443"), kSyn),
                                  syn_options(mss));
    set_tcp_checksum(frame);  // the pseudo-header has no extension headers in it
    frame = testing::with_ipv6_extension(std::move(frame), 0, {1, 4, 0, 0, 0, 0});  // PadN
    return testing::with_ipv6_extension(std::move(frame), 60, {1, 4, 0, 0, 0, 0});
  };
  auto frame = syn(1440);
  ASSERT_EQ(testing::l4_offset(frame), sizeof(ethhdr) + sizeof(ipv6hdr) + 16);
  ASSERT_EQ(first_option_mss(frame), 1440);
  ASSERT_EQ(tcp_checksum_residue(frame), 0) << "the test's own checksum";
  auto r = egress(frame);
  EXPECT_EQ(r.verdict, TC_ACT_REDIRECT);
  EXPECT_EQ(first_option_mss(r.frame), SM_LOCAL_HOP_MSS);
  EXPECT_EQ(tcp_checksum_residue(r.frame), 0) << "the checksum follows the option";
  auto expected = syn(SM_LOCAL_HOP_MSS);
  ASSERT_EQ(r.frame.size(), expected.size());
  EXPECT_TRUE(std::equal(expected.begin() + 6, expected.end(), r.frame.begin() + 6))
      << "only the MSS (and its checksum) and the destination MAC may change";
  EXPECT_EQ(moved(), (Counts{{"bounced", 1}, {"mss_raised", 1}}));
}

TEST_F(CaptureTest, MssIsLeftAloneWhenItIsNotTheFirstOptionOrAlreadyLarge) {
  enroll("10.0.0.2");
  UniqueFd proxy = register_listener("10.0.0.2", ListenerKind::kOutbound);
  auto from = ep("10.0.0.2:40000"), to = ep("10.9.0.1:80");
  std::vector<std::vector<uint8_t>> frames = {
      with_tcp_options(tcp_frame(from, to, kSyn), {1, 1, 1, 0}),       // NOPs, no MSS
      with_tcp_options(tcp_frame(from, to, kSyn), {1, 2, 4, 5, 180, 0, 0, 0}),  // MSS 2nd
      with_tcp_options(tcp_frame(from, to, kSyn), syn_options(SM_LOCAL_HOP_MSS)),
      tcp_frame(from, to, kSyn),  // no options at all
  };
  for (auto& frame : frames) {
    set_tcp_checksum(frame);
    auto r = egress(frame);
    EXPECT_EQ(r.verdict, TC_ACT_REDIRECT);
    ASSERT_EQ(r.frame.size(), frame.size());
    EXPECT_TRUE(std::equal(frame.begin() + 12, frame.end(), r.frame.begin() + 12))
        << "only the MAC may change";
    EXPECT_EQ(moved(), (Counts{{"bounced", 1}}));
  }
}

TEST_F(CaptureTest, IngressAssignsBouncedSynToTheOutboundListener) {
  enroll("10.0.0.2");
  UniqueFd proxy = register_listener("10.0.0.2", ListenerKind::kOutbound);
  auto frame = tcp_frame(ep("10.0.0.2:40000"), ep("10.9.0.1:80"), kSyn);
  std::memcpy(frame.data(), frame.data() + 6, 6);  // as egress left it
  expect_assign_attempted(ingress(frame, SM_MARK_BOUNCED));
}

TEST_F(CaptureTest, OnlyTheListenerOfTheRightKindIsUsed) {
  enroll("10.0.0.2");
  UniqueFd inbound = register_listener("10.0.0.2", ListenerKind::kInboundPlain);
  UniqueFd hbone = register_listener("10.0.0.2", ListenerKind::kHbone);
  UniqueFd other_pod = register_listener("10.0.0.3", ListenerKind::kOutbound);
  auto frame = tcp_frame(ep("10.0.0.2:40000"), ep("10.9.0.1:80"), kSyn);
  EXPECT_EQ(egress(frame).verdict, TC_ACT_SHOT);
  EXPECT_EQ(moved(), (Counts{{"no_listener", 1}}));
  EXPECT_EQ(ingress(frame, SM_MARK_BOUNCED).verdict, TC_ACT_SHOT);
  EXPECT_EQ(moved(), (Counts{{"no_listener", 1}}));
}

TEST_F(CaptureTest, SynIsDroppedWhenTheProxyListenerIsMissing) {
  enroll("10.0.0.2");
  auto r = egress(tcp_frame(ep("10.0.0.2:40000"), ep("10.9.0.1:80"), kSyn));
  EXPECT_EQ(r.verdict, TC_ACT_SHOT) << "an enrolled pod must not talk around the mesh";
  EXPECT_EQ(moved(), (Counts{{"no_listener", 1}}));

  auto in = ingress(tcp_frame(ep("10.9.0.1:5555"), ep("10.0.0.2:8080"), kSyn));
  EXPECT_EQ(in.verdict, TC_ACT_SHOT);
  EXPECT_EQ(moved(), (Counts{{"no_listener", 1}}));
}

TEST_F(CaptureTest, FailOpenPassesSynWhenTheProxyListenerIsMissing) {
  load(/*fail_open=*/true);
  enroll("10.0.0.2");
  auto r = egress(tcp_frame(ep("10.0.0.2:40000"), ep("10.9.0.1:80"), kSyn));
  EXPECT_EQ(r.verdict, TC_ACT_OK);
  EXPECT_EQ(r.mark, 0u);
  EXPECT_EQ(moved(), (Counts{{"no_listener", 1}}));
}

// sm_proxy_syns vouches to sockops that an app socket's peer is the proxy in its pod (it then
// routes the socket over lo). A note left by an earlier SYN of the tuple that the proxy took must
// not outlive a SYN of that tuple that goes to the wire: egress removes it there, and only there.
// (The note's writing is at ingress, after an assign test-run cannot do; tests/loader/capture_test
// shows it with real traffic.)
TEST_F(CaptureTest, AFailOpenSynToTheWireRemovesTheTuplesProxySynNote) {
  load(/*fail_open=*/true);
  enroll("10.0.0.2");  // its record's netns cookie is 0: the note's key carries the same
  UniqueFd notes(bpf_obj_get((root_ + "/" + SM_MAP_PROXY_SYNS).c_str()));
  ASSERT_TRUE(notes.valid()) << strerror(errno);
  sm_flow_key key = maps::FlowKey{0, ep("10.0.0.2:40000"), ep("10.9.0.1:80")}.to_kernel();
  sm_peer_note note{.created_ns = 1};
  ASSERT_EQ(bpf_map_update_elem(notes.get(), &key, &note, BPF_ANY), 0) << strerror(errno);
  auto syn = tcp_frame(ep("10.0.0.2:40000"), ep("10.9.0.1:80"), kSyn);
  {
    UniqueFd proxy = register_listener("10.0.0.2", ListenerKind::kOutbound);
    EXPECT_EQ(egress(syn).mark, SM_MARK_BOUNCED);
    EXPECT_EQ(moved(), (Counts{{"bounced", 1}}));
    EXPECT_EQ(bpf_map_lookup_elem(notes.get(), &key, &note), 0) << "bounced: the note stays";
  }  // the proxy's listener closes, and leaves the SOCKHASH
  auto r = egress(syn);
  EXPECT_EQ(r.verdict, TC_ACT_OK);
  EXPECT_EQ(r.mark, 0u);
  EXPECT_EQ(moved(), (Counts{{"no_listener", 1}}));
  EXPECT_NE(bpf_map_lookup_elem(notes.get(), &key, &note), 0) << "to the wire: the note is gone";
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(CaptureTest, EgressBouncesPacketsOfAKnownFlowAndPassesOthers) {
  enroll("127.0.0.2");
  // A real connection 127.0.0.2:C -> 127.0.0.1:P.
  Connection conn = connect_on_loopback("127.0.0.1", "127.0.0.2");
  ASSERT_FALSE(HasFailure());
  const Endpoint& server_ep = conn.server_ep;
  const Endpoint& client_ep = conn.client_ep;
  moved();

  auto known = egress(tcp_frame(client_ep, server_ep, kAck | kPsh, 100));
  EXPECT_EQ(known.verdict, TC_ACT_REDIRECT);
  EXPECT_EQ(known.mark & SM_MARK_MASK, SM_MARK_BOUNCED);
  EXPECT_EQ(moved(), (Counts{{"bounced", 1}, {"tc_payload", 1}}));

  // A SYN-ACK on that tuple (as the app answers the proxy's transparent dial): bounced, with
  // the local hop's MSS in place of the one of the app's route to the remote address.
  auto syn_ack = with_tcp_options(tcp_frame(client_ep, server_ep, kSyn | kAck), syn_options(1448));
  set_tcp_checksum(syn_ack);
  auto answered = egress(syn_ack);
  EXPECT_EQ(answered.verdict, TC_ACT_REDIRECT);
  EXPECT_EQ(first_option_mss(answered.frame), SM_LOCAL_HOP_MSS);
  EXPECT_EQ(tcp_checksum_residue(answered.frame), 0);
  EXPECT_EQ(moved(), (Counts{{"bounced", 1}, {"mss_raised", 1}}));

  // Same destination, another source port: only the listener matches, so it is not ours.
  Endpoint stranger = client_ep;
  stranger.port = static_cast<uint16_t>(client_ep.port + 1);
  auto unknown = egress(tcp_frame(stranger, server_ep, kAck));
  EXPECT_EQ(unknown.verdict, TC_ACT_OK);
  EXPECT_EQ(unknown.mark, 0u);
  EXPECT_EQ(moved(), (Counts{{"passed", 1}, {"unknown_flow", 1}}));
}

TEST_F(CaptureTest, IngressLetsBouncedPacketsOfKnownFlowsThroughWithTheirMark) {
  enroll("10.0.0.2");
  auto r =
      ingress(tcp_frame(ep("10.0.0.2:40000"), ep("10.9.0.1:80"), kAck | kPsh, 10), SM_MARK_BOUNCED);
  EXPECT_EQ(r.verdict, TC_ACT_OK);
  EXPECT_EQ(r.mark & SM_MARK_MASK, SM_MARK_BOUNCED);
  EXPECT_EQ(moved(), (Counts{{"passed", 1}}));
}

TEST_F(CaptureTest, IngressAssignsInboundSynToAnAppPortToTheInboundPlainListener) {
  enroll("127.0.0.2");
  UniqueFd proxy = register_listener("127.0.0.2", ListenerKind::kInboundPlain);
  // The app's own listener on the port: a listener is not a known flow, so it is captured.
  UniqueFd app = tcp_listener("127.0.0.2");
  Endpoint app_ep = local_endpoint(app.get());
  expect_assign_attempted(ingress(tcp_frame(ep("10.9.0.1:5555"), app_ep, kSyn)));
}

TEST_F(CaptureTest, InboundSynFromTheNodesOwnAddressIsNotCaptured) {
  enroll("127.0.0.2");
  UniqueFd proxy = register_listener("127.0.0.2", ListenerKind::kInboundPlain);
  UniqueFd app = tcp_listener("127.0.0.2");
  Endpoint app_ep = local_endpoint(app.get());
  auto nodes = maps::NodeAddrMap::open(root_);
  ASSERT_TRUE(nodes) << nodes.error().message;
  ASSERT_TRUE(nodes->replace({ip("10.9.0.1"), ip("fd00::1")}));
  // The kubelet's probe from the node: straight to the app, counted.
  auto r = ingress(tcp_frame(ep("10.9.0.1:5555"), app_ep, kSyn));
  EXPECT_EQ(r.verdict, TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"node_exempt", 1}}));
  // Anyone else is captured as before.
  expect_assign_attempted(ingress(tcp_frame(ep("10.9.0.7:5555"), app_ep, kSyn)));
  // And once the address leaves the set, so is the node.
  auto changed = nodes->replace({ip("fd00::1")});
  ASSERT_TRUE(changed);
  EXPECT_EQ(*changed, 1u);
  expect_assign_attempted(ingress(tcp_frame(ep("10.9.0.1:5555"), app_ep, kSyn)));
}

TEST_F(CaptureTest, IngressNeverCapturesTheProxyPorts) {
  enroll("10.0.0.2");
  UniqueFd proxy = register_listener("10.0.0.2", ListenerKind::kInboundPlain);
  for (uint16_t port : {SM_PORT_HBONE, SM_PORT_OUTBOUND, SM_PORT_INBOUND_PLAIN}) {
    Endpoint to{ip("10.0.0.2"), port};
    auto r = ingress(tcp_frame(ep("10.9.0.1:5555"), to, kSyn));
    EXPECT_EQ(r.verdict, TC_ACT_OK) << port;
    EXPECT_EQ(moved(), (Counts{{"passed", 1}})) << port;
  }
}

TEST_F(CaptureTest, InboundIsNotCapturedWithoutCaptureInbound) {
  enroll("10.0.0.2", /*capture_inbound=*/false);
  UniqueFd proxy = register_listener("10.0.0.2", ListenerKind::kInboundPlain);
  auto r = ingress(tcp_frame(ep("10.9.0.1:5555"), ep("10.0.0.2:8080"), kSyn));
  EXPECT_EQ(r.verdict, TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"passed", 1}}));
}

TEST_F(CaptureTest, ProxyMarkedPacketsAreNeverCaptured) {
  enroll("10.0.0.2");
  UniqueFd proxy = register_listener("10.0.0.2", ListenerKind::kOutbound);
  for (uint32_t mark : {SM_MARK_PROXY_UPSTREAM, SM_MARK_PROXY_TO_APP}) {
    auto r = egress(tcp_frame(ep("10.0.0.2:40000"), ep("10.9.0.1:80"), kSyn), mark | 0x1);
    EXPECT_EQ(r.verdict, TC_ACT_OK);
    EXPECT_EQ(r.mark, mark | 0x1) << "marks are left alone";
    EXPECT_EQ(moved(), (Counts{{"proxy_skipped", 1}}));
  }
}

TEST_F(CaptureTest, NonTcpPassesUntouched) {
  enroll("10.0.0.2");
  UniqueFd proxy = register_listener("10.0.0.2", ListenerKind::kOutbound);
  auto udp = tcp_frame(ep("10.0.0.2:40000"), ep("10.9.0.1:53"), 0, 20, IPPROTO_UDP);
  auto r = egress(udp);
  EXPECT_EQ(r.verdict, TC_ACT_OK);
  EXPECT_EQ(r.frame, udp);
  auto in = ingress(udp);
  EXPECT_EQ(in.verdict, TC_ACT_OK);
  auto arp = egress(testing::arp_frame());
  EXPECT_EQ(arp.verdict, TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"passed", 2}, {"unparsed", 1}}));
}

// DNS (SM_WL_CAPTURE_DNS, on by default): each UDP datagram to port 53 is bounced and, at ingress,
// assigned to the pod's dns-udp socket; without that socket, or without the flag, or to another
// port, it passes. Which TCP listener a SYN to :53 lands on, tests/loader/dns_capture_test.cc
// shows.
TEST_F(CaptureTest, DnsOverUdpIsBouncedAndAssignedDatagramByDatagram) {
  auto query = tcp_frame(ep("10.0.0.2:40000"), ep("10.96.0.10:53"), 0, 40, IPPROTO_UDP);
  enroll("10.0.0.2");
  // No dns-udp socket yet: DNS goes out as if sockmesh were not there.
  EXPECT_EQ(egress(query).verdict, TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"passed", 1}}));

  UniqueFd dns(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(dns.get(), reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0) << strerror(errno);
  auto added = listeners_->add(ip("10.0.0.2"), ListenerKind::kDnsUdp, dns.get());
  ASSERT_TRUE(added) << added.error().message;
  for (int i = 0; i < 3; ++i) {
    auto out = egress(query);
    EXPECT_EQ(out.verdict, TC_ACT_REDIRECT);
    EXPECT_TRUE(dest_mac_is_source_mac(out.frame));
    EXPECT_EQ(out.mark & SM_MARK_MASK, SM_MARK_BOUNCED);
    EXPECT_EQ(moved(), (Counts{{"bounced", 1}})) << "no tc_payload: that one is TCP's";
    expect_assign_attempted(ingress(out.frame, out.mark));
  }

  // Another port, the proxy's mark: untouched.
  EXPECT_EQ(
      egress(tcp_frame(ep("10.0.0.2:40000"), ep("10.96.0.10:5353"), 0, 40, IPPROTO_UDP)).verdict,
      TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"passed", 1}}));
  EXPECT_EQ(egress(query, SM_MARK_PROXY).verdict, TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"proxy_skipped", 1}}));

  // A workload whose record lacks SM_WL_CAPTURE_DNS (ambient.istio.io/dns-capture=false).
  maps::WorkloadRecord no_dns;
  no_dns.uid = "uid-10.0.0.2";
  no_dns.capture_dns = false;
  ASSERT_TRUE(workloads_->enroll(ip("10.0.0.2"), no_dns));
  EXPECT_EQ(egress(query).verdict, TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"passed", 1}}));
}

TEST_F(CaptureTest, PodThatIsNotEnrolledIsUntouched) {
  enroll("10.0.0.2");
  UniqueFd proxy = register_listener("10.0.0.3", ListenerKind::kOutbound);
  auto frame = tcp_frame(ep("10.0.0.3:40000"), ep("10.9.0.1:80"), kSyn);
  auto r = egress(frame);
  EXPECT_EQ(r.verdict, TC_ACT_OK);
  EXPECT_EQ(r.frame, frame);
  EXPECT_EQ(r.mark, 0u);
  auto in = ingress(tcp_frame(ep("10.9.0.1:5555"), ep("10.0.0.3:8080"), kSyn));
  EXPECT_EQ(in.verdict, TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"not_enrolled", 2}}));

  // A record without the enrolled flag counts as not enrolled too.
  maps::WorkloadRecord off;
  off.uid = "off";
  off.enrolled = false;
  ASSERT_TRUE(workloads_->enroll(ip("10.0.0.3"), off));
  EXPECT_EQ(egress(frame).verdict, TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"not_enrolled", 1}}));
}

TEST_F(CaptureTest, Ipv6OutboundAndInbound) {
  enroll("fd00::2");
  UniqueFd outbound = register_listener("fd00::2", ListenerKind::kOutbound);
  UniqueFd inbound = register_listener("fd00::2", ListenerKind::kInboundPlain);

  auto out = egress(tcp_frame(ep("[fd00::2]:40000"), ep("[fd00:9::1]:443"), kSyn));
  EXPECT_EQ(out.verdict, TC_ACT_REDIRECT);
  EXPECT_TRUE(dest_mac_is_source_mac(out.frame));
  EXPECT_EQ(out.mark & SM_MARK_MASK, SM_MARK_BOUNCED);
  EXPECT_EQ(moved(), (Counts{{"bounced", 1}}));

  expect_assign_attempted(ingress(out.frame, out.mark));
  expect_assign_attempted(ingress(tcp_frame(ep("[fd00:9::1]:5555"), ep("[fd00::2]:8080"), kSyn)));

  auto hbone = ingress(tcp_frame(ep("[fd00:9::1]:5555"), ep("[fd00::2]:15008"), kSyn));
  EXPECT_EQ(hbone.verdict, TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"passed", 1}}));
}

// An enrolled app's IPv6 socket routes to its proxy with lo's MTU, so TCP sends GSO packets of two
// 64K segments, and the stack puts a Hop-by-Hop jumbo header in front of their TCP header (BIG
// TCP). Before the parser stepped over it, such a packet of a captured flow was let through to the
// wire, where its tail segment reached the real peer and drew a reset (#16's dual-stack flake).
TEST_F(CaptureTest, Ipv6PacketsBehindAHopByHopHeaderAreCapturedLikeTheRest) {
  enroll("::1");
  Connection conn = connect_on_loopback("[::1]");
  ASSERT_FALSE(HasFailure());
  const Endpoint& server_ep = conn.server_ep;
  const Endpoint& client_ep = conn.client_ep;
  moved();

  auto big = testing::with_jumbo_hop_by_hop(tcp_frame(client_ep, server_ep, kAck | kPsh, 300));
  auto known = egress(big);
  EXPECT_EQ(known.verdict, TC_ACT_REDIRECT);
  EXPECT_EQ(known.mark & SM_MARK_MASK, SM_MARK_BOUNCED);
  EXPECT_EQ(moved(), (Counts{{"bounced", 1}, {"tc_payload", 1}}));
  // At ingress the bounced packet is known by the same header chain.
  auto in = ingress(known.frame, known.mark);
  EXPECT_EQ(in.verdict, TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"passed", 1}}));

  // A new connection's SYN behind such a header still goes to the proxy's listener.
  enroll("fd00::2");
  UniqueFd outbound = register_listener("fd00::2", ListenerKind::kOutbound);
  auto syn = testing::with_jumbo_hop_by_hop(
      tcp_frame(ep("[fd00::2]:40000"), ep("[fd00:9::1]:443"), kSyn));
  EXPECT_EQ(egress(syn).verdict, TC_ACT_REDIRECT);
  EXPECT_EQ(moved(), (Counts{{"bounced", 1}}));

  // Destination options, and a routing header with no segments left, are stepped over too.
  auto opts = testing::with_ipv6_extension(tcp_frame(client_ep, server_ep, kAck, 10), 60,
                                           {1, 4, 0, 0, 0, 0});  // PadN
  EXPECT_EQ(egress(opts).verdict, TC_ACT_REDIRECT);
  auto routed = testing::with_ipv6_extension(tcp_frame(client_ep, server_ep, kAck, 10), 43,
                                             {4, 0, 0, 0, 0, 0});  // type 4, 0 segments left
  EXPECT_EQ(egress(routed).verdict, TC_ACT_REDIRECT);
  EXPECT_EQ(moved(), (Counts{{"bounced", 2}, {"tc_payload", 2}}));

  // With segments left, the destination is a waypoint, not the peer: not parsed, let through.
  auto waypoint = testing::with_ipv6_extension(tcp_frame(client_ep, server_ep, kAck, 10), 43,
                                               {4, 1, 0, 0, 0, 0});
  EXPECT_EQ(egress(waypoint).verdict, TC_ACT_OK);
  // More extension headers than the parser steps over: let through, and counted.
  auto deep = tcp_frame(ep("[fd00::2]:40001"), ep("[fd00:9::1]:443"), kAck, 10);
  for (int i = 0; i < 4; ++i) deep = testing::with_ipv6_extension(deep, 60, {1, 4, 0, 0, 0, 0});
  EXPECT_EQ(egress(deep).verdict, TC_ACT_OK);
  EXPECT_EQ(moved(), (Counts{{"unparsed", 2}}));
}

}  // namespace
}  // namespace sockmesh
