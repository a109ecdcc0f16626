// net::SpliceRelay on loopback TCP pairs: an app client <-> relay a | relay b <-> an app server.
// The apps are plain blocking sockets; the relay runs on its own io_context thread.
#include "net/splice_relay.h"

#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "loopback.h"

namespace sockmesh::net {
namespace {

using testing::pattern;
using testing::read_to_end;
using testing::tcp_pair;
using testing::write_all;

using Clock = testing::Clock;
constexpr size_t kMiB = size_t{1024} * 1024;

int open_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

class SpliceRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    { SpliceRelay::Tcp::socket warm_up(io_, SpliceRelay::Tcp::v4()); }  // the reactor's own fds
    fds_before_ = open_fds();
    thread_ = std::thread([this] { io_.run(); });
    auto [client, relay_a] = tcp_pair();
    auto [relay_b, server] = tcp_pair();
    client_ = client;
    server_ = server;
    std::promise<void> started;
    boost::asio::post(io_, [&, relay_a, relay_b] {
      relay_ = std::make_shared<SpliceRelay>(
          SpliceRelay::Tcp::socket(io_, SpliceRelay::Tcp::v4(), relay_a),
          SpliceRelay::Tcp::socket(io_, SpliceRelay::Tcp::v4(), relay_b), 64 * 1024);
      relay_->start([this](const SpliceRelay::Result& r) { result_.set_value(r); },
                    [this](bool a_to_b, size_t n) { (a_to_b ? progress_ab_ : progress_ba_) += n; });
      started.set_value();
    });
    started.get_future().wait();
  }

  void TearDown() override {
    if (client_ >= 0) close(client_);
    if (server_ >= 0) close(server_);
    boost::asio::post(io_, [this] { relay_.reset(); });
    guard_.reset();
    thread_.join();
    EXPECT_EQ(open_fds(), fds_before_) << "the relay leaked descriptors (sockets or pipes)";
  }

  SpliceRelay::Result wait_result() {
    auto f = result_.get_future();
    EXPECT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    return f.get();
  }

  void expect_reset(int fd) {
    int err = 0;
    read_to_end(fd, &err, 5000);
    EXPECT_EQ(err, ECONNRESET) << "expected RST, got " << (err ? std::strerror(err) : "FIN");
  }

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_{
      io_.get_executor()};
  std::thread thread_;
  std::shared_ptr<SpliceRelay> relay_;
  std::promise<SpliceRelay::Result> result_;
  std::atomic<uint64_t> progress_ab_{0}, progress_ba_{0};
  int client_ = -1, server_ = -1;
  int fds_before_ = 0;
};

void exchange(int client, int server, size_t size) {
  auto up = pattern(size, 1), down = pattern(size, 2);
  std::vector<uint8_t> got_up, got_down;
  int err_up = -1, err_down = -1;
  std::thread reader_server([&] { got_up = read_to_end(server, &err_up); });
  std::thread reader_client([&] { got_down = read_to_end(client, &err_down); });
  std::thread writer_server([&] {
    EXPECT_TRUE(write_all(server, down.data(), down.size()));
    shutdown(server, SHUT_WR);
  });
  EXPECT_TRUE(write_all(client, up.data(), up.size()));
  shutdown(client, SHUT_WR);
  writer_server.join();
  reader_server.join();
  reader_client.join();
  EXPECT_EQ(err_up, 0);
  EXPECT_EQ(err_down, 0);
  EXPECT_TRUE(got_up == up) << "client->server: " << got_up.size() << " of " << up.size();
  EXPECT_TRUE(got_down == down) << "server->client: " << got_down.size() << " of " << down.size();
}

TEST_F(SpliceRelayTest, OneByteBothWays) {
  exchange(client_, server_, 1);
  auto r = wait_result();
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.bytes_a_to_b, 1u);
  EXPECT_EQ(r.bytes_b_to_a, 1u);
  EXPECT_FALSE(relay_->fell_back());
}

TEST_F(SpliceRelayTest, SixtyFourMiBIntactBothWaysAndCounted) {
  exchange(client_, server_, 64 * kMiB);
  auto r = wait_result();
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.bytes_a_to_b, 64 * kMiB);
  EXPECT_EQ(r.bytes_b_to_a, 64 * kMiB);
  EXPECT_EQ(progress_ab_.load(), 64 * kMiB);
  EXPECT_EQ(progress_ba_.load(), 64 * kMiB);
}

// FIN from one side reaches the other while the other direction keeps flowing.
void half_close(int closer, int other) {
  shutdown(closer, SHUT_WR);
  pollfd p{other, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  char c;
  ASSERT_EQ(recv(other, &c, 1, 0), 0) << "the FIN did not pass";
  auto late = pattern(300000, 3);
  std::thread w([&] {
    EXPECT_TRUE(write_all(other, late.data(), late.size()));
    shutdown(other, SHUT_WR);
  });
  int err = -1;
  auto got = read_to_end(closer, &err);
  w.join();
  EXPECT_EQ(err, 0);
  EXPECT_TRUE(got == late) << got.size();
}

TEST_F(SpliceRelayTest, HalfCloseFromClient) {
  half_close(client_, server_);
  EXPECT_EQ(wait_result().error, "");
}

TEST_F(SpliceRelayTest, HalfCloseFromServer) {
  half_close(server_, client_);
  EXPECT_EQ(wait_result().error, "");
}

void reset(int& fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close(fd);
  fd = -1;
}

TEST_F(SpliceRelayTest, ResetFromClientResetsServer) {
  ASSERT_TRUE(write_all(client_, reinterpret_cast<const uint8_t*>("x"), 1));
  char c;
  ASSERT_EQ(recv(server_, &c, 1, 0), 1);
  reset(client_);
  expect_reset(server_);
  EXPECT_NE(wait_result().error, "");
}

TEST_F(SpliceRelayTest, ResetFromServerResetsClient) {
  reset(server_);
  expect_reset(client_);
  EXPECT_NE(wait_result().error, "");
}

TEST_F(SpliceRelayTest, AbortResetsBoth) {
  boost::asio::post(io_, [this] { relay_->abort("policy revoked"); });
  EXPECT_EQ(wait_result().error, "policy revoked");
  expect_reset(client_);
  expect_reset(server_);
}

// A server that does not read: the client's writes stop within the socket buffers and the bounded
// pipe (not the whole offer), and once the server reads, all of it arrives in order.
TEST_F(SpliceRelayTest, SlowReaderPushesBack) {
  constexpr size_t kOffer = 64 * kMiB;
  constexpr size_t kBound = 12 * kMiB;
  auto data = pattern(kOffer, 4);
  size_t sent = 0;
  auto deadline = Clock::now() + std::chrono::milliseconds(1500);
  while (sent < kOffer && Clock::now() < deadline) {
    ssize_t n = send(client_, data.data() + sent, std::min(kOffer - sent, size_t{65536}),
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{client_, POLLOUT, 0};
      poll(&p, 1, 10);
    } else {
      FAIL() << "send: " << std::strerror(errno);
    }
  }
  std::cout << "[ measured ] stalled after " << sent / 1024 << " KiB\n";
  EXPECT_LT(sent, kBound) << "no backpressure: the writer was not stopped";
  std::thread w([&] {
    EXPECT_TRUE(write_all(client_, data.data() + sent, kOffer - sent));
    shutdown(client_, SHUT_WR);
  });
  int err = -1;
  auto got = read_to_end(server_, &err);
  w.join();
  EXPECT_EQ(err, 0);
  EXPECT_TRUE(got == data) << got.size();
  shutdown(server_, SHUT_WR);
  EXPECT_EQ(wait_result().error, "");
}

}  // namespace
}  // namespace sockmesh::net
