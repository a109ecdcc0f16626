// choose_source_port() and tcp_state_for() against real loopback sockets of this netns.
#include "net/source_port.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>

namespace sockmesh::net {
namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

Endpoint local_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return *Endpoint::from_sockaddr(reinterpret_cast<sockaddr*>(&ss));
}

// A listener on 127.0.0.1 and one connection to it: the client's and the accepted socket.
struct Connected {
  Fd listener, client, accepted;
  Endpoint server, client_end;
  Connected() {
    listener.fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(listener.fd, 4), 0);
    server = local_of(listener.fd);
    client.fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_storage ss{};
    unsigned len = server.to_sockaddr(&ss);
    EXPECT_EQ(connect(client.fd, reinterpret_cast<sockaddr*>(&ss), len), 0);
    accepted.fd = accept(listener.fd, nullptr, nullptr);
    EXPECT_GE(accepted.fd, 0);
    client_end = local_of(client.fd);
  }
};

TEST(TcpStateFor, FindsEachDirectionOfALiveConnection) {
  Connected c;
  std::string err;
  auto forward = tcp_state_for(c.client_end, c.server, &err);
  ASSERT_TRUE(err.empty()) << err;
  ASSERT_TRUE(forward.has_value());
  EXPECT_EQ(*forward, TCP_ESTABLISHED);
  auto reverse = tcp_state_for(c.server, c.client_end, &err);
  ASSERT_TRUE(reverse.has_value());
  EXPECT_EQ(*reverse, TCP_ESTABLISHED);
}

TEST(TcpStateFor, ATupleNoSocketHoldsIsFreeAndAListenerSaysListen) {
  Connected c;
  std::string err;
  Endpoint nobody{c.client_end.ip, static_cast<uint16_t>(c.client_end.port ^ 1)};
  // The server's side of a connection from a port nobody uses: only the listener would take it.
  auto toward_listener = tcp_state_for(c.server, nobody, &err);
  ASSERT_TRUE(err.empty()) << err;
  ASSERT_TRUE(toward_listener.has_value());
  EXPECT_EQ(*toward_listener, 10);  // TCP_LISTEN
  auto from_nobody = tcp_state_for(nobody, c.server, &err);
  ASSERT_TRUE(err.empty()) << err;
  EXPECT_FALSE(from_nobody.has_value());
}

// The case the choice exists for: a dial from the client's address to the server, where this
// netns holds the reverse tuple of client:p (the accepted socket). p must never be chosen.
TEST(ChooseSourcePort, NeverTakesAPortWhoseReverseTupleIsLive) {
  Connected c;
  uint16_t p = c.client_end.port;
  for (int i = 0; i < 50; ++i) {
    auto only_p = choose_source_port(c.client_end.ip, c.server, p, p);
    EXPECT_FALSE(only_p.port.has_value()) << "took the live port " << p;
    EXPECT_EQ(only_p.held, only_p.tries);
    EXPECT_FALSE(only_p.reason.empty());
  }
  // With one free neighbour the choice is that neighbour, every time.
  uint16_t low = p > 1024 ? p - 1 : p, high = p > 1024 ? p : p + 1;
  for (int i = 0; i < 50; ++i) {
    auto two = choose_source_port(c.client_end.ip, c.server, low, high);
    ASSERT_TRUE(two.port.has_value()) << two.reason;
    EXPECT_NE(*two.port, p);
  }
}

TEST(ChooseSourcePort, SpreadsOverTheRange) {
  Connected c;
  std::set<uint16_t> seen;
  for (int i = 0; i < 200; ++i) {
    auto r = choose_source_port(c.client_end.ip, c.server, 20000, 20099);
    ASSERT_TRUE(r.port.has_value()) << r.reason;
    EXPECT_GE(*r.port, 20000);
    EXPECT_LE(*r.port, 20099);
    seen.insert(*r.port);
  }
  EXPECT_GT(seen.size(), 50u);
}

TEST(ChooseSourcePort, RefusesAnEmptyRange) {
  Connected c;
  auto r = choose_source_port(c.client_end.ip, c.server, 2000, 1999);
  EXPECT_FALSE(r.port.has_value());
  EXPECT_EQ(r.tries, 0u);
}

}  // namespace
}  // namespace sockmesh::net
