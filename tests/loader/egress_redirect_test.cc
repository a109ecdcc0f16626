// Issue 16, stage 2 of the same-node fast path, by experiment on the real kernel before anything is
// built on it: once the proxy holds both sockets of a same-node connection (the accepted one from
// the client app, B, and the upstream one into the server app, C), can sk_msg move the apps' sends
// straight to the egress of the other proxy socket (bpf_msg_redirect_hash, flags 0)? Four real
// sockets on loopback in a netns of the test's own, and bpf/egress_probe.bpf.c (its own maps):
//
//   client app A  <-TCP->  B proxy (accepted)        C proxy (upstream)  <-TCP->  D server app
//   A's sends --sk_msg--> egress of C (so they reach D through TCP); D's sends --> egress of B.
//
// What each test shows is a fact for the design (docs/ARCHITECTURE.md, "The same-node fast path
// in the kernel: what was measured, not built"); none of it is used by the proxy yet.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>
#include <vector>

#include "egress_probe.skel.h"
#include "testing/privileged.h"
#include "testing/sockets.h"
#include "testing/system.h"

namespace sockmesh {
namespace {

using Clock = std::chrono::steady_clock;
using testing::UniqueFd;

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new testing::PrivilegedEnvironment);

constexpr size_t kMiB = size_t{1024} * 1024;
constexpr int kTimeoutMs = 10000;

double mib(size_t bytes) { return static_cast<double>(bytes) / static_cast<double>(kMiB); }

void set_send_timeout(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000L};
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0) << strerror(errno);
}

// Reads until EOF or an error within `timeout_ms`: the bytes, and how it ended (0: EOF, else
// errno; ETIMEDOUT when neither came).
std::vector<uint8_t> read_to_end(int fd, int timeout_ms, int* ended) {
  std::vector<uint8_t> out;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  uint8_t buf[65536];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left.count()))) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      out.insert(out.end(), buf, buf + n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;  // a psock's wake-up without data
    *ended = n == 0 ? 0 : errno;
    return out;
  }
  *ended = ETIMEDOUT;
  return out;
}

// Whether `fd` has nothing to read right now (a socket in a sockmap may poll readable without
// data: recv decides).
bool nothing_to_read(int fd) {
  uint8_t byte;
  ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
  return n < 0 && errno == EAGAIN;
}

void close_with_reset(UniqueFd& fd) {
  linger l{1, 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
  fd.reset();
}

class EgressRedirect : public ::testing::Test {
 protected:
  void SetUp() override {
    ns_.emplace(testing::unique_name("smer"));
    auto lo = *IpAddress::parse("127.0.0.1");
    auto proxy_listener = testing::listen_in(ns_->path(), Endpoint{lo, 15001});
    auto app_listener = testing::listen_in(ns_->path(), Endpoint{lo, 8080});
    ASSERT_TRUE(proxy_listener.valid() && app_listener.valid());
    a_ = testing::connect_in(ns_->path(), Endpoint{lo, 15001});
    b_ = testing::accept_within(proxy_listener.get(), kTimeoutMs);
    c_ = testing::connect_in(ns_->path(), Endpoint{lo, 8080});
    d_ = testing::accept_within(app_listener.get(), kTimeoutMs);
    ASSERT_TRUE(a_.valid() && b_.valid() && c_.valid() && d_.valid());
    skel_ = egress_probe_bpf__open_and_load();
    ASSERT_NE(skel_, nullptr) << "loading egress_probe: " << strerror(errno);
    ASSERT_EQ(bpf_prog_attach(bpf_program__fd(skel_->progs.ep_redirect),
                              bpf_map__fd(skel_->maps.ep_sources), BPF_SK_MSG_VERDICT, 0),
              0)
        << strerror(errno);
  }

  void TearDown() override {
    if (skel_ != nullptr) egress_probe_bpf__destroy(skel_);
  }

  static uint32_t local_port(int fd) { return testing::local_of(fd).port; }

  // Joins the pairs: A's sends to C's egress, D's sends to B's egress. Targets first, so that no
  // send of a source finds its target missing.
  void join() {
    int targets = bpf_map__fd(skel_->maps.ep_targets);
    int sources = bpf_map__fd(skel_->maps.ep_sources);
    uint32_t a_port = local_port(a_.get()), d_port = local_port(d_.get());
    uint64_t c = static_cast<uint64_t>(c_.get()), b = static_cast<uint64_t>(b_.get());
    ASSERT_EQ(bpf_map_update_elem(targets, &a_port, &c, BPF_ANY), 0) << strerror(errno);
    ASSERT_EQ(bpf_map_update_elem(targets, &d_port, &b, BPF_ANY), 0) << strerror(errno);
    uint32_t i0 = 0, i1 = 1;
    uint64_t a = static_cast<uint64_t>(a_.get()), d = static_cast<uint64_t>(d_.get());
    ASSERT_EQ(bpf_map_update_elem(sources, &i0, &a, BPF_ANY), 0) << strerror(errno);
    ASSERT_EQ(bpf_map_update_elem(sources, &i1, &d, BPF_ANY), 0) << strerror(errno);
  }

  uint64_t count(uint32_t index) const {
    uint64_t v = 0;
    bpf_map_lookup_elem(bpf_map__fd(skel_->maps.ep_counts), &index, &v);
    return v;
  }

  std::optional<testing::ScopedNetns> ns_;
  UniqueFd a_, b_, c_, d_;
  egress_probe_bpf* skel_ = nullptr;
};

TEST_F(EgressRedirect, JoinedSocketsCarryBothDirectionsIntactPastTheProxy) {
  join();
  auto up = testing::pattern(8 * kMiB, 1), down = testing::pattern(8 * kMiB, 2);
  std::thread a_sends([&] { EXPECT_TRUE(testing::send_all(a_.get(), up.data(), up.size())); });
  std::thread d_sends([&] { EXPECT_TRUE(testing::send_all(d_.get(), down.data(), down.size())); });
  std::vector<uint8_t> at_d(up.size()), at_a(down.size());
  EXPECT_TRUE(testing::recv_exact(d_.get(), at_d.data(), at_d.size(), kTimeoutMs));
  EXPECT_TRUE(testing::recv_exact(a_.get(), at_a.data(), at_a.size(), kTimeoutMs));
  a_sends.join();
  d_sends.join();
  EXPECT_TRUE(at_d == up) << "A -> D through C's egress";
  EXPECT_TRUE(at_a == down) << "D -> A through B's egress";
  // The proxy's sockets never saw a byte: the kernel moved everything.
  EXPECT_TRUE(nothing_to_read(b_.get()));
  EXPECT_TRUE(nothing_to_read(c_.get()));
  EXPECT_EQ(count(1), up.size() + down.size()) << "the per-flow byte counter the proxy would read";
  EXPECT_EQ(count(2), 0u) << "no send missed its target";
}

// Backpressure: a blocking sender waits for room in the *target's* send buffer, for as long as the
// target socket's SO_SNDTIMEO (here none): the proxy's socket's timeout, not the app's, applies.
TEST_F(EgressRedirect, ABlockingSenderWaitsForTheTargetsSendBuffer) {
  join();
  set_send_timeout(c_.get(), 0);
  set_send_timeout(a_.get(), 0);
  auto stream = testing::pattern(64 * kMiB, 3);
  std::atomic<size_t> sent{0};
  std::atomic<bool> done{false};
  std::thread sender([&] {
    size_t off = 0;
    while (off < stream.size()) {
      ssize_t n = send(a_.get(), stream.data() + off,
                       std::min(stream.size() - off, size_t{256} * 1024), MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
      sent = off;
    }
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  size_t stalled_at = sent.load();
  std::cout << "  blocking sender, server not reading: " << mib(stalled_at)
            << " MiB accepted in 1.5 s, sender still blocked: " << !done.load() << "\n";
  EXPECT_FALSE(done.load()) << "the sender was not stopped by the target's full buffers";
  EXPECT_LT(stalled_at, 16 * kMiB) << "nothing bounded the sender";
  std::vector<uint8_t> got(stream.size());
  EXPECT_TRUE(testing::recv_exact(d_.get(), got.data(), got.size(), 20000));
  sender.join();
  EXPECT_EQ(sent.load(), stream.size());
  EXPECT_TRUE(got == stream) << "a stream that waited for the target arrives whole and in order";
}

// The wait of a blocking sender is bounded by the target's SO_SNDTIMEO: when the proxy's socket has
// one, the app's blocking send() returns early (a short count, or EAGAIN) although the app set no
// timeout, which an app without the mesh would never see. What it was told went in arrives.
TEST_F(EgressRedirect, TheTargetsSendTimeoutEndsABlockingSendersWait) {
  join();
  set_send_timeout(c_.get(), 300);
  set_send_timeout(a_.get(), 0);
  auto stream = testing::pattern(32 * kMiB, 9);
  size_t off = 0;
  int early = 0, eagain = 0;
  auto deadline = Clock::now() + std::chrono::milliseconds(3000);
  while (off < stream.size() && early + eagain < 3 && Clock::now() < deadline) {
    size_t want = std::min(stream.size() - off, size_t{1} * kMiB);
    ssize_t n = send(a_.get(), stream.data() + off, want, MSG_NOSIGNAL);
    if (n < 0) {
      ASSERT_EQ(errno, EAGAIN) << strerror(errno);
      ++eagain;
      continue;
    }
    if (static_cast<size_t>(n) < want) ++early;
    off += static_cast<size_t>(n);
  }
  std::cout << "  blocking sender, target SO_SNDTIMEO 300 ms, server not reading: " << mib(off)
            << " MiB accepted, " << early << " short returns, " << eagain << " EAGAIN\n";
  EXPECT_GT(early + eagain, 0) << "the blocking send never returned early";
  ASSERT_EQ(shutdown(a_.get(), SHUT_WR), 0);
  ASSERT_EQ(shutdown(c_.get(), SHUT_WR), 0);
  int d_end = -1;
  auto at_d = read_to_end(d_.get(), 20000, &d_end);
  EXPECT_EQ(d_end, 0) << strerror(d_end);
  ASSERT_EQ(at_d.size(), off) << "accepted " << off << " bytes, the server got " << at_d.size();
  EXPECT_TRUE(std::equal(at_d.begin(), at_d.end(), stream.begin())) << "reordered or corrupted";
}

// A non-blocking sender gets EAGAIN once the target's buffer is full, and what it was told went
// in is exactly what arrives: no byte is lost at EAGAIN, none is duplicated.
TEST_F(EgressRedirect, ANonBlockingSenderGetsEagainAndLosesNothing) {
  join();
  auto stream = testing::pattern(64 * kMiB, 4);
  size_t off = 0;
  int eagain = 0, shorts = 0;
  auto deadline = Clock::now() + std::chrono::milliseconds(1500);
  while (off < stream.size() && eagain < 100 && Clock::now() < deadline) {
    size_t want = std::min(stream.size() - off, size_t{256} * 1024);
    ssize_t n = send(a_.get(), stream.data() + off, want, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      ASSERT_EQ(errno, EAGAIN) << strerror(errno);
      ++eagain;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    if (static_cast<size_t>(n) < want) ++shorts;
    off += static_cast<size_t>(n);
  }
  std::cout << "  non-blocking sender, server not reading: " << mib(off) << " MiB accepted, "
            << eagain << " EAGAIN, " << shorts << " short writes\n";
  EXPECT_GT(eagain, 0) << "the sender never met the target's bound";
  // The client half-closes; its FIN goes to the proxy socket B (the redirect carries data only),
  // and the proxy passes it on by half-closing C, as its relay does.
  ASSERT_EQ(shutdown(a_.get(), SHUT_WR), 0);
  int b_end = -1;
  auto at_b = read_to_end(b_.get(), kTimeoutMs, &b_end);
  EXPECT_EQ(b_end, 0) << "B saw no FIN: " << strerror(b_end);
  EXPECT_TRUE(at_b.empty()) << at_b.size() << " bytes reached the proxy socket";
  ASSERT_EQ(shutdown(c_.get(), SHUT_WR), 0);
  int d_end = -1;
  auto at_d = read_to_end(d_.get(), 20000, &d_end);
  EXPECT_EQ(d_end, 0) << strerror(d_end);
  ASSERT_EQ(at_d.size(), off) << "accepted " << off << " bytes, the server got " << at_d.size();
  EXPECT_TRUE(std::equal(at_d.begin(), at_d.end(), stream.begin())) << "reordered or corrupted";
}

// Ordering at the switch: bytes the client sent before the join wait in B's receive queue; bytes
// sent after it go straight to C. Unless the switch waits until the proxy has forwarded what B
// holds, later bytes overtake earlier ones. This is why the join needs a gate.
TEST_F(EgressRedirect, BytesQueuedInTheProxySocketBeforeTheJoinAreOvertakenWithoutAGate) {
  auto early = testing::pattern(64 * 1024, 5), late = testing::pattern(64 * 1024, 6);
  ASSERT_TRUE(testing::send_all(a_.get(), early.data(), early.size()));
  pollfd p{b_.get(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, kTimeoutMs), 1) << "the early bytes never reached B";
  join();
  ASSERT_TRUE(testing::send_all(a_.get(), late.data(), late.size()));
  // The proxy forwards what B holds only now.
  std::vector<uint8_t> held(early.size());
  ASSERT_TRUE(testing::recv_exact(b_.get(), held.data(), held.size(), kTimeoutMs));
  ASSERT_TRUE(testing::send_all(c_.get(), held.data(), held.size()));
  std::vector<uint8_t> first(late.size()), second(early.size());
  ASSERT_TRUE(testing::recv_exact(d_.get(), first.data(), first.size(), kTimeoutMs));
  ASSERT_TRUE(testing::recv_exact(d_.get(), second.data(), second.size(), kTimeoutMs));
  EXPECT_TRUE(first == late && second == early)
      << "expected the kernel to deliver the post-join bytes first (the reordering a gate must "
         "prevent); the order was kept this time";
}

// The gate (ep_gated): the sender's bytes go into B's ingress while the proxy forwards them to C
// and publishes its count; once the join is armed, the program switches to C's egress at the first
// send that finds every byte of B's ingress forwarded. A stream sent across the switch arrives
// whole and in order. `pause_us` paces the sender (0: as fast as it can).
struct GateRun {
  bool intact = false;
  uint32_t switched = 0;
  uint64_t ingressed = 0, forwarded = 0, joined = 0, misses = 0;
};

class GatedJoin : public EgressRedirect {
 protected:
  GateRun run(int pause_us, uint32_t arm = 1) {
    GateRun out;
    int gated = bpf_map__fd(skel_->maps.ep_gated_sources);
    EXPECT_EQ(bpf_prog_attach(bpf_program__fd(skel_->progs.ep_gated), gated, BPF_SK_MSG_VERDICT, 0),
              0)
        << strerror(errno);
    uint32_t a_port = local_port(a_.get()), i0 = 0;
    uint64_t a = static_cast<uint64_t>(a_.get()), b = static_cast<uint64_t>(b_.get()),
             c = static_cast<uint64_t>(c_.get());
    EXPECT_EQ(bpf_map_update_elem(bpf_map__fd(skel_->maps.ep_ingress), &a_port, &b, BPF_ANY), 0);
    EXPECT_EQ(bpf_map_update_elem(bpf_map__fd(skel_->maps.ep_targets), &a_port, &c, BPF_ANY), 0);
    EXPECT_EQ(bpf_map_update_elem(gated, &i0, &a, BPF_ANY), 0);
    auto* g = skel_->bss;
    auto stream = testing::pattern(32 * kMiB, 10);
    constexpr size_t kChunk = 64 * 1024;
    std::thread sender([&] {
      for (size_t off = 0; off < stream.size(); off += kChunk) {
        if (!testing::send_all(a_.get(), stream.data() + off, kChunk)) break;
        // The proxy arms the join mid-stream (from the sender's thread, so that it is mid-stream
        // whatever the sender's speed).
        if (off + kChunk == 4 * kMiB) __atomic_store_n(&g->ep_armed, arm, __ATOMIC_SEQ_CST);
        if (pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      }
    });
    std::atomic<bool> stop{false};
    std::thread forwarder([&] {
      std::vector<uint8_t> buf(256 * 1024);
      uint64_t forwarded = 0;
      auto deadline = Clock::now() + std::chrono::seconds(30);
      while (!stop && Clock::now() < deadline) {
        pollfd p{b_.get(), POLLIN, 0};
        poll(&p, 1, 20);
        ssize_t n = recv(b_.get(), buf.data(), buf.size(), MSG_DONTWAIT);
        if (n == 0) break;
        if (n < 0) continue;  // EAGAIN: a psock's wake-up without data
        if (!testing::send_all(c_.get(), buf.data(), static_cast<size_t>(n))) break;
        forwarded += static_cast<uint64_t>(n);
        __atomic_store_n(&g->ep_forwarded, forwarded, __ATOMIC_SEQ_CST);  // after the write
      }
    });
    std::vector<uint8_t> got(stream.size());
    bool received = testing::recv_exact(d_.get(), got.data(), got.size(), 30000);
    sender.join();
    stop = true;
    forwarder.join();
    out.intact = received && got == stream;
    out.switched = __atomic_load_n(&g->ep_switched, __ATOMIC_SEQ_CST);
    out.ingressed = __atomic_load_n(&g->ep_ingressed, __ATOMIC_SEQ_CST);
    out.forwarded = __atomic_load_n(&g->ep_forwarded, __ATOMIC_SEQ_CST);
    out.joined = __atomic_load_n(&g->ep_joined, __ATOMIC_SEQ_CST);
    out.misses = __atomic_load_n(&g->ep_egress_misses, __ATOMIC_SEQ_CST);
    std::cout << "  gated join (arm " << arm << "), sender pause " << pause_us
              << " us per 64 KiB: switched " << out.switched << " after " << mib(out.ingressed)
              << " MiB through the proxy, " << mib(out.joined)
              << " MiB joined in the kernel, intact " << out.intact << "\n";
    return out;
  }
};

TEST_F(GatedJoin, AStreamSentAcrossThePacedSwitchArrivesWholeAndInOrder) {
  auto r = run(1000);
  EXPECT_TRUE(r.intact);
  EXPECT_EQ(r.switched, 1u) << "the forwarder never caught up with a paced sender";
  EXPECT_EQ(r.forwarded, r.ingressed) << "bytes left behind in the proxy socket";
  EXPECT_EQ(r.ingressed + r.joined, 32 * kMiB);
  EXPECT_EQ(r.misses, 0u);
}

// A sender that never pauses may keep the proxy socket's ingress queue non-empty: the switch then
// comes late or never, but whatever happens the stream stays whole and in order.
TEST_F(GatedJoin, AStreamFromAnUnpacedSenderStaysInOrderWhetherOrNotItSwitches) {
  auto r = run(0);
  EXPECT_TRUE(r.intact);
  EXPECT_EQ(r.forwarded, r.ingressed);
  EXPECT_EQ(r.ingressed + r.joined, 32 * kMiB);
}

// Armed to drain through the stack (ep_armed 2): from the arming on, the sender's bytes take TCP
// into B (behind what B's ingress queue holds, which a read empties first), so that B's window
// stops the sender. The stream stays whole and in order, but that does not bring the switch to a
// sender that never pauses: the program counts bytes when they are sent, including those still in
// the sender's own TCP queue, so "all forwarded" holds only once the sender has stopped sending
// and everything arrived, which for such a sender is after its last byte (no switch was seen).
TEST_F(GatedJoin, DrainingThroughTheStackKeepsAnUnpacedStreamInOrder) {
  auto r = run(0, 2);
  EXPECT_TRUE(r.intact);
  EXPECT_EQ(r.forwarded, r.ingressed);
  EXPECT_EQ(r.ingressed + r.joined, 32 * kMiB);
}

// FIN and RST are not redirected: each reaches the proxy socket of its own pair, and the other pair
// hears of it only when the proxy passes it on (a half-close, or a reset of its own).
TEST_F(EgressRedirect, AFinStopsAtTheProxySocketUntilTheProxyHalfClosesTheOtherSide) {
  join();
  auto data = testing::pattern(kMiB, 7);
  ASSERT_TRUE(testing::send_all(d_.get(), data.data(), data.size()));
  ASSERT_EQ(shutdown(d_.get(), SHUT_WR), 0);
  int c_end = -1;
  auto at_c = read_to_end(c_.get(), kTimeoutMs, &c_end);
  EXPECT_EQ(c_end, 0) << "C saw no FIN from the server";
  EXPECT_TRUE(at_c.empty());
  std::vector<uint8_t> at_a(data.size());
  ASSERT_TRUE(testing::recv_exact(a_.get(), at_a.data(), at_a.size(), kTimeoutMs));
  EXPECT_TRUE(at_a == data);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(nothing_to_read(a_.get())) << "the server's FIN reached the client by itself";
  ASSERT_EQ(shutdown(b_.get(), SHUT_WR), 0);  // the proxy passes the half-close on
  int a_end = -1;
  read_to_end(a_.get(), kTimeoutMs, &a_end);
  EXPECT_EQ(a_end, 0) << "the client saw no FIN after the proxy's half-close";

  // The client, half-closed towards, still sends: redirected to the server as before.
  ASSERT_TRUE(testing::send_all(a_.get(), data.data(), 4096));
  std::vector<uint8_t> at_d(4096);
  ASSERT_TRUE(testing::recv_exact(d_.get(), at_d.data(), at_d.size(), kTimeoutMs));
}

TEST_F(EgressRedirect, AResetStopsAtTheProxySocketUntilTheProxyResetsTheOtherSide) {
  join();
  auto data = testing::pattern(4096, 8);
  ASSERT_TRUE(testing::send_all(d_.get(), data.data(), data.size()));
  std::vector<uint8_t> at_a(data.size());
  ASSERT_TRUE(testing::recv_exact(a_.get(), at_a.data(), at_a.size(), kTimeoutMs));
  // The server resets: C hears it, the client does not until the proxy resets B.
  close_with_reset(d_);
  int c_reset = -1;
  read_to_end(c_.get(), kTimeoutMs, &c_reset);
  EXPECT_EQ(c_reset, ECONNRESET) << strerror(c_reset);
  EXPECT_TRUE(nothing_to_read(a_.get()));
  close_with_reset(b_);
  int a_reset = -1;
  read_to_end(a_.get(), kTimeoutMs, &a_reset);
  EXPECT_EQ(a_reset, ECONNRESET) << strerror(a_reset);
}

}  // namespace
}  // namespace sockmesh
