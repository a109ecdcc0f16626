// The DNS server against real loopback sockets, with fake upstream resolvers run by the test.
#include "dns/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <future>
#include <thread>

#include "dns/message.h"

namespace sockmesh::dns {
namespace {

using namespace std::chrono_literals;

IpAddress ip(const char* s) { return *IpAddress::parse(s); }

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int release() { return std::exchange(fd, -1); }
};

uint16_t port_of(int fd) {
  sockaddr_in a{};
  socklen_t l = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
  return ntohs(a.sin_port);
}

int bound(int type) {
  int fd = ::socket(AF_INET, type | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  if (type == SOCK_STREAM) ::listen(fd, 128);
  return fd;
}

std::vector<uint8_t> query(std::string_view name, uint16_t type, uint16_t id) {
  std::vector<uint8_t> m{
      static_cast<uint8_t>(id >> 8), static_cast<uint8_t>(id), 1, 0, 0, 1, 0, 0, 0, 0, 0, 0};
  EXPECT_TRUE(append_name(&m, name).ok());
  m.insert(m.end(), {static_cast<uint8_t>(type >> 8), static_cast<uint8_t>(type), 0, 1});
  return m;
}

// A UDP client connected to the server; recv with a deadline.
struct UdpClient {
  Fd fd{::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)};
  explicit UdpClient(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  }
  void send(const std::vector<uint8_t>& m) const { ::send(fd.fd, m.data(), m.size(), 0); }
  std::optional<std::vector<uint8_t>> recv(std::chrono::milliseconds wait = 3000ms) const {
    pollfd p{fd.fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) != 1) return std::nullopt;
    std::vector<uint8_t> b(65536);
    ssize_t n = ::recv(fd.fd, b.data(), b.size(), 0);
    if (n < 0) return std::nullopt;
    b.resize(static_cast<size_t>(n));
    return b;
  }
};

std::optional<std::vector<uint8_t>> tcp_exchange(uint16_t port, const std::vector<uint8_t>& m) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return std::nullopt;
  timeval tv{5, 0};
  ::setsockopt(fd.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::vector<uint8_t> framed{static_cast<uint8_t>(m.size() >> 8), static_cast<uint8_t>(m.size())};
  framed.insert(framed.end(), m.begin(), m.end());
  ::send(fd.fd, framed.data(), framed.size(), MSG_NOSIGNAL);
  auto read_n = [&](size_t n) -> std::optional<std::vector<uint8_t>> {
    std::vector<uint8_t> b(n);
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::recv(fd.fd, b.data() + got, n - got, 0);
      if (r <= 0) return std::nullopt;
      got += static_cast<size_t>(r);
    }
    return b;
  };
  auto len = read_n(2);
  if (!len) return std::nullopt;
  return read_n(static_cast<size_t>(((*len)[0] << 8) | (*len)[1]));
}

// A fake upstream: answers UDP and TCP queries with `reply(query)`, or stays silent when it
// returns nothing.
class FakeUpstream {
 public:
  using Responder = std::function<std::optional<std::vector<uint8_t>>(std::vector<uint8_t>)>;
  explicit FakeUpstream(Responder r) : respond_(std::move(r)) {
    udp_ = bound(SOCK_DGRAM);
    tcp_ = bound(SOCK_STREAM);
    thread_ = std::thread([this] { run(); });
  }
  ~FakeUpstream() {
    stop_ = true;
    thread_.join();
    ::close(udp_);
    ::close(tcp_);
  }
  Endpoint udp() const { return {ip("127.0.0.1"), port_of(udp_)}; }
  Endpoint tcp() const { return {ip("127.0.0.1"), port_of(tcp_)}; }
  std::atomic<int> udp_queries{0}, tcp_queries{0};

 private:
  void run() {
    while (!stop_) {
      pollfd p[2] = {{udp_, POLLIN, 0}, {tcp_, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      if (p[0].revents & POLLIN) {
        std::vector<uint8_t> b(65536);
        sockaddr_storage from{};
        socklen_t fl = sizeof from;
        ssize_t n =
            ::recvfrom(udp_, b.data(), b.size(), 0, reinterpret_cast<sockaddr*>(&from), &fl);
        if (n > 0) {
          ++udp_queries;
          b.resize(static_cast<size_t>(n));
          if (auto r = respond_(b)) {
            ::sendto(udp_, r->data(), r->size(), 0, reinterpret_cast<sockaddr*>(&from), fl);
          }
        }
      }
      if (p[1].revents & POLLIN) {
        Fd c(::accept(tcp_, nullptr, nullptr));
        uint8_t len[2];
        if (::recv(c.fd, len, 2, MSG_WAITALL) != 2) continue;
        std::vector<uint8_t> b((len[0] << 8) | len[1]);
        if (::recv(c.fd, b.data(), b.size(), MSG_WAITALL) != static_cast<ssize_t>(b.size())) {
          continue;
        }
        ++tcp_queries;
        if (auto r = respond_(b)) {
          std::vector<uint8_t> out{static_cast<uint8_t>(r->size() >> 8),
                                   static_cast<uint8_t>(r->size())};
          out.insert(out.end(), r->begin(), r->end());
          ::send(c.fd, out.data(), out.size(), MSG_NOSIGNAL);
        }
      }
    }
  }
  Responder respond_;
  int udp_ = -1, tcp_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A reply with the query's id, an extra marker and, over UDP, the TC bit: the relay must pass it
// byte for byte.
std::optional<std::vector<uint8_t>> marked_reply(std::vector<uint8_t> q) {
  q[2] |= 0x80 | 0x02;  // QR, TC
  q.push_back(0xAB);
  q.push_back(0xCD);
  return q;
}

class DnsServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions o) {
    state::Service echo;
    echo.name = "echo";
    echo.namespace_name = "shop";
    echo.hostname = "echo.shop.svc.cluster.local";
    echo.vips = {{"", ip("10.96.0.20")}, {"", ip("fd00:96::20")}};
    state::Workload client;
    client.uid = "client";
    client.name = "client";
    client.namespace_name = "shop";
    client.canonical_name = "sleep";
    client.ips = {ip("127.0.0.1")};
    snap_ = std::make_shared<const state::Snapshot>(std::vector<state::Workload>{client},
                                                    std::vector<state::Service>{echo},
                                                    std::vector<state::Policy>{});
    server_ = Server::create(
        io_, std::move(o), [this] { return snap_; }, metrics_);
    int u = bound(SOCK_DGRAM);
    int t = bound(SOCK_STREAM);
    udp_port_ = port_of(u);
    tcp_port_ = port_of(t);
    ASSERT_TRUE(server_->serve_udp(u).ok());
    ASSERT_TRUE(server_->serve_tcp(t).ok());
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    if (server_) {
      boost::asio::post(io_, [this] { server_->stop(); });
    }
    work_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }
  ServerStats stats() {
    std::promise<ServerStats> p;
    boost::asio::post(io_, [&] { p.set_value(server_->stats()); });
    return p.get_future().get();
  }
  std::string metrics() { return metrics_.render(); }

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      io_.get_executor()};
  observe::Registry metrics_;
  state::SnapshotPtr snap_;
  std::shared_ptr<Server> server_;
  std::thread thread_;
  uint16_t udp_port_ = 0, tcp_port_ = 0;
};

TEST_F(DnsServerTest, AnswersServiceShortNameLocallyOverUdpAndTcp) {
  start({});
  UdpClient c(udp_port_);
  c.send(query("echo", kTypeA, 0x0101));
  auto r = c.recv();
  ASSERT_TRUE(r.has_value());
  auto h = parse_header(*r);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->id, 0x0101);
  EXPECT_EQ(h->rcode(), Rcode::kNoError);
  ASSERT_EQ(h->ancount, 1);
  EXPECT_EQ(std::vector<uint8_t>(r->end() - 4, r->end()), (std::vector<uint8_t>{10, 96, 0, 20}));

  auto t = tcp_exchange(tcp_port_, query("echo.shop.svc.cluster.local", kTypeAAAA, 0x0202));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(parse_header(*t)->ancount, 1);
  EXPECT_EQ(t->back(), 0x20);
  EXPECT_EQ(stats().answered_locally, 2u);
  EXPECT_NE(metrics().find("istio_dns_requests_total{request_protocol=\"udp\",request_query_type="
                           "\"a\",source_canonical_revision=\"unknown\",source_canonical_service="
                           "\"sleep\"} 1"),
            std::string::npos)
      << metrics();
}

TEST_F(DnsServerTest, ForwardsUnknownNamesAndRelaysTheReplyUnchanged) {
  FakeUpstream up(marked_reply);
  ServerOptions o;
  o.upstreams = {up.udp()};
  start(o);
  UdpClient c(udp_port_);
  auto q = query("www.example.com", kTypeA, 0x0303);
  c.send(q);
  auto r = c.recv();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, *marked_reply(q));  // TC bit and trailing bytes intact
  EXPECT_TRUE(parse_header(*r)->tc());
  EXPECT_EQ(up.udp_queries.load(), 1);
  EXPECT_NE(metrics().find("istio_dns_upstream_requests_total{request_protocol=\"udp\""),
            std::string::npos);
  EXPECT_NE(metrics().find("# TYPE istio_dns_upstream_request_duration_seconds histogram"),
            std::string::npos);
  EXPECT_NE(metrics().find("istio_dns_upstream_request_duration_seconds_count{request_protocol="
                           "\"udp\",request_query_type=\"a\""),
            std::string::npos)
      << metrics();
}

TEST_F(DnsServerTest, TcpQueriesAreForwardedOverTcp) {
  FakeUpstream up(marked_reply);
  ServerOptions o;
  o.upstreams = {up.tcp()};
  start(o);
  auto q = query("big.example.com", kTypeA, 0x0404);
  auto r = tcp_exchange(tcp_port_, q);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, *marked_reply(q));
  EXPECT_EQ(up.tcp_queries.load(), 1);
  EXPECT_EQ(up.udp_queries.load(), 0);
}

TEST_F(DnsServerTest, SilentUpstreamGivesServfailAfterTheTimeout) {
  FakeUpstream up([](std::vector<uint8_t>) { return std::nullopt; });
  ServerOptions o;
  o.upstreams = {up.udp()};
  o.upstream_timeout = 300ms;
  start(o);
  UdpClient c(udp_port_);
  const auto t0 = std::chrono::steady_clock::now();
  c.send(query("slow.example.com", kTypeA, 0x0505));
  auto r = c.recv(3000ms);
  ASSERT_TRUE(r.has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 250ms);
  auto h = parse_header(*r);
  EXPECT_EQ(h->id, 0x0505);
  EXPECT_EQ(h->rcode(), Rcode::kServFail);
  EXPECT_EQ(h->qdcount, 1);
  EXPECT_EQ(stats().upstream_failures, 1u);
  EXPECT_NE(metrics().find("istio_dns_upstream_failures_total{"), std::string::npos);
}

TEST_F(DnsServerTest, GarbageGetsFormerrOrIsDroppedAndServingContinues) {
  start({});
  UdpClient c(udp_port_);
  c.send({1, 2, 3});  // shorter than a header: dropped
  std::vector<uint8_t> two_questions = query("echo", kTypeA, 0x0606);
  two_questions[5] = 2;
  c.send(two_questions);
  auto r = c.recv();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(parse_header(*r)->id, 0x0606);
  EXPECT_EQ(parse_header(*r)->rcode(), Rcode::kFormErr);
  std::vector<uint8_t> loop{0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xC0, 12, 0, 1, 0, 1};
  c.send(loop);
  r = c.recv();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(parse_header(*r)->rcode(), Rcode::kFormErr);
  c.send(query("echo", kTypeA, 0x0607));
  r = c.recv();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(parse_header(*r)->id, 0x0607);
  EXPECT_EQ(parse_header(*r)->ancount, 1);
  EXPECT_EQ(stats().malformed, 3u);
}

TEST_F(DnsServerTest, BurstIsBoundedPerClientAndLeavesItAnswering) {
  FakeUpstream up([](std::vector<uint8_t>) { return std::nullopt; });
  ServerOptions o;
  o.upstreams = {up.udp()};
  o.upstream_timeout = 500ms;
  o.max_inflight_per_client = 100;
  start(o);
  UdpClient c(udp_port_);
  int rcvbuf = 4 << 20;
  ::setsockopt(c.fd.fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10000; ++i) {
    c.send(query("flood" + std::to_string(i) + ".example.com", kTypeA, static_cast<uint16_t>(i)));
    if (i % 500 == 499) std::this_thread::sleep_for(1ms);  // let the kernel buffer drain
  }
  // The flood leaves the server answering local names. The kernel may have dropped datagrams of
  // the flood (and this query) when the socket's buffer was full, so ask again a few times.
  bool answered = false;
  for (int attempt = 0; attempt < 20 && !answered; ++attempt) {
    c.send(query("echo", kTypeA, 0xFFFF));
    const auto sent = std::chrono::steady_clock::now();
    while (!answered && std::chrono::steady_clock::now() - sent < 500ms) {
      auto r = c.recv(100ms);
      answered = r && parse_header(*r)->id == 0xFFFF;
    }
  }
  EXPECT_TRUE(answered);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  auto s = stats();
  EXPECT_GT(s.dropped_client_limit, 0u);
  EXPECT_LE(s.forwarded + s.dropped_client_limit, 10000u);
  // At most 100 in flight at any time: forwarding is bounded by the 0.5 s window it took.
  EXPECT_GE(s.forwarded, 100u);
  EXPECT_NE(metrics().find("sockmesh_dns_dropped_total{reason=\"client_limit\"}"),
            std::string::npos);
}

TEST(DnsUpstreams, ParseAndResolvConf) {
  std::string err;
  auto u = parse_upstreams("10.0.0.10,127.0.0.1:5353,[fd00::a]:53,fd00::b", &err);
  ASSERT_TRUE(u.has_value()) << err;
  ASSERT_EQ(u->size(), 4u);
  EXPECT_EQ((*u)[0].port, 53);
  EXPECT_EQ((*u)[1].port, 5353);
  EXPECT_EQ((*u)[3].to_string(), "[fd00::b]:53");
  EXPECT_FALSE(parse_upstreams("nonsense", &err).has_value());
  EXPECT_NE(err.find("nonsense"), std::string::npos);
  char path[] = "/tmp/sm-dns-resolv-XXXXXX";
  int fd = ::mkstemp(path);
  std::string text = "search a.svc\nnameserver 10.96.0.10\nnameserver fe80::1%eth0\noptions x\n";
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  auto ns = nameservers_from_resolv_conf(path);
  ::unlink(path);
  ASSERT_EQ(ns.size(), 2u);
  EXPECT_EQ(ns[0].to_string(), "10.96.0.10:53");
}

}  // namespace
}  // namespace sockmesh::dns
