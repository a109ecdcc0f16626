#pragma once
// Socket set-up that Asio does not cover: transparent sockets, marks, original destinations,
// source-address binding and abortive close.
#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <optional>
#include <string>

#include "base/ip_address.h"
#include "net/netns.h"

namespace sockmesh::net {

using Tcp = boost::asio::ip::tcp;

Tcp::endpoint to_asio(const Endpoint& e);
Endpoint from_asio(const Tcp::endpoint& e);

struct ListenOptions {
  bool transparent = false;  // IP_TRANSPARENT: accept connections to non-local addresses
  bool reuse_port = false;
  uint32_t mark = 0;  // SO_MARK on the listener (inherited by accepted sockets)
  int backlog = 1024;
};

// Opens, binds and listens. Returns an error message on failure (e.g. missing CAP_NET_ADMIN).
std::optional<std::string> listen(Tcp::acceptor& acceptor, const Endpoint& at,
                                  const ListenOptions& options);

// The destination the client dialled. For a transparent (tc/TPROXY) socket that is the local
// address; for an iptables REDIRECT it is SO_ORIGINAL_DST.
std::optional<Endpoint> original_destination(Tcp::socket& socket);

// Source ports a dial from a foreign (kept) source address takes: by default below the ranges
// clients draw their own ports from (Linux 32768-60999, IANA 49152-65535), so that a client's next
// connection cannot meet a socket of the proxy's dial (see source_port.h).
struct PortRange {
  uint16_t low = 1024;
  uint16_t high = 32767;
};

struct DialOptions {
  std::optional<IpAddress> source;     // bind to this address first (source IP preservation)
  PortRange kept_source_ports;         // the port of a foreign `source`, chosen by the proxy
  uint32_t mark = 0;                   // SO_MARK, so that capture skips the proxy's own sockets
  std::shared_ptr<const Netns> netns;  // create the socket in this pod's netns (null: here)
};

// Opens the socket and prepares it for connect(): mark, then bind to the source address. A
// non-local source needs IP_TRANSPARENT; if that is refused the socket is left unbound and
// *source_kept is false.
std::optional<std::string> prepare_dial(Tcp::socket& socket, const Endpoint& destination,
                                        const DialOptions& options, bool* source_kept);

// Bytes received and not yet read (FIONREAD). For a socket in the bypass SOCKHASH the kernel counts
// the sockmap queue (what the peer's sends were redirected into); 0 when it cannot tell.
size_t unread_bytes(Tcp::socket& socket);

// Tells a bypassed socket's two receive queues apart. With TCP_INQ on (enable_inq_hint),
// tcp_recvmsg() attaches its hint to what it returns; tcp_bpf's read of the psock queue (bytes
// sk_msg redirected) does not, and it serves that queue first (loader_bypass_pinning_test,
// TheInqHintTellsTcpsQueueFromTheRedirectedBytes). Returns recvmsg()'s result; *from_tcp: the
// bytes (or the end of stream) came from TCP's receive queue.
bool enable_inq_hint(int fd);
ssize_t recv_with_inq_hint(int fd, void* buf, size_t len, int flags, bool* from_tcp);

// How far a relay's reading may fall behind a bypassed peer before the relay treats it as a pause
// (see TcpRelay::on_read_paused): redirected bytes are otherwise queued without limit.
inline constexpr size_t kMaxUnreadBeforePause = size_t{1} << 20;

// The most one read of a relay takes from an app-facing socket (TcpRelay, TunnelRelay), and the
// pipe a SpliceRelay asks for; held only while bytes move or wait for the other side (an idle
// relay holds none). 256 KiB, as the bench's floor relay: against 128 KiB it halves the system
// calls per MiB (and the unread-bytes checks of full reads), which moved one passthrough stream
// from 8.5 to 10.5 Gbit/s across nodes (docs/ARCHITECTURE.md, #16).
inline constexpr size_t kRelayBufferBytes = 256 * 1024;

// Registers the socket with its io_context's epoll afresh (release + assign: epoll_ctl DEL, ADD),
// keeping it open, connected and non-blocking as it was. For a socket with no asynchronous
// operation pending. asio adds EPOLLOUT to a registration when it waits for writability (a
// connect, a write that blocked) and never takes it off; every later wait for readability
// re-arms the registration (epoll_ctl MOD), and a writable socket is then reported at once: an
// epoll_wait that wakes for nothing, per message a relay waits for.
boost::system::error_code register_for_reading(Tcp::socket& socket);

// Caps both socket buffers of a socket the proxy relays (512 KiB each; the kernel doubles it).
// Left to autotuning they grow to the kernel's maximum (tcp_rmem/tcp_wmem: 6 and 4 MiB here)
// because the relay reads eagerly, and a stalled reader would then let its writer queue over
// 16 MiB in the path (without the mesh about 1.5 MiB: a socket that is not read does not grow
// its buffer). The cap is still many times a local hop's bandwidth-delay product.
void limit_relay_buffers(Tcp::socket& socket);

// Closes with RST instead of FIN, so that the peer sees a reset rather than a clean end.
void close_with_reset(Tcp::socket& socket);

// Arms SO_LINGER {on, 0}: from now on, any close but close_gracefully() resets the connection,
// including the kernel's close when the proxy dies. Without it a killed proxy ends an app's
// connection with FIN, which the app takes for a clean end; and with the sockmap bypass the bytes
// redirected into a socket's ingress queue do not count as unread, so not even unread data turns
// that FIN into RST. Applied to every socket that faces an app or a passthrough peer.
void reset_unless_closed_gracefully(Tcp::socket& socket);
// Disarms the above and closes: FIN, the orderly end of a relay whose directions both ended.
void close_gracefully(Tcp::socket& socket);

void set_nodelay(Tcp::socket& socket);

}  // namespace sockmesh::net
