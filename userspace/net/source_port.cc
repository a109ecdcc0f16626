#include "net/source_port.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "base/errno_text.h"
#include "base/log.h"

namespace sockmesh::net {
namespace {

constexpr unsigned kMaxTries = 16;

constexpr int kListen = 10;  // TCP_LISTEN in the kernel's numbering (sock_diag's idiag_state)

void put_address(const IpAddress& ip, __be32 out[4]) {
  std::memset(out, 0, 4 * sizeof(__be32));
  if (ip.is_v4()) {
    out[0] = ip.v4_network_order();
  } else {
    std::memcpy(out, ip.bytes16().data(), 16);
  }
}

}  // namespace

namespace {

// A sock_diag socket for the lookups of one caller, closed with it.
class DiagSocket {
 public:
  DiagSocket() : fd_(socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG)) {}
  ~DiagSocket() {
    if (fd_ >= 0) close(fd_);
  }
  DiagSocket(const DiagSocket&) = delete;
  DiagSocket& operator=(const DiagSocket&) = delete;
  int get() const { return fd_; }

  // tcp_state_for on this socket; requests are numbered and a reply to another is skipped.
  std::optional<int> tcp_state(const Endpoint& local, const Endpoint& remote, std::string* error);

 private:
  int fd_;
  uint32_t seq_ = 0;
};

std::optional<int> DiagSocket::tcp_state(const Endpoint& local, const Endpoint& remote,
                                         std::string* error) {
  if (fd_ < 0) {
    *error = errno_text("sock_diag socket");
    return std::nullopt;
  }
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;  // one exact lookup, not a dump
  msg.nlh.nlmsg_seq = ++seq_;
  msg.req.sdiag_family = local.ip.is_v4() ? AF_INET : AF_INET6;
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_sport = htons(local.port);
  msg.req.id.idiag_dport = htons(remote.port);
  put_address(local.ip, msg.req.id.idiag_src);
  put_address(remote.ip, msg.req.id.idiag_dst);
  msg.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd_, &msg, sizeof msg, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    *error = errno_text("sock_diag request");
    return std::nullopt;
  }
  alignas(nlmsghdr) char buf[8192];
  // One reply per request; one to an earlier request that timed out elsewhere is passed over.
  for (int skipped = 0; skipped < 4; ++skipped) {
    ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = errno_text("sock_diag reply");
      return std::nullopt;
    }
    auto* h = reinterpret_cast<nlmsghdr*>(buf);
    if (!NLMSG_OK(h, static_cast<unsigned>(n))) {
      *error = "sock_diag reply: truncated";
      return std::nullopt;
    }
    if (h->nlmsg_seq != seq_) continue;
    if (h->nlmsg_type == NLMSG_ERROR) {
      auto* e = static_cast<nlmsgerr*>(NLMSG_DATA(h));
      if (e->error == -ENOENT) return std::nullopt;  // no socket holds it
      *error = "sock_diag: " + errno_text(-e->error);
      return std::nullopt;
    }
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
        h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
      *error = "sock_diag reply: unexpected message";
      return std::nullopt;
    }
    return static_cast<inet_diag_msg*>(NLMSG_DATA(h))->idiag_state;
  }
  *error = "sock_diag reply: none to this request";
  return std::nullopt;
}

}  // namespace

std::optional<int> tcp_state_for(const Endpoint& local, const Endpoint& remote,
                                 std::string* error) {
  DiagSocket diag;
  return diag.tcp_state(local, remote, error);
}

SourcePortChoice choose_source_port(const IpAddress& source, const Endpoint& destination,
                                    uint16_t low, uint16_t high) {
  SourcePortChoice c;
  if (low == 0 || low > high) {
    c.reason = "no source port range";
    return c;
  }
  thread_local std::minstd_rand rng{std::random_device{}()};
  std::uniform_int_distribution<unsigned> pick(low, high);
  DiagSocket diag;  // one for every lookup of this choice
  while (c.tries < kMaxTries) {
    ++c.tries;
    Endpoint self{source, static_cast<uint16_t>(pick(rng))};
    std::string err;
    // Our own direction: any socket there (an older dial's TIME_WAIT too) makes connect() fail.
    auto forward = diag.tcp_state(self, destination, &err);
    if (!err.empty()) {
      c.reason = err;
      return c;
    }
    // The reverse: a live socket there (the proxy's accepted socket of a connection from this
    // very client port) is what the SYN would meet. A listener is what it should meet; a
    // TIME_WAIT takes a new SYN as the start of a new connection.
    auto reverse = diag.tcp_state(destination, self, &err);
    if (!err.empty()) {
      c.reason = err;
      return c;
    }
    if (forward || (reverse && *reverse != kListen && *reverse != TCP_TIME_WAIT)) {
      ++c.held;
      continue;
    }
    c.port = self.port;
    return c;
  }
  c.reason = "no free port in " + std::to_string(kMaxTries) + " tries";
  return c;
}

}  // namespace sockmesh::net
