#pragma once
// Loopback TCP helpers for the relay tests: connected pairs of plain blocking sockets, writes and
// reads with deadlines, and a byte pattern to check what arrives.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace sockmesh::net::testing {

using Clock = std::chrono::steady_clock;

inline std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = 2654435761u * (seed + 1u);
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// A connected loopback pair: {connecting end, accepted end}.
inline std::pair<int, int> tcp_pair() {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  EXPECT_EQ(bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << std::strerror(errno);
  EXPECT_EQ(::listen(l, 1), 0);
  getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len);
  int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(connect(c, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << std::strerror(errno);
  int a = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
  EXPECT_GE(a, 0) << std::strerror(errno);
  close(l);
  return {c, a};
}

inline bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads until EOF or error (errno kept in *err, 0 on EOF), at most `timeout_ms`.
inline std::vector<uint8_t> read_to_end(int fd, int* err, int timeout_ms = 20000) {
  std::vector<uint8_t> out;
  std::vector<uint8_t> buf(256 * 1024);
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  *err = ETIMEDOUT;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) {
      *err = errno;
      return out;
    }
    if (n == 0) {
      *err = 0;
      return out;
    }
    out.insert(out.end(), buf.begin(), buf.begin() + n);
  }
  return out;
}

}  // namespace sockmesh::net::testing
