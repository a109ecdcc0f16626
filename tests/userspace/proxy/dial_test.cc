// dial() over real loopback sockets: a connect that completes at its deadline is either a success
// with an open, connected socket or a timeout with none, and its callback runs once.
#include "proxy/dial.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <memory>
#include <thread>
#include <vector>

namespace sockmesh::proxy {
namespace {

using Tcp = boost::asio::ip::tcp;
using namespace std::chrono_literals;

TEST(DialTest, ConnectAtTheDeadlineIsEitherAnOpenSuccessOrATimeout) {
  boost::asio::io_context io;
  Tcp::acceptor acceptor(io, Tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  auto target = Endpoint::parse("127.0.0.1:" + std::to_string(acceptor.local_endpoint().port()));
  ASSERT_TRUE(target);
  int successes = 0, timeouts = 0;
  // Deadlines of 0 and 1 ms are at the loopback connect's own duration: both completions are
  // ready in the same turn of the loop, in either order.
  for (int round = 0; round < 400; ++round) {
    int calls = 0;
    DialResult result;
    Tcp::socket got(io);
    dial(io, *target, net::DialOptions{}, std::chrono::milliseconds(round % 2),
         [&](DialResult r, Tcp::socket s) {
           ++calls;
           result = r;
           got = std::move(s);
         });
    // Let the connect complete in the kernel before either handler runs.
    std::this_thread::sleep_for(round % 4 < 2 ? 0ms : 2ms);
    io.restart();
    io.run_for(50ms);
    ASSERT_EQ(calls, 1) << "round " << round;
    if (result.ok) {
      ++successes;
      ASSERT_TRUE(got.is_open()) << "round " << round << ": success on a closed socket";
      Tcp::socket server(io);
      acceptor.accept(server);
      boost::system::error_code ec;
      boost::asio::write(got, boost::asio::buffer("x", 1), ec);
      ASSERT_FALSE(ec) << "round " << round << ": " << ec.message();
      char c = 0;
      boost::asio::read(server, boost::asio::buffer(&c, 1), ec);
      ASSERT_FALSE(ec) << "round " << round << ": " << ec.message();
      EXPECT_EQ(c, 'x');
    } else {
      ++timeouts;
      EXPECT_TRUE(result.timed_out) << "round " << round << ": " << result.error;
      EXPECT_FALSE(got.is_open()) << "round " << round;
      EXPECT_NE(result.error.find("timed out"), std::string::npos) << result.error;
      // The kernel may have completed the handshake: drop that connection.
      acceptor.non_blocking(true);
      boost::system::error_code ec;
      Tcp::socket server(io);
      acceptor.accept(server, ec);
      acceptor.non_blocking(false);
    }
  }
  // Both outcomes are allowed; the counts show which orders the loop ran.
  std::printf("at the deadline: %d successes, %d timeouts\n", successes, timeouts);
}

TEST(DialTest, ConnectThatCannotCompleteTimesOutOnceWithNoSocket) {
  boost::asio::io_context io;
  // A listener whose accept queue is full and never accepted: further SYNs are dropped, so a
  // connect to it hangs until the deadline.
  Tcp::acceptor acceptor(io);
  acceptor.open(Tcp::v4());
  acceptor.bind(Tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  acceptor.listen(0);
  // Non-blocking connects that nobody accepts (asio's synchronous connect would wait for each).
  std::vector<std::unique_ptr<Tcp::socket>> fillers;
  auto at = acceptor.local_endpoint();
  for (int i = 0; i < 4; ++i) {
    auto s = std::make_unique<Tcp::socket>(io, Tcp::v4());
    s->non_blocking(true);
    ::connect(s->native_handle(), at.data(), static_cast<socklen_t>(at.size()));
    fillers.push_back(std::move(s));
  }
  std::this_thread::sleep_for(50ms);
  auto target = Endpoint::parse("127.0.0.1:" + std::to_string(acceptor.local_endpoint().port()));
  int calls = 0;
  DialResult result;
  Tcp::socket got(io);
  auto started = std::chrono::steady_clock::now();
  dial(io, *target, net::DialOptions{}, 100ms, [&](DialResult r, Tcp::socket s) {
    ++calls;
    result = r;
    got = std::move(s);
  });
  io.run_for(600ms);  // past the deadline and the aborted connect's completion
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(result.ok);
  EXPECT_TRUE(result.timed_out) << result.error;
  EXPECT_FALSE(got.is_open());
  EXPECT_GE(std::chrono::steady_clock::now() - started, 100ms);
}

TEST(DialTest, RefusedConnectIsAnErrorNotATimeout) {
  boost::asio::io_context io;
  uint16_t port;
  {
    Tcp::acceptor a(io, Tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }  // closed: nothing listens there now
  auto target = Endpoint::parse("127.0.0.1:" + std::to_string(port));
  int calls = 0;
  DialResult result;
  dial(io, *target, net::DialOptions{}, 2000ms, [&](DialResult r, Tcp::socket) {
    ++calls;
    result = r;
  });
  io.run_for(3000ms);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(result.ok);
  EXPECT_FALSE(result.timed_out);
  EXPECT_NE(result.error.find("refused"), std::string::npos) << result.error;
}

}  // namespace
}  // namespace sockmesh::proxy
