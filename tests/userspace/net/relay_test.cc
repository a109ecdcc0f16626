// net::TcpRelay on loopback TCP pairs: an app client <-> relay a | relay b <-> an app server. The
// apps are plain blocking sockets; the relay runs on its own io_context thread.
#include "net/relay.h"

#include <dirent.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "loopback.h"

namespace sockmesh::net {
namespace {

using testing::Clock;
using testing::pattern;
using testing::tcp_pair;
using testing::write_all;

// The events of `fd`'s registration in this process's epoll instances (/proc/self/fdinfo of each
// eventpoll descriptor), or nothing while it has none.
std::optional<uint32_t> epoll_events(int fd) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  std::optional<uint32_t> found;
  while (dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    char target[64] = {};
    ssize_t n = readlink(("/proc/self/fd/" + name).c_str(), target, sizeof target - 1);
    if (n <= 0 || std::string(target, static_cast<size_t>(n)) != "anon_inode:[eventpoll]") continue;
    std::ifstream info("/proc/self/fdinfo/" + name);
    std::string line;
    while (std::getline(info, line)) {
      std::istringstream words(line);
      std::string key, events_key;
      int tfd = -1;
      std::string events;
      if (!(words >> key >> tfd >> events_key >> events) || key != "tfd:" || tfd != fd) continue;
      found = static_cast<uint32_t>(std::stoul(events, nullptr, 16));
    }
  }
  closedir(dir);
  return found;
}

// After a write of the relay had to wait (the server did not read), its socket's registration
// carries EPOLLOUT; each later wait for readability would then be reported at once, a wake-up
// for nothing per message. Once the relay waits to read that socket again, the registration
// holds no EPOLLOUT, and bytes still flow both ways, intact.
TEST(TcpRelay, AWriteThatWaitedLeavesNoWriteInterestOnTheSocketsNextReadWait) {
  boost::asio::io_context io;
  auto guard = boost::asio::make_work_guard(io);
  std::thread thread([&] { io.run(); });
  auto [client, relay_a] = tcp_pair();
  auto [relay_b, server] = tcp_pair();
  std::promise<TcpRelay::Result> result;
  std::shared_ptr<TcpRelay> relay;
  boost::asio::post(io, [&, relay_a = relay_a, relay_b = relay_b] {
    relay = std::make_shared<TcpRelay>(TcpRelay::Tcp::socket(io, TcpRelay::Tcp::v4(), relay_a),
                                       TcpRelay::Tcp::socket(io, TcpRelay::Tcp::v4(), relay_b));
    relay->start([&](const TcpRelay::Result& r) { result.set_value(r); });
  });

  // 16 MiB towards a server that reads nothing yet: more than the sockets on the way hold, so
  // the relay's writes to b wait.
  const size_t total = size_t{16} << 20;
  auto sent = pattern(total, 1);
  auto writer = std::async(std::launch::async, [&] { return write_all(client, sent.data(), total); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(writer.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the client should still be blocked: nothing pushed back";
  std::optional<uint32_t> blocked = epoll_events(relay_b);
  ASSERT_TRUE(blocked);
  EXPECT_TRUE(*blocked & EPOLLOUT) << "the relay waits for b to take more: " << std::hex << *blocked;

  std::vector<uint8_t> got(total);
  size_t have = 0;
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (have < total && Clock::now() < deadline) {
    ssize_t n = recv(server, got.data() + have, total - have, 0);
    ASSERT_GT(n, 0) << std::strerror(errno);
    have += static_cast<size_t>(n);
  }
  ASSERT_TRUE(writer.get());
  ASSERT_EQ(have, total);
  EXPECT_TRUE(got == sent) << "the bytes arrive intact, in order";

  // A request/response exchange the other way: the relay reads b, writes a, waits on b again.
  for (int round = 0; round < 3; ++round) {
    auto answer = pattern(100, static_cast<uint8_t>(round + 2));
    ASSERT_TRUE(write_all(server, answer.data(), answer.size()));
    std::vector<uint8_t> in(answer.size());
    size_t at = 0;
    while (at < in.size()) {
      ssize_t n = recv(client, in.data() + at, in.size() - at, 0);
      ASSERT_GT(n, 0) << std::strerror(errno);
      at += static_cast<size_t>(n);
    }
    EXPECT_TRUE(in == answer);
  }
  std::optional<uint32_t> events;
  for (auto until = Clock::now() + std::chrono::seconds(5); Clock::now() < until;) {
    events = epoll_events(relay_b);
    if (events && !(*events & EPOLLOUT)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(events) << "b is registered while the relay waits on it";
  EXPECT_TRUE(*events & EPOLLIN) << std::hex << *events;
  EXPECT_FALSE(*events & EPOLLOUT) << "b's registration still wants writability: " << std::hex
                                   << *events;

  shutdown(client, SHUT_WR);
  shutdown(server, SHUT_WR);
  auto f = result.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto r = f.get();
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.bytes_a_to_b, total);
  EXPECT_EQ(r.bytes_b_to_a, 300u);
  close(client);
  close(server);
  boost::asio::post(io, [&] { relay.reset(); });
  guard.reset();
  thread.join();
}

}  // namespace
}  // namespace sockmesh::net
