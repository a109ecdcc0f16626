#include "testing/sockets.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "loader/attach/netns.h"

namespace sockmesh::testing {
namespace {

using Clock = std::chrono::steady_clock;

UniqueFd make_socket(const std::string& netns_path, const Endpoint& e, const SocketOptions& o) {
  auto scope = loader::NetnsScope::enter(netns_path);
  EXPECT_TRUE(scope) << scope.error().message;
  if (!scope) return UniqueFd();
  int family = e.ip.is_v4() ? AF_INET : AF_INET6;
  UniqueFd fd(socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (o.transparent) {
    int level = family == AF_INET ? SOL_IP : SOL_IPV6;
    int opt = family == AF_INET ? IP_TRANSPARENT : IPV6_TRANSPARENT;
    EXPECT_EQ(setsockopt(fd.get(), level, opt, &one, sizeof(one)), 0) << strerror(errno);
  }
  if (o.mark != 0) {
    EXPECT_EQ(setsockopt(fd.get(), SOL_SOCKET, SO_MARK, &o.mark, sizeof(o.mark)), 0)
        << strerror(errno);
  }
  return fd;
}

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

}  // namespace

UniqueFd listen_in(const std::string& netns_path, const Endpoint& at,
                   const SocketOptions& options) {
  UniqueFd fd = make_socket(netns_path, at, options);
  if (!fd) return fd;
  sockaddr_storage ss{};
  socklen_t len = at.to_sockaddr(&ss);
  EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len), 0)
      << at.to_string() << ": " << strerror(errno);
  EXPECT_EQ(listen(fd.get(), 128), 0) << strerror(errno);
  return fd;
}

UniqueFd connect_in(const std::string& netns_path, const Endpoint& to, const SocketOptions& options,
                    int timeout_ms) {
  UniqueFd fd = make_socket(netns_path, to, options);
  if (!fd) return fd;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000L};
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));  // bounds connect() too
  if (options.source) {
    sockaddr_storage from{};
    socklen_t from_len = Endpoint{*options.source, 0}.to_sockaddr(&from);
    EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&from), from_len), 0)
        << options.source->to_string() << ": " << strerror(errno);
  }
  sockaddr_storage ss{};
  socklen_t len = to.to_sockaddr(&ss);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    int err = errno;
    fd.reset();
    errno = err;
  }
  return fd;
}

UniqueFd accept_within(int listener, int timeout_ms) {
  pollfd p{listener, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return UniqueFd();
  return UniqueFd(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
}

Endpoint local_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return Endpoint::from_sockaddr(reinterpret_cast<sockaddr*>(&ss)).value_or(Endpoint{});
}

Endpoint peer_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return Endpoint::from_sockaddr(reinterpret_cast<sockaddr*>(&ss)).value_or(Endpoint{});
}

bool send_all(int fd, const uint8_t* data, size_t n) {
  while (n > 0) {
    ssize_t sent = send(fd, data, n, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        poll(&p, 1, 100);
        continue;
      }
      return false;
    }
    data += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

bool recv_exact(int fd, uint8_t* data, size_t n, int timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (n > 0) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, remaining_ms(deadline)) <= 0) return false;
    ssize_t got = recv(fd, data, n, MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (got <= 0) return false;
    data += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return out;
}

bool send_and_receive(int from, int to, const std::vector<uint8_t>& data, int timeout_ms) {
  std::vector<uint8_t> got(data.size());
  std::atomic<bool> sent_ok{false};
  std::thread sender([&] { sent_ok = send_all(from, data.data(), data.size()); });
  bool received = recv_exact(to, got.data(), got.size(), timeout_ms);
  if (!received) shutdown(from, SHUT_RDWR);  // unblock the sender
  sender.join();
  return received && sent_ok && got == data;
}

bool echo_round_trip(int fd, const std::vector<uint8_t>& data, int timeout_ms) {
  return send_and_receive(fd, fd, data, timeout_ms);
}

Server::Server(UniqueFd listener) : listener_(std::move(listener)) {}

Server::~Server() {}

void Server::start() {
  acceptor_ = std::thread([this] { accept_loop(); });
}

void Server::stop() {
  stopping_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& fd : fds_) shutdown(fd.get(), SHUT_RDWR);
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
  fds_.clear();
}

std::vector<std::pair<Endpoint, Endpoint>> Server::connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connections_;
}

void Server::accept_loop() {
  while (!stopping_) {
    UniqueFd conn = accept_within(listener_.get(), 100);
    if (!conn) continue;
    accepted_++;
    std::lock_guard<std::mutex> lock(mu_);
    connections_.emplace_back(peer_of(conn.get()), local_of(conn.get()));
    int fd = conn.get();
    fds_.push_back(std::move(conn));
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

void pump(int from, int to, const std::atomic<bool>& stopping) {
  std::vector<uint8_t> buf(size_t{256} * 1024);
  while (!stopping) {
    pollfd p{from, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = recv(from, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;
    if (!send_all(to, buf.data(), static_cast<size_t>(n))) break;
  }
  shutdown(to, SHUT_WR);
}

EchoServer::EchoServer(const std::string& netns_path, const Endpoint& at)
    : Server(listen_in(netns_path, at)) {
  start();
}

EchoServer::~EchoServer() { stop(); }

void EchoServer::serve(int fd) { pump(fd, fd, stopping_); }

Relay::Relay(const std::string& netns_path, maps::ListenerMap& listeners, const IpAddress& pod_ip,
             maps::ListenerKind kind, uint32_t upstream_mark, bool keep_source)
    : Server(
          listen_in(netns_path,
                    Endpoint{pod_ip.is_v4() ? IpAddress::v4(0) : IpAddress(), maps::port_of(kind)},
                    SocketOptions{.transparent = true, .mark = SM_MARK_PROXY})),
      netns_path_(netns_path),
      upstream_mark_(upstream_mark),
      keep_source_(keep_source) {
  auto s = listeners.add(pod_ip, kind, listener_fd());
  EXPECT_TRUE(s) << s.error().message;
  start();
}

Relay::~Relay() { stop(); }

std::vector<Relay::SegmentSizes> Relay::segment_sizes() const {
  std::lock_guard<std::mutex> lock(mss_mu_);
  return mss_;
}

int max_segment(int fd) {
  int mss = 0;
  socklen_t len = sizeof(mss);
  return getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &len) == 0 ? mss : -1;
}

uint32_t socket_mark(int fd) {
  uint32_t mark = 0;
  socklen_t len = sizeof(mark);
  EXPECT_EQ(getsockopt(fd, SOL_SOCKET, SO_MARK, &mark, &len), 0) << strerror(errno);
  return mark;
}

void Relay::serve(int fd) {
  // A captured connection's local address is where the app meant to go.
  Endpoint original = local_of(fd);
  SocketOptions dial{.mark = upstream_mark_};
  if (keep_source_) {
    dial.transparent = true;
    dial.source = peer_of(fd).ip;
  }
  UniqueFd upstream = connect_in(netns_path_, original, dial);
  if (!upstream) {
    shutdown(fd, SHUT_RDWR);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mss_mu_);
    mss_.push_back({max_segment(fd), max_segment(upstream.get())});
  }
  std::thread back([&] { pump(upstream.get(), fd, stopping_); });
  pump(fd, upstream.get(), stopping_);
  back.join();
}

}  // namespace sockmesh::testing
