#include "observe/http_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "observe/metrics.h"

namespace sockmesh::observe {
namespace {

using namespace std::chrono_literals;

// A server on its own thread, as the proxy runs them.
class HttpServerTest : public ::testing::Test {
 protected:
  void TearDown() override {
    boost::asio::post(io_, [this] { server_.reset(); });
    work_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }
  void listen(HttpLimits limits) {
    server_ = std::make_unique<HttpServer>(io_, "test", limits, &metrics_);
    server_->route("/x", [](const HttpRequest&) {
      return HttpResponse{200, "text/plain", "ok\n"};
    });
    Endpoint at{*IpAddress::parse("127.0.0.1"), 0};
    auto err = server_->listen(at);
    ASSERT_FALSE(err.has_value()) << *err;
    port_ = server_->local_endpoint().port;
    thread_ = std::thread([this] { io_.run(); });
  }
  int connect_client() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    return fd;
  }
  // Sends `request` and reads until the server closes; "" if it closed without answering.
  static std::string exchange(int fd, const std::string& request) {
    if (!request.empty()) (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::string out;
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
  }
  uint64_t counter(const std::string& name, const std::string& reason_label) {
    std::string text = metrics_.render();
    std::string key = name + "{listener=\"test\",reason=\"" + reason_label + "\"} ";
    auto at = text.find(key);
    return at == std::string::npos ? 0 : std::stoull(text.substr(at + key.size()));
  }

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ =
      boost::asio::make_work_guard(io_);
  std::thread thread_;
  Registry metrics_;
  std::unique_ptr<HttpServer> server_;
  uint16_t port_ = 0;
};

TEST_F(HttpServerTest, ClientsThatSendNothingMakeRoomForOnesThatDo) {
  HttpLimits limits;
  limits.max_connections = 4;
  listen(limits);
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(connect_client());
  std::this_thread::sleep_for(100ms);
  EXPECT_LE(server_->open_connections(), 4u);
  std::string reply =
      exchange(connect_client(), "GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_GT(counter("sockmesh_http_connections_shed_total", "idle_evicted"), 0u);
  for (int fd : idle) ::close(fd);
}

TEST_F(HttpServerTest, ARequestThatDoesNotArriveInTimeIsClosed) {
  HttpLimits limits;
  limits.request_timeout = 300ms;
  listen(limits);
  int fd = connect_client();
  // A request that trickles in, a byte at a time, never completes within the deadline.
  auto start = std::chrono::steady_clock::now();
  std::thread trickle([fd] {
    const std::string req = "GET /x HTTP/1.1\r\nHost: a\r\n";
    for (char c : req) {
      if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) return;
      std::this_thread::sleep_for(50ms);
    }
  });
  std::string reply = exchange(fd, "");
  trickle.join();
  EXPECT_EQ(reply, "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(counter("sockmesh_http_requests_rejected_total", "timeout"), 1u);
}

TEST_F(HttpServerTest, RequestsLargerThanTheLimitGet413) {
  HttpLimits limits;
  limits.max_request_bytes = 4096;
  listen(limits);
  std::string big = "GET /x HTTP/1.1\r\nHost: a\r\nX-Pad: " + std::string(8000, 'a') + "\r\n\r\n";
  std::string reply = exchange(connect_client(), big);
  EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply.substr(0, 100);
  std::string body =
      "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n" + std::string(100000, 'b');
  reply = exchange(connect_client(), body);
  EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply.substr(0, 100);
  EXPECT_EQ(counter("sockmesh_http_requests_rejected_total", "too_large"), 2u);
  // Within the limits, served as before.
  reply = exchange(connect_client(), "GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
}

// A query with a bad %-escape is answered 400 and counted as malformed; a good one is decoded.
TEST_F(HttpServerTest, ABadPercentEscapeInTheQueryIs400) {
  listen(HttpLimits{});
  for (const char* bad : {"/x?level=%zz", "/x?a=%4", "/x?a=%", "/x?%-1=b", "/x?a=%4x"}) {
    std::string got = exchange(connect_client(), std::string("GET ") + bad +
                                                     " HTTP/1.1\r\nHost: x\r\n"
                                                     "Connection: close\r\n\r\n");
    EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << bad << ": " << got;
    EXPECT_NE(got.find("not followed by two hex digits"), std::string::npos) << got;
  }
  EXPECT_EQ(counter("sockmesh_http_requests_rejected_total", "malformed"), 5u);
  std::string ok =
      exchange(connect_client(), "GET /x?a=%41+b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok;
}

}  // namespace
}  // namespace sockmesh::observe
