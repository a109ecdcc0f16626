#include "net/sockets.h"

#include <linux/netfilter_ipv4.h>
#include <linux/netfilter_ipv6/ip6_tables.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/errno_text.h"
#include "base/log.h"
#include "net/source_port.h"

namespace sockmesh::net {
namespace {

bool set_transparent(int fd, bool v6) {
  int one = 1;
  if (v6) return setsockopt(fd, SOL_IPV6, IPV6_TRANSPARENT, &one, sizeof one) == 0;
  return setsockopt(fd, SOL_IP, IP_TRANSPARENT, &one, sizeof one) == 0;
}

}  // namespace

Tcp::endpoint to_asio(const Endpoint& e) {
  sockaddr_storage ss{};
  e.to_sockaddr(&ss);
  Tcp::endpoint out;
  std::memcpy(out.data(), &ss, e.ip.is_v4() ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  return out;
}

Endpoint from_asio(const Tcp::endpoint& e) {
  auto ep = Endpoint::from_sockaddr(e.data());
  return ep ? *ep : Endpoint{};
}

std::optional<std::string> listen(Tcp::acceptor& acceptor, const Endpoint& at,
                                  const ListenOptions& options) {
  boost::system::error_code ec;
  auto ep = to_asio(at);
  acceptor.open(ep.protocol(), ec);
  if (ec) return "socket: " + ec.message();
  acceptor.set_option(Tcp::acceptor::reuse_address(true), ec);
  int fd = acceptor.native_handle();
  if (options.reuse_port) {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  }
  if (options.transparent && !set_transparent(fd, !at.ip.is_v4())) {
    auto err = errno_text("IP_TRANSPARENT (needs CAP_NET_ADMIN)");
    acceptor.close(ec);
    return err;
  }
  if (options.mark != 0 &&
      setsockopt(fd, SOL_SOCKET, SO_MARK, &options.mark, sizeof options.mark) != 0) {
    auto err = errno_text("SO_MARK (needs CAP_NET_ADMIN)");
    acceptor.close(ec);
    return err;
  }
  acceptor.bind(ep, ec);
  if (ec) {
    acceptor.close(ec);
    return "bind " + at.to_string() + ": " + std::strerror(errno);
  }
  acceptor.listen(options.backlog, ec);
  if (ec) return "listen " + at.to_string() + ": " + ec.message();
  return std::nullopt;
}

std::optional<Endpoint> original_destination(Tcp::socket& socket) {
  int fd = socket.native_handle();
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return std::nullopt;
  sockaddr_storage orig{};
  len = sizeof orig;
  if (local.ss_family == AF_INET && getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &orig, &len) == 0) {
    return Endpoint::from_sockaddr(reinterpret_cast<sockaddr*>(&orig));
  }
  len = sizeof orig;
  if (local.ss_family == AF_INET6 &&
      getsockopt(fd, SOL_IPV6, IP6T_SO_ORIGINAL_DST, &orig, &len) == 0) {
    return Endpoint::from_sockaddr(reinterpret_cast<sockaddr*>(&orig));
  }
  return Endpoint::from_sockaddr(reinterpret_cast<sockaddr*>(&local));
}

// socket() inside the pod's netns when there is one: the socket stays in the netns it was made in.
static std::optional<std::string> open_in(Tcp::socket& socket, const Tcp& protocol,
                                          const std::shared_ptr<const Netns>& netns) {
  boost::system::error_code ec;
  if (auto err = run_in(netns.get(), [&] { socket.open(protocol, ec); })) return err;
  if (ec) return "socket: " + ec.message();
  return std::nullopt;
}

std::optional<std::string> prepare_dial(Tcp::socket& socket, const Endpoint& destination,
                                        const DialOptions& options, bool* source_kept) {
  if (source_kept != nullptr) *source_kept = false;
  boost::system::error_code ec;
  auto ep = to_asio(destination);
  if (auto err = open_in(socket, ep.protocol(), options.netns)) return err;
  int fd = socket.native_handle();
  if (options.mark != 0 &&
      setsockopt(fd, SOL_SOCKET, SO_MARK, &options.mark, sizeof options.mark) != 0) {
    return errno_text("SO_MARK (needs CAP_NET_ADMIN)");
  }
  if (options.source && options.source->is_v4() == destination.ip.is_v4()) {
    Endpoint src{*options.source, 0};
    auto sep = to_asio(src);
    // Let the kernel pick the port at connect() time, so that the same source can reach many
    // destinations without exhausting ephemeral ports.
    int one = 1;
    setsockopt(fd, SOL_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    socket.bind(sep, ec);
    if (ec == boost::system::errc::address_not_available) {
      // Not a local address: only a transparent socket may use it. The port is ours to choose
      // then, off the four-tuples of the netns's live sockets in both directions (see
      // source_port.h); if that cannot be done the kernel picks it at connect() as before.
      if (set_transparent(fd, !src.ip.is_v4())) {
        SourcePortChoice choice;
        auto entered = run_in(options.netns.get(), [&] {
          choice = choose_source_port(src.ip, destination, options.kept_source_ports.low,
                                      options.kept_source_ports.high);
        });
        if (!entered && choice.port) {
          int reuse = 1;  // dials to other destinations may share this source port
          setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof reuse);
          sep.port(*choice.port);
        } else {
          SM_DEBUG("net") << "source port for " << src.ip.to_string() << " -> "
                          << destination.to_string()
                          << " left to the kernel: " << (entered ? *entered : choice.reason);
        }
        if (choice.held > 0) {
          SM_DEBUG("net") << "source port for " << src.ip.to_string() << " -> "
                          << destination.to_string() << ": " << choice.held
                          << " candidate(s) held by a live socket of the netns, skipped";
        }
        socket.bind(sep, ec);
      }
    }
    if (!ec && source_kept != nullptr) *source_kept = true;
    if (ec) {
      // Keep going without the source address; the caller logs that it was not kept.
      socket.close(ec);
      if (auto err = open_in(socket, ep.protocol(), options.netns)) return err;
      fd = socket.native_handle();
      if (options.mark != 0)
        setsockopt(fd, SOL_SOCKET, SO_MARK, &options.mark, sizeof options.mark);
    }
  }
  set_nodelay(socket);
  return std::nullopt;
}

namespace {
// SO_LINGER {on, 0}: close() resets. {off}: close() ends with FIN.
void set_abortive_close(Tcp::socket& socket, bool abortive) {
  linger l{abortive ? 1 : 0, 0};
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
}
}  // namespace

void close_with_reset(Tcp::socket& socket) {
  if (!socket.is_open()) return;
  set_abortive_close(socket, true);
  boost::system::error_code ec;
  socket.close(ec);
}

void reset_unless_closed_gracefully(Tcp::socket& socket) {
  if (socket.is_open()) set_abortive_close(socket, true);
}

void close_gracefully(Tcp::socket& socket) {
  if (!socket.is_open()) return;
  set_abortive_close(socket, false);
  boost::system::error_code ec;
  socket.close(ec);
}

void limit_relay_buffers(Tcp::socket& socket) {
  int size = 512 * 1024;
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
}

size_t unread_bytes(Tcp::socket& socket) {
  int n = 0;
  if (ioctl(socket.native_handle(), FIONREAD, &n) != 0 || n < 0) return 0;
  return static_cast<size_t>(n);
}

bool enable_inq_hint(int fd) {
  int on = 1;
  return setsockopt(fd, IPPROTO_TCP, TCP_INQ, &on, sizeof(on)) == 0;
}

ssize_t recv_with_inq_hint(int fd, void* buf, size_t len, int flags, bool* from_tcp) {
  iovec iov{buf, len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = ::recvmsg(fd, &msg, flags);
  *from_tcp = false;
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_TCP && c->cmsg_type == TCP_CM_INQ) *from_tcp = true;
  }
  return n;
}

void set_nodelay(Tcp::socket& socket) {
  boost::system::error_code ec;
  socket.set_option(Tcp::no_delay(true), ec);
}

boost::system::error_code register_for_reading(Tcp::socket& socket) {
  boost::system::error_code ec;
  Tcp protocol = socket.local_endpoint(ec).protocol();
  if (ec) return ec;
  bool non_blocking = socket.non_blocking();
  int fd = socket.release(ec);
  if (ec) return ec;
  socket.assign(protocol, fd, ec);
  if (ec) {
    ::close(fd);
    return ec;
  }
  // asio keeps "the user asked for non-blocking" in the object, not in the descriptor: without
  // it again, a read_some that finds nothing would block the thread in poll().
  if (non_blocking) socket.non_blocking(true, ec);
  return ec;
}

}  // namespace sockmesh::net
