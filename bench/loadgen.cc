// sockmesh-loadgen: load generator and sink/echo server for the benchmark (bench/run.py).
//
//   sockmesh-loadgen server --listen IP:PORT [--max-seconds S]
//                    [--transparent yes] [--mark N] [--register PIN_ROOT,POD_IP]
//                    (in the proxy's place: bench/capture.py --hop-only)
//   sockmesh-loadgen relay --listen IP:PORT --to IP:PORT [--max-seconds S]
//                    [--tls-listen CERT,KEY,CA | --tls-to CERT,KEY,CA [--h2 yes]]
//                    [--loop epoll|asio]
//                    (the benchmark's floor: the least a user-space relay hop can do, with or
//                    without mTLS on one side, and HTTP/2 CONNECT inside it, see below)
//   sockmesh-loadgen client --mode throughput|pingpong|hold|churn|connect --target IP:PORT
//                    [--via tcp|socks5|http --proxy IP:PORT] [--bind IP]
//                    [--bytes N --streams K] [--size B --iters M --warmup W]
//                    [--conns C] [--seconds S] [--timeout S]
//   sockmesh-loadgen client --mode h2frames --via h2 --proxy IP:PORT --tls CERT,KEY,CA
//                    --target IP:PORT [--bind IP] [--frames N] [--size B] [--timeout S]
//                    (one HTTP/2 CONNECT stream over mutual TLS straight to an HBONE-style
//                    server, carrying N DATA frames of B bytes each to a sink; frames per second)
//   --netns-only yes (either role): also accept non-loopback addresses, but only when the process
//                    runs in a network namespace other than the initial one (PID 1's, or when
//                    that is unreadable, the parent process's), so that
//                    the traffic still stays on the machine (bench/capture.py: pods and a node as
//                    namespaces joined by veths).
//
// Every connection starts with a 16-byte header from the client: "SMLG", an op byte, three pad
// bytes and a little-endian u64 argument.
//   op 1 (sink):  the server reads the argument's number of bytes, then answers with the u64 count.
//                 The ack does not depend on a FIN, so paths that drop half-close work too.
//   op 2 (echo):  the server reads messages of argument bytes and writes each back, until EOF.
//   op 3 (hold):  the server answers one byte 'H' and then waits for EOF.
// Client results are one JSON object on stdout. Everything is bounded: socket timeouts on every
// blocking call, a wall-clock deadline on every loop, and the server exits after --max-seconds.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include "base/ip_address.h"
#include "loader/maps/listener_map.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint8_t kOpSink = 1;
constexpr uint8_t kOpEcho = 2;
constexpr uint8_t kOpHold = 3;
constexpr size_t kChunk = 256 * 1024;
constexpr uint64_t kMaxMessage = 16 * 1024 * 1024;

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& what) {
  throw Failure(what + (errno != 0 ? std::string(": ") + std::strerror(errno) : std::string()));
}

// Set by --netns-only yes, after checking that this process is not in the initial netns.
bool g_netns_only = false;

struct Addr {
  std::string ip;
  uint16_t port = 0;
  sockaddr_in sa() const {
    sockaddr_in s{};
    s.sin_family = AF_INET;
    s.sin_port = htons(port);
    if (inet_pton(AF_INET, ip.c_str(), &s.sin_addr) != 1) {
      errno = 0;
      fail("bad IPv4 address " + ip);
    }
    // Loopback only: this tool never sends traffic off the machine.
    if ((ntohl(s.sin_addr.s_addr) >> 24) != 127 && !g_netns_only) {
      errno = 0;
      fail("refusing non-loopback address " + ip);
    }
    return s;
  }
};

Addr parse_addr(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos) {
    errno = 0;
    fail("expected IP:PORT, got " + s);
  }
  return Addr{s.substr(0, colon), static_cast<uint16_t>(std::stoi(s.substr(colon + 1)))};
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

void set_timeouts(int fd, double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void write_all(int fd, const void* data, size_t len) {
  auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("send");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}

// Reads exactly len bytes; false on a clean EOF before the first byte.
bool read_exact(int fd, void* data, size_t len) {
  auto* p = static_cast<uint8_t*>(data);
  size_t got = 0;
  while (got < len) {
    ssize_t n = ::recv(fd, p + got, len - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("recv");
    }
    if (n == 0) {
      if (got == 0) return false;
      errno = 0;
      fail("EOF after " + std::to_string(got) + " of " + std::to_string(len) + " bytes");
    }
    got += static_cast<size_t>(n);
  }
  return true;
}

void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Server

std::atomic<int> g_server_conns{0};

void serve(int raw_fd) {
  Fd fd(raw_fd);
  g_server_conns++;
  try {
    set_nodelay(fd.get());
    uint8_t hdr[16];
    if (!read_exact(fd.get(), hdr, sizeof hdr)) throw Failure("no header");
    if (std::memcmp(hdr, "SMLG", 4) != 0) throw Failure("bad magic");
    uint64_t arg = get_u64(hdr + 8);
    if (hdr[4] == kOpSink) {
      std::vector<uint8_t> buf(kChunk);
      uint64_t left = arg;
      while (left > 0) {
        ssize_t n = ::recv(fd.get(), buf.data(), std::min<uint64_t>(left, buf.size()), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw Failure("sink: short read");
        left -= static_cast<uint64_t>(n);
      }
      uint8_t ack[8];
      put_u64(ack, arg);
      write_all(fd.get(), ack, sizeof ack);
      char c;
      while (::recv(fd.get(), &c, 1, 0) > 0) {
      }
    } else if (hdr[4] == kOpEcho) {
      if (arg == 0 || arg > kMaxMessage) throw Failure("echo: bad size");
      std::vector<uint8_t> buf(arg);
      while (read_exact(fd.get(), buf.data(), buf.size())) write_all(fd.get(), buf.data(), buf.size());
    } else if (hdr[4] == kOpHold) {
      write_all(fd.get(), "H", 1);
      char c;
      while (::recv(fd.get(), &c, 1, 0) > 0) {
      }
    } else {
      throw Failure("unknown op");
    }
  } catch (const std::exception&) {
    // One bad connection never stops the server.
  }
  g_server_conns--;
}

// In place of the proxy (bench/capture.py --hop-only): the listener takes the proxy's mark and is
// transparent like the proxy's in-pod 15001, and may be registered in sockmesh's listener map as
// a pod's outbound listener, so that tc assigns captured SYNs to it.
struct ServerOptions {
  bool transparent = false;
  uint32_t mark = 0;
  std::string register_root;  // pin root of sockmesh's maps
  std::string register_ip;    // the pod's IP
};

int run_server(const Addr& listen_addr, double max_seconds, double io_timeout,
               const ServerOptions& so) {
  Fd lfd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (lfd.get() < 0) fail("socket");
  int one = 1;
  setsockopt(lfd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (so.transparent && setsockopt(lfd.get(), SOL_IP, IP_TRANSPARENT, &one, sizeof one) != 0) {
    fail("IP_TRANSPARENT");
  }
  if (so.mark != 0 && setsockopt(lfd.get(), SOL_SOCKET, SO_MARK, &so.mark, sizeof so.mark) != 0) {
    fail("SO_MARK");
  }
  sockaddr_in sa = listen_addr.sa();
  if (::bind(lfd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) fail("bind");
  if (::listen(lfd.get(), 4096) != 0) fail("listen");
  if (!so.register_root.empty()) {
    auto pod_ip = sockmesh::IpAddress::parse(so.register_ip);
    if (!pod_ip) throw Failure("--register: bad IP " + so.register_ip);
    auto map = sockmesh::maps::ListenerMap::open(so.register_root);
    if (!map) throw Failure("--register: " + map.error().message);
    auto added = map->add(*pod_ip, sockmesh::maps::ListenerKind::kOutbound, lfd.get());
    if (!added) throw Failure("--register: " + added.error().message);
  }
  std::printf("{\"listening\": \"%s:%u\"}\n", listen_addr.ip.c_str(), listen_addr.port);
  std::fflush(stdout);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  auto deadline = Clock::now() + std::chrono::duration<double>(max_seconds);
  while (Clock::now() < deadline) {
    pollfd p{lfd.get(), POLLIN, 0};
    int r = ::poll(&p, 1, 500);
    if (r <= 0) continue;
    int cfd = ::accept4(lfd.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (cfd < 0) continue;
    set_timeouts(cfd, io_timeout);
    pthread_t t;
    auto* arg = new int(cfd);
    if (pthread_create(
            &t, &attr,
            [](void* a) -> void* {
              int fd = *static_cast<int*>(a);
              delete static_cast<int*>(a);
              serve(fd);
              return nullptr;
            },
            arg) != 0) {
      delete arg;
      ::close(cfd);
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Relay: the floor of a user-space relay hop. One thread, one epoll set, level-triggered; each
// readable socket gets one recv() of up to 256 KiB and the bytes go to its partner with send()
// at once (blocking, under the socket timeouts; waiting with poll() for room on a socket that
// --loop asio made non-blocking). No TLS, no framing, no buffering, no accounting:
// only the system calls that any proxy between two TCP connections must make per message. The
// benchmark runs two of them in place of nodes A and B, so that a target can be set against what
// the machine allows before TLS and HTTP/2 cost anything.
//
// With --tls-listen or --tls-to, one side of the relay speaks mutual TLS 1.3 (AES-128-GCM, as
// the proxy prefers): a pair of such relays is the floor with TLS and without HTTP/2. TLS is done
// as cheaply as OpenSSL allows: one recv() takes many records (read-ahead into a 256 KiB buffer),
// SSL_read drains everything decrypted before the plaintext goes on in one send(), and the records
// of one SSL_write are gathered in memory and sent with one send().
//
// With --h2 yes as well, the TLS side carries HBONE's framing: an HTTP/2 session (nghttp2) with
// one CONNECT stream per relayed connection, the windows and frame size the proxy uses (stream 4
// MiB, connection 16 MiB, frames up to 256 KiB). A pair of such relays is the floor with TLS and
// HTTP/2 and nothing else: no pool, no policy, no metrics, no event framework. The bytes are
// framed as cheaply as nghttp2 allows: DATA frames name the relay's read buffer (NO_COPY) and are
// copied once, beside their frame headers, into the batch that one SSL_write encrypts; received
// DATA goes on from the decrypted buffer with no copy.

struct RelayTls {
  enum class Side { kNone, kListen, kTo };
  Side side = Side::kNone;
  std::string cert, key, ca;
  bool h2 = false;
};

[[noreturn]] void tls_fail(const std::string& what) {
  unsigned long e = ERR_get_error();
  char text[256] = "no OpenSSL error";
  if (e != 0) ERR_error_string_n(e, text, sizeof text);
  errno = 0;
  fail(what + ": " + text);
}

using SslCtx = std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)>;

SslCtx relay_tls_context(const RelayTls& t) {
  bool server = t.side == RelayTls::Side::kListen;
  SslCtx ctx(SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()), &SSL_CTX_free);
  if (!ctx) tls_fail("SSL_CTX_new");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION);
  SSL_CTX_set_ciphersuites(ctx.get(), "TLS_AES_128_GCM_SHA256");
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), t.cert.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx.get(), t.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_load_verify_locations(ctx.get(), t.ca.c_str(), nullptr) != 1) {
    tls_fail("loading " + t.cert + ", " + t.key + " and " + t.ca);
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
                     nullptr);
  SSL_CTX_set_default_read_buffer_len(ctx.get(), kChunk);
  return ctx;
}

// One socket of a relayed connection: its partner, and its TLS state when it speaks TLS.
struct Hop {
  int partner = -1;
  uint32_t generation = 0;    // in the epoll tag: an event for a closed fd whose number was reused
                              // by a later connection is recognised as stale
  SSL* ssl = nullptr;         // owns its BIOs
  std::vector<uint8_t> out;   // records written by SSL_write, not yet sent
  // --h2: the HTTP/2 session on this TLS hop and its one CONNECT stream.
  nghttp2_session* h2 = nullptr;
  int fd = -1;
  int32_t stream = -1;        // the client's from its request, the server's once one arrives
  bool stream_over = false;
  double timeout = 0;
  const uint8_t* unframed = nullptr;  // bytes from the partner not yet in a DATA frame
  size_t unframed_len = 0;
  std::vector<uint8_t> plain;  // frames of one write batch, before SSL_write
  std::string failure;         // why a callback failed (exceptions do not cross nghttp2)
  ~Hop() {
    if (h2 != nullptr) nghttp2_session_del(h2);
    if (ssl != nullptr) SSL_free(ssl);
  }
};

// A write-only BIO that appends to a Hop's `out`.
BIO_METHOD* gather_bio_method() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "relay-gather");
    BIO_meth_set_write_ex(m, [](BIO* b, const char* data, size_t len, size_t* written) {
      auto* out = static_cast<std::vector<uint8_t>*>(BIO_get_data(b));
      // uint8_t pointers, not char: vector's insert then copies with memmove, not byte by byte.
      const auto* bytes = reinterpret_cast<const uint8_t*>(data);
      out->insert(out->end(), bytes, bytes + len);
      *written = len;
      return 1;
    });
    BIO_meth_set_ctrl(m, [](BIO*, int cmd, long, void*) -> long {
      return cmd == BIO_CTRL_FLUSH ? 1 : 0;
    });
    BIO_meth_set_create(m, [](BIO* b) {
      BIO_set_init(b, 1);
      return 1;
    });
    return m;
  }();
  return method;
}

// Sends on a non-blocking socket, waiting for room for up to timeout seconds at a time.
void send_all_waiting(int fd, const uint8_t* p, size_t len, double timeout) {
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      if (::poll(&pf, 1, static_cast<int>(timeout * 1000)) <= 0) {
        errno = ETIMEDOUT;
        fail("send");
      }
      continue;
    }
    fail("send");
  }
}

void flush_tls(int fd, Hop& hop, double timeout) {
  if (hop.out.empty()) return;
  send_all_waiting(fd, hop.out.data(), hop.out.size(), timeout);
  hop.out.clear();
}

// Makes fd a TLS hop (non-blocking from here on) and completes the handshake.
// A peer that never finishes its handshake holds the (single-threaded) relay this long at most.
constexpr double kHandshakeSeconds = 5;

void start_tls(SSL_CTX* ctx, int fd, Hop& hop, bool server, double timeout) {
  hop.ssl = SSL_new(ctx);
  if (hop.ssl == nullptr) tls_fail("SSL_new");
  BIO* rbio = BIO_new_socket(fd, BIO_NOCLOSE);
  BIO* wbio = BIO_new(gather_bio_method());
  BIO_set_data(wbio, &hop.out);
  SSL_set_bio(hop.ssl, rbio, wbio);
  SSL_set_read_ahead(hop.ssl, 1);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (server) {
    SSL_set_accept_state(hop.ssl);
  } else {
    SSL_set_connect_state(hop.ssl);
  }
  auto deadline = Clock::now() + std::chrono::duration<double>(std::min(timeout, kHandshakeSeconds));
  for (;;) {
    ERR_clear_error();
    int rv = SSL_do_handshake(hop.ssl);
    flush_tls(fd, hop, timeout);
    if (rv == 1) return;
    if (SSL_get_error(hop.ssl, rv) != SSL_ERROR_WANT_READ) tls_fail("TLS handshake");
    if (Clock::now() > deadline) tls_fail("TLS handshake timed out");
    pollfd pf{fd, POLLIN, 0};
    ::poll(&pf, 1, 100);
  }
}

// --- the HTTP/2 layer of --h2 ---------------------------------------------------------------

constexpr uint32_t kH2StreamWindow = 4 * 1024 * 1024;
constexpr uint32_t kH2ConnectionWindow = 16 * 1024 * 1024;
constexpr uint32_t kH2MaxFrame = 256 * 1024;
constexpr size_t kH2Batch = 256 * 1024;

// How large a DATA frame may be: as large as both windows and the peer's SETTINGS_MAX_FRAME_SIZE
// allow, as the proxy sends them (without this callback nghttp2 sends at most 16 KiB).
ssize_t h2_frame_length(nghttp2_session*, uint8_t, int32_t, int32_t session_window,
                        int32_t stream_window, uint32_t remote_max_frame, void*) {
  int64_t n = std::min<int64_t>({session_window, stream_window, remote_max_frame});
  return static_cast<ssize_t>(std::max<int64_t>(n, 1));
}

// nghttp2 asks how much of the stream's data to put in the next DATA frame.
ssize_t h2_read_data(nghttp2_session*, int32_t, uint8_t*, size_t length, uint32_t* flags,
                     nghttp2_data_source*, void* user) {
  auto* hop = static_cast<Hop*>(user);
  if (hop->unframed_len == 0) return NGHTTP2_ERR_DEFERRED;  // resumed when the partner has more
  *flags |= NGHTTP2_DATA_FLAG_NO_COPY;
  return static_cast<ssize_t>(std::min(length, hop->unframed_len));
}

// ... and then has us write that frame: header and payload go into the batch.
int h2_send_data(nghttp2_session*, nghttp2_frame* frame, const uint8_t* framehd, size_t length,
                 nghttp2_data_source*, void* user) {
  auto* hop = static_cast<Hop*>(user);
  if (length > hop->unframed_len || frame->data.padlen != 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
  hop->plain.insert(hop->plain.end(), framehd, framehd + 9);
  hop->plain.insert(hop->plain.end(), hop->unframed, hop->unframed + length);
  hop->unframed += length;
  hop->unframed_len -= length;
  return hop->plain.size() >= kH2Batch ? NGHTTP2_ERR_PAUSE : 0;
}

// Windows reopen on their own (nghttp2's automatic WINDOW_UPDATE) as DATA arrives.
int h2_on_data(nghttp2_session*, uint8_t, int32_t stream_id, const uint8_t* data, size_t len,
               void* user) {
  auto* hop = static_cast<Hop*>(user);
  if (stream_id != hop->stream) return 0;  // not the relayed stream: dropped
  try {
    send_all_waiting(hop->partner, data, len, hop->timeout);
  } catch (const Failure& e) {
    hop->failure = e.what();
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  return 0;
}

void h2_submit_stream(Hop& hop, int32_t id, bool server, const std::string& authority);

int h2_on_frame(nghttp2_session*, const nghttp2_frame* frame, void* user) {
  auto* hop = static_cast<Hop*>(user);
  // The server's side: the first request opens the stream (the target is the relay's --to).
  if (hop->stream < 0 && frame->hd.type == NGHTTP2_HEADERS &&
      frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
    h2_submit_stream(*hop, frame->hd.stream_id, true, "");
  }
  return 0;
}

int h2_on_close(nghttp2_session*, int32_t stream_id, uint32_t, void* user) {
  auto* hop = static_cast<Hop*>(user);
  if (stream_id == hop->stream) hop->stream_over = true;
  return 0;
}

// The client's request (CONNECT to the authority) or the server's 200 answer, with a data
// source that is the partner's bytes as they come.
void h2_submit_stream(Hop& hop, int32_t id, bool server, const std::string& authority) {
  nghttp2_data_provider source{};
  source.read_callback = h2_read_data;
  auto nv = [](const char* name, const std::string& value) {
    return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name)),
                      reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())),
                      std::strlen(name), value.size(), NGHTTP2_NV_FLAG_NONE};
  };
  if (server) {
    static const std::string ok = "200";
    nghttp2_nv h[] = {nv(":status", ok)};
    hop.stream = id;
    if (nghttp2_submit_response(hop.h2, id, h, 1, &source) != 0) hop.failure = "submit_response";
    return;
  }
  static const std::string connect = "CONNECT";
  nghttp2_nv h[] = {nv(":method", connect), nv(":authority", authority)};
  hop.stream = nghttp2_submit_request(hop.h2, nullptr, h, 2, &source, nullptr);
  if (hop.stream < 0) hop.failure = "submit_request";
}

// Everything nghttp2 has to send, in batches of one SSL_write and one send() each.
void h2_flush(Hop& hop) {
  for (;;) {
    hop.plain.clear();
    while (hop.plain.size() < kH2Batch) {
      const uint8_t* data = nullptr;
      ssize_t n = nghttp2_session_mem_send(hop.h2, &data);
      if (n < 0) throw Failure(std::string("nghttp2 send: ") + nghttp2_strerror(static_cast<int>(n)));
      if (n == 0) break;
      hop.plain.insert(hop.plain.end(), data, data + n);
    }
    if (!hop.failure.empty()) throw Failure(hop.failure);
    if (hop.plain.empty()) return;
    size_t written = 0;
    if (SSL_write_ex(hop.ssl, hop.plain.data(), hop.plain.size(), &written) != 1 ||
        written != hop.plain.size()) {
      tls_fail("SSL_write");
    }
    flush_tls(hop.fd, hop, hop.timeout);
  }
}

// Starts the HTTP/2 session on a TLS hop whose handshake is done.
void h2_start(Hop& hop, int fd, bool server, const std::string& authority, double timeout) {
  hop.fd = fd;
  hop.timeout = timeout;
  nghttp2_session_callbacks* cb = nullptr;
  if (nghttp2_session_callbacks_new(&cb) != 0) throw Failure("nghttp2_session_callbacks_new");
  nghttp2_session_callbacks_set_send_data_callback(cb, h2_send_data);
  nghttp2_session_callbacks_set_data_source_read_length_callback(cb, h2_frame_length);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2_on_data);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, h2_on_frame);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2_on_close);
  int rv = server ? nghttp2_session_server_new(&hop.h2, cb, &hop)
                  : nghttp2_session_client_new(&hop.h2, cb, &hop);
  nghttp2_session_callbacks_del(cb);
  if (rv != 0) throw Failure("nghttp2 session: " + std::string(nghttp2_strerror(rv)));
  std::vector<nghttp2_settings_entry> iv = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 100},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, kH2StreamWindow},
      {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, kH2MaxFrame},
  };
  if (!server) iv.push_back({NGHTTP2_SETTINGS_ENABLE_PUSH, 0});
  if (nghttp2_submit_settings(hop.h2, NGHTTP2_FLAG_NONE, iv.data(), iv.size()) != 0 ||
      nghttp2_session_set_local_window_size(hop.h2, NGHTTP2_FLAG_NONE, 0,
                                            kH2ConnectionWindow) != 0) {
    throw Failure("nghttp2 settings");
  }
  if (!server) h2_submit_stream(hop, -1, false, authority);
  h2_flush(hop);
}

// Decrypted bytes from the peer: frames for nghttp2, whose DATA goes on to the partner at once.
// False when the stream or the session is over.
bool h2_received(Hop& hop, const uint8_t* data, size_t len) {
  ssize_t rv = nghttp2_session_mem_recv(hop.h2, data, len);
  if (!hop.failure.empty()) throw Failure(hop.failure);
  if (rv < 0) throw Failure(std::string("nghttp2 receive: ") + nghttp2_strerror(static_cast<int>(rv)));
  h2_flush(hop);  // settings acks, window updates, the server's answer
  return !hop.stream_over;
}

bool h2_read_tls(Hop& hop, uint8_t* buf, size_t cap);

// The partner's bytes go out as DATA frames, all of them before we return (the read buffer is
// reused): while the peer's window is shut, what it sends is read (its WINDOW_UPDATEs, and DATA
// that goes on to the partner) until the window opens.
void h2_send(Hop& hop, const uint8_t* data, size_t len) {
  static std::vector<uint8_t> wait_buf(kChunk);
  if (hop.stream < 0 || hop.stream_over) throw Failure("no open HTTP/2 stream for the bytes");
  hop.unframed = data;
  hop.unframed_len = len;
  auto deadline = Clock::now() + std::chrono::duration<double>(hop.timeout);
  for (;;) {
    size_t before = hop.unframed_len;
    nghttp2_session_resume_data(hop.h2, hop.stream);  // not deferred: a harmless error
    h2_flush(hop);
    if (hop.unframed_len == 0) break;
    if (hop.unframed_len < before) {  // the window moves: the timeout is for one that does not
      deadline = Clock::now() + std::chrono::duration<double>(hop.timeout);
    }
    if (hop.stream_over) throw Failure("HTTP/2 stream closed with bytes unsent");
    if (Clock::now() > deadline) throw Failure("HTTP/2 window shut for the whole timeout");
    pollfd pf{hop.fd, POLLIN, 0};
    if (SSL_has_pending(hop.ssl) == 0) ::poll(&pf, 1, 100);
    if (!h2_read_tls(hop, wait_buf.data(), wait_buf.size())) {
      throw Failure("HTTP/2 connection closed while its window was shut");
    }
  }
  hop.unframed = nullptr;
}

// Bytes read from one hop go to the other: over TLS (all records in one send) or plain.
void relay_send(int fd, Hop& hop, const uint8_t* data, size_t len, double timeout) {
  if (hop.h2 != nullptr) {
    h2_send(hop, data, len);
    return;
  }
  if (hop.ssl == nullptr) {
    send_all_waiting(fd, data, len, timeout);
    return;
  }
  size_t written = 0;
  if (SSL_write_ex(hop.ssl, data, len, &written) != 1 || written != len) tls_fail("SSL_write");
  flush_tls(fd, hop, timeout);
}

// Decrypts everything a TLS hop's socket has, a buffer at a time, and hands each to deliver
// (false from it: the connection is over). False when the connection is over.
template <typename Deliver>
bool tls_readable(int fd, Hop& hop, uint8_t* buf, size_t cap, double timeout, Deliver deliver) {
  for (;;) {
    size_t total = 0;
    bool open = true;
    // As the proxy does: clear the error queue only when it holds something (ERR_clear_error
    // on an empty queue still makes 32 free() calls in OpenSSL 3.0).
    if (ERR_peek_error() != 0) ERR_clear_error();
    while (total < cap) {
      size_t n = 0;
      int rv = SSL_read_ex(hop.ssl, buf + total, cap - total, &n);
      if (rv == 1) {
        total += n;
        continue;
      }
      open = SSL_get_error(hop.ssl, rv) == SSL_ERROR_WANT_READ;
      break;
    }
    flush_tls(fd, hop, timeout);  // a KeyUpdate answer, if the peer asked for one
    if (total > 0 && !deliver(buf, total)) return false;
    if (!open) return false;
    if (total < cap) return true;  // drained: OpenSSL wants the socket again
  }
}

// --h2: what the TLS hop has, while its partner's bytes wait for the peer's window.
bool h2_read_tls(Hop& hop, uint8_t* buf, size_t cap) {
  return tls_readable(hop.fd, hop, buf, cap, hop.timeout,
                      [&](const uint8_t* d, size_t n) { return h2_received(hop, d, n); });
}

// Reads what fd has (all of it, for TLS) and passes it on. False when the connection is over.
bool relay_readable(int fd, Hop& hop, Hop& to, uint8_t* buf, size_t cap, double timeout) {
  if (hop.ssl == nullptr) {
    ssize_t got = ::recv(fd, buf, cap, 0);
    // Under --loop asio every socket is non-blocking (asio makes a descriptor so for its waits).
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    if (got <= 0) return false;
    relay_send(hop.partner, to, buf, static_cast<size_t>(got), timeout);
    return true;
  }
  if (hop.h2 != nullptr) return h2_read_tls(hop, buf, cap);
  return tls_readable(fd, hop, buf, cap, timeout, [&](const uint8_t* d, size_t n) {
    relay_send(hop.partner, to, d, n, timeout);
    return true;
  });
}

// The relayed connections of one relay process, whichever loop reports their sockets readable.
// The loop is told of each new pair (watch) and of each socket about to close (forget).
class RelayTable {
 public:
  RelayTable(const Addr& to, double io_timeout, const RelayTls& tls)
      : to_(to),
        io_timeout_(io_timeout),
        tls_(tls),
        // Page-aligned: the kernel copies into a misaligned destination at about half the speed.
        buf_(static_cast<uint8_t*>(std::aligned_alloc(4096, kChunk)), &std::free) {
    if (!buf_) fail("aligned_alloc");
    if (tls.side != RelayTls::Side::kNone) ctx_ = relay_tls_context(tls);
  }

  std::function<void(int fd, uint32_t generation)> watch;
  std::function<void(int fd)> forget;

  // Accepts one connection on lfd, dials the target and sets up both hops (TLS, HTTP/2); then
  // relays what the handshake's read-ahead already took off a TLS socket, which no readiness
  // would report.
  void accept_one(int lfd) {
    int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    int u = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in ta = to_.sa();
    if (u >= 0) set_timeouts(u, io_timeout_);
    if (u < 0 || ::connect(u, reinterpret_cast<sockaddr*>(&ta), sizeof ta) != 0) {
      ::close(c);
      if (u >= 0) ::close(u);
      return;
    }
    set_timeouts(c, io_timeout_);
    set_nodelay(c);
    set_nodelay(u);
    auto hc = std::make_unique<Hop>();
    auto hu = std::make_unique<Hop>();
    hc->partner = u;
    hu->partner = c;
    hc->generation = hu->generation = ++generation_;
    try {
      if (tls_.side == RelayTls::Side::kListen) start_tls(ctx_.get(), c, *hc, true, io_timeout_);
      if (tls_.side == RelayTls::Side::kTo) start_tls(ctx_.get(), u, *hu, false, io_timeout_);
      if (tls_.h2 && tls_.side == RelayTls::Side::kListen) h2_start(*hc, c, true, "", io_timeout_);
      if (tls_.h2 && tls_.side == RelayTls::Side::kTo) {
        h2_start(*hu, u, false, to_.ip + ":" + std::to_string(to_.port), io_timeout_);
      }
    } catch (const Failure& e) {
      std::fprintf(stderr, "sockmesh-loadgen relay: %s\n", e.what());
      hc.reset();
      hu.reset();
      ::close(c);
      ::close(u);
      return;
    }
    hops_[c] = std::move(hc);
    hops_[u] = std::move(hu);
    for (int f : {c, u}) watch(f, generation_);
    for (int f : {c, u}) {
      Hop& hop = *hops_[f];
      if (hop.ssl != nullptr && SSL_has_pending(hop.ssl) != 0) {
        readable(f, generation_);
        break;
      }
    }
  }

  // fd is readable: its bytes go on to its partner. A stale report (fd closed, or its number
  // reused by a later connection) is ignored.
  void readable(int fd, uint32_t generation) {
    auto it = hops_.find(fd);
    if (it == hops_.end() || it->second->generation != generation) return;
    auto other = hops_.find(it->second->partner);
    if (other == hops_.end()) return;
    bool open = false;
    try {
      open = relay_readable(fd, *it->second, *other->second, buf_.get(), kChunk, io_timeout_);
    } catch (const Failure& e) {
      std::fprintf(stderr, "sockmesh-loadgen relay: %s\n", e.what());
      open = false;
    }
    if (!open) drop(fd);
  }

 private:
  void drop(int fd) {
    auto it = hops_.find(fd);
    if (it == hops_.end()) return;
    int other = it->second->partner;
    for (int f : {fd, other}) {
      forget(f);
      hops_.erase(f);  // frees the TLS state before the descriptor goes
      ::close(f);
    }
  }

  Addr to_;
  double io_timeout_;
  RelayTls tls_;
  SslCtx ctx_{nullptr, &SSL_CTX_free};
  std::map<int, std::unique_ptr<Hop>> hops_;
  uint32_t generation_ = 0;
  std::unique_ptr<uint8_t, decltype(&std::free)> buf_;
};

Fd relay_listener(const Addr& listen_addr) {
  Fd lfd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (lfd.get() < 0) fail("socket");
  int one = 1;
  setsockopt(lfd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in la = listen_addr.sa();
  if (::bind(lfd.get(), reinterpret_cast<sockaddr*>(&la), sizeof la) != 0) fail("bind");
  if (::listen(lfd.get(), 4096) != 0) fail("listen");
  std::printf("{\"listening\": \"%s:%u\"}\n", listen_addr.ip.c_str(), listen_addr.port);
  std::fflush(stdout);
  return lfd;
}

// The relay's own loop: one epoll set, level-triggered, each socket registered once.
int run_relay_epoll(const Addr& listen_addr, double max_seconds, RelayTable& table) {
  Fd lfd = relay_listener(listen_addr);
  Fd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (ep.get() < 0) fail("epoll_create1");
  constexpr uint64_t kListener = ~0ull;
  epoll_event lev{};
  lev.events = EPOLLIN;
  lev.data.u64 = kListener;
  if (::epoll_ctl(ep.get(), EPOLL_CTL_ADD, lfd.get(), &lev) != 0) fail("epoll_ctl");
  table.watch = [&](int fd, uint32_t generation) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = (static_cast<uint64_t>(generation) << 32) | static_cast<uint32_t>(fd);
    ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, fd, &ev);
  };
  table.forget = [&](int fd) { ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, fd, nullptr); };
  epoll_event events[64];
  auto deadline = Clock::now() + std::chrono::duration<double>(max_seconds);
  while (Clock::now() < deadline) {
    int n = ::epoll_wait(ep.get(), events, 64, 500);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kListener) {
        table.accept_one(lfd.get());
      } else {
        table.readable(static_cast<int>(events[i].data.u64 & 0xffffffffu),
                       static_cast<uint32_t>(events[i].data.u64 >> 32));
      }
    }
  }
  return 0;
}

// --loop asio: the same relay woken by Boost.Asio's reactor on one thread, each wait for
// readability an async_wait (as the proxy waits for an app's socket), so that a row of the
// benchmark can show what the event framework costs a message. asio re-arms the socket in epoll
// (epoll_ctl) for every such wait; the proxy reads its TLS socket through asio instead, which
// does not, so on the TLS side this loop pays one epoll_ctl per message more than the proxy.
int run_relay_asio(const Addr& listen_addr, double max_seconds, RelayTable& table) {
  namespace asio = boost::asio;
  asio::io_context io(1);
  Fd lfd = relay_listener(listen_addr);
  asio::posix::stream_descriptor listener(io, lfd.get());
  std::map<int, std::unique_ptr<asio::posix::stream_descriptor>> watched;
  std::function<void(int, uint32_t)> wait = [&](int fd, uint32_t generation) {
    auto it = watched.find(fd);
    if (it == watched.end()) return;
    it->second->async_wait(asio::posix::descriptor_base::wait_read,
                           [&, fd, generation](const boost::system::error_code& ec) {
                             if (ec) return;  // forgotten: the fd may already be another's
                             table.readable(fd, generation);
                             wait(fd, generation);  // no-op once it was dropped
                           });
  };
  table.watch = [&](int fd, uint32_t generation) {
    watched[fd] = std::make_unique<asio::posix::stream_descriptor>(io, fd);
    wait(fd, generation);
  };
  table.forget = [&](int fd) {
    auto it = watched.find(fd);
    if (it == watched.end()) return;
    it->second->release();  // cancels its wait, deregisters; the table closes the fd
    watched.erase(it);
  };
  std::function<void()> accept = [&] {
    listener.async_wait(asio::posix::descriptor_base::wait_read,
                        [&](const boost::system::error_code& ec) {
                          if (ec) return;
                          table.accept_one(lfd.get());
                          accept();
                        });
  };
  accept();
  io.run_for(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(max_seconds)));
  for (auto& [fd, d] : watched) d->release();
  listener.release();
  return 0;
}

int run_relay(const Addr& listen_addr, const Addr& to, double max_seconds, double io_timeout,
              const RelayTls& tls, const std::string& loop) {
  RelayTable table(to, io_timeout, tls);
  if (loop == "asio") return run_relay_asio(listen_addr, max_seconds, table);
  return run_relay_epoll(listen_addr, max_seconds, table);
}

// ---------------------------------------------------------------------------------------------
// Client

struct ClientOptions {
  std::string mode;
  std::string via = "tcp";
  std::optional<Addr> proxy;
  Addr target;
  std::string bind_ip;
  uint64_t bytes = 1ull << 30;
  int streams = 1;
  size_t size = 1024;
  int iters = 10000;
  int warmup = 1000;
  int conns = 1000;
  double timeout = 60;
  double hold_seconds = 120;
  double seconds = 20;  // churn: the time bound, beside --conns
  double pause_ms = 0;  // connect: the pause between two samples
  uint64_t frames = 1000000;              // h2frames
  std::string tls_cert, tls_key, tls_ca;  // h2frames: the client's certificate and the CA
};

// Opens a connection to the target: directly, or through a SOCKS5 or HTTP/1 CONNECT proxy.
Fd open_tunnel(const ClientOptions& o) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) fail("socket");
  set_timeouts(fd.get(), o.timeout);
  set_nodelay(fd.get());
  if (!o.bind_ip.empty()) {
    Addr b{o.bind_ip, 0};
    sockaddr_in bsa = b.sa();
    // The port is picked at connect(), by the whole 4-tuple: bind() alone would need a port no
    // other socket holds, and many short tunnels leave tens of thousands in TIME_WAIT.
    int one = 1;
    setsockopt(fd.get(), SOL_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&bsa), sizeof bsa) != 0) fail("bind " + o.bind_ip);
  }
  const Addr& first = (o.via == "tcp") ? o.target : *o.proxy;
  sockaddr_in sa = first.sa();
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    fail("connect " + first.ip + ":" + std::to_string(first.port));
  }
  if (o.via == "socks5") {
    write_all(fd.get(), "\x05\x01\x00", 3);
    uint8_t m[2];
    if (!read_exact(fd.get(), m, 2) || m[0] != 5 || m[1] != 0) {
      errno = 0;
      fail("SOCKS5: no-auth method refused");
    }
    sockaddr_in t = o.target.sa();
    uint8_t req[10] = {5, 1, 0, 1};
    std::memcpy(req + 4, &t.sin_addr, 4);
    std::memcpy(req + 8, &t.sin_port, 2);
    write_all(fd.get(), req, sizeof req);
    uint8_t rep[4];
    if (!read_exact(fd.get(), rep, 4)) {
      errno = 0;
      fail("SOCKS5: no reply");
    }
    if (rep[1] != 0) {
      errno = 0;
      fail("SOCKS5: CONNECT refused, reply " + std::to_string(rep[1]));
    }
    size_t rest = rep[3] == 1 ? 6 : rep[3] == 4 ? 18 : 0;
    if (rep[3] == 3) {
      uint8_t len;
      read_exact(fd.get(), &len, 1);
      rest = len + 2u;
    }
    uint8_t skip[300];
    read_exact(fd.get(), skip, rest);
  } else if (o.via == "http") {
    std::string hp = o.target.ip + ":" + std::to_string(o.target.port);
    std::string req = "CONNECT " + hp + " HTTP/1.1\r\nHost: " + hp + "\r\n\r\n";
    write_all(fd.get(), req.data(), req.size());
    std::string resp;
    while (resp.size() < 8192 && resp.find("\r\n\r\n") == std::string::npos) {
      char c;
      if (!read_exact(fd.get(), &c, 1)) {
        errno = 0;
        fail("HTTP CONNECT: connection closed");
      }
      resp.push_back(c);
    }
    auto sp = resp.find(' ');
    if (sp == std::string::npos || resp.compare(sp + 1, 1, "2") != 0) {
      errno = 0;
      fail("HTTP CONNECT refused: " + resp.substr(0, resp.find('\r')));
    }
  } else if (o.via != "tcp") {
    errno = 0;
    fail("unknown --via " + o.via);
  }
  return fd;
}

void send_header(int fd, uint8_t op, uint64_t arg) {
  uint8_t hdr[16] = {'S', 'M', 'L', 'G', op};
  put_u64(hdr + 8, arg);
  write_all(fd, hdr, sizeof hdr);
}

int run_throughput(const ClientOptions& o) {
  int k = std::max(1, o.streams);
  uint64_t per_stream = o.bytes / static_cast<uint64_t>(k);
  std::vector<Fd> fds;
  for (int i = 0; i < k; ++i) {
    fds.push_back(open_tunnel(o));
    send_header(fds.back().get(), kOpSink, per_stream);
  }
  std::barrier sync(k + 1);
  std::vector<double> ends(k, 0);
  std::vector<std::string> errors(k);
  static std::vector<uint8_t> payload = [] {
    std::vector<uint8_t> p(kChunk);
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i * 131 + 7);
    return p;
  }();
  auto deadline = Clock::now() + std::chrono::duration<double>(o.timeout);
  Clock::time_point start;
  std::vector<std::thread> threads;
  for (int i = 0; i < k; ++i) {
    threads.emplace_back([&, i] {
      sync.arrive_and_wait();
      try {
        int fd = fds[i].get();
        uint64_t left = per_stream;
        while (left > 0) {
          if (Clock::now() > deadline) throw Failure("deadline passed");
          size_t n = std::min<uint64_t>(left, payload.size());
          write_all(fd, payload.data(), n);
          left -= n;
        }
        uint8_t ack[8];
        if (!read_exact(fd, ack, 8) || get_u64(ack) != per_stream) throw Failure("bad ack");
        ends[i] = std::chrono::duration<double>(Clock::now() - start).count();
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  start = Clock::now();
  sync.arrive_and_wait();
  for (auto& t : threads) t.join();
  for (int i = 0; i < k; ++i) {
    if (!errors[i].empty()) {
      std::fprintf(stderr, "stream %d: %s\n", i, errors[i].c_str());
      return 1;
    }
  }
  double wall = *std::max_element(ends.begin(), ends.end());
  double total = static_cast<double>(per_stream) * k;
  std::printf("{\"mode\": \"throughput\", \"streams\": %d, \"bytes\": %.0f, \"seconds\": %.6f, "
              "\"gbps\": %.4f, \"slowest_stream_gbps\": %.4f, \"fastest_stream_gbps\": %.4f}\n",
              k, total, wall, total * 8 / wall / 1e9,
              static_cast<double>(per_stream) * 8 / wall / 1e9,
              static_cast<double>(per_stream) * 8 / *std::min_element(ends.begin(), ends.end()) / 1e9);
  return 0;
}

int run_pingpong(const ClientOptions& o) {
  if (o.size == 0 || o.size > kMaxMessage) {
    errno = 0;
    fail("bad --size");
  }
  Fd fd = open_tunnel(o);
  send_header(fd.get(), kOpEcho, o.size);
  std::vector<uint8_t> out(o.size, 'x'), in(o.size);
  std::vector<double> us;
  us.reserve(o.iters);
  auto deadline = Clock::now() + std::chrono::duration<double>(o.timeout);
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    if (Clock::now() > deadline) {
      errno = 0;
      fail("deadline passed after " + std::to_string(i) + " round trips");
    }
    out[0] = static_cast<uint8_t>(i);
    auto t0 = Clock::now();
    write_all(fd.get(), out.data(), out.size());
    if (!read_exact(fd.get(), in.data(), in.size())) {
      errno = 0;
      fail("echo closed");
    }
    auto t1 = Clock::now();
    if (in[0] != out[0]) {
      errno = 0;
      fail("echo mismatch");
    }
    if (i >= o.warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) {
    size_t idx = static_cast<size_t>(p * static_cast<double>(us.size() - 1) + 0.5);
    return us[std::min(idx, us.size() - 1)];
  };
  double sum = 0;
  for (double v : us) sum += v;
  std::printf("{\"mode\": \"pingpong\", \"size\": %zu, \"iters\": %zu, \"p50_us\": %.2f, "
              "\"p90_us\": %.2f, \"p99_us\": %.2f, \"mean_us\": %.2f, \"min_us\": %.2f, "
              "\"max_us\": %.2f}\n",
              o.size, us.size(), pct(0.5), pct(0.9), pct(0.99), sum / static_cast<double>(us.size()),
              us.front(), us.back());
  return 0;
}

// Connect: --conns new connections one after another, each timed from just before connect() to
// the first byte of the echo of one --size message written right after the connection is up
// (so through a mesh: the capture, the proxy's handshakes and CONNECT, and the first relay), with
// --pause-ms between them (a pool idle timeout can then empty the proxy's pool between samples).
int run_connect(const ClientOptions& o) {
  if (o.size == 0 || o.size > kMaxMessage || o.conns <= 0) {
    errno = 0;
    fail("bad --size or --conns");
  }
  std::vector<uint8_t> out(o.size, 'n'), in(o.size);
  std::vector<double> us;
  us.reserve(o.conns);
  auto deadline = Clock::now() + std::chrono::duration<double>(o.timeout);
  for (int i = 0; i < o.conns; ++i) {
    if (Clock::now() > deadline) {
      errno = 0;
      fail("deadline passed after " + std::to_string(i) + " connections");
    }
    if (i > 0 && o.pause_ms > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.pause_ms));
    }
    out[0] = static_cast<uint8_t>(i);
    auto t0 = Clock::now();
    Fd fd = open_tunnel(o);
    send_header(fd.get(), kOpEcho, o.size);
    write_all(fd.get(), out.data(), out.size());
    if (!read_exact(fd.get(), in.data(), 1)) {
      errno = 0;
      fail("echo closed before its first byte");
    }
    auto t1 = Clock::now();
    if (!read_exact(fd.get(), in.data() + 1, in.size() - 1) || in != out) {
      errno = 0;
      fail("echo closed or differs");
    }
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::vector<double> sorted = us;
  std::sort(sorted.begin(), sorted.end());
  auto pct = [&](double p) {
    size_t idx = static_cast<size_t>(p * static_cast<double>(sorted.size() - 1) + 0.5);
    return sorted[std::min(idx, sorted.size() - 1)];
  };
  std::printf("{\"mode\": \"connect\", \"size\": %zu, \"conns\": %zu, \"p50_us\": %.2f, "
              "\"p99_us\": %.2f, \"min_us\": %.2f, \"max_us\": %.2f, \"first_us\": %.2f}\n",
              o.size, sorted.size(), pct(0.5), pct(0.99), sorted.front(), sorted.back(), us.front());
  return 0;
}

// Churn: --streams workers open tunnels one after another, each for one echo of --size bytes,
// until --conns tunnels have been tried or --seconds have passed. A failed tunnel is counted and
// the worker goes on, so that a soak reports how many failed rather than stopping at the first.
int run_churn(const ClientOptions& o) {
  if (o.size == 0 || o.size > kMaxMessage) {
    errno = 0;
    fail("bad --size");
  }
  std::atomic<int> started{0};
  std::atomic<uint64_t> ok{0}, failed{0};
  std::mutex mu;
  std::string first_error;
  auto t0 = Clock::now();
  auto deadline = t0 + std::chrono::duration<double>(o.seconds);
  auto worker = [&] {
    std::vector<uint8_t> out(o.size, 'c'), in(o.size);
    while (Clock::now() < deadline && started.fetch_add(1) < o.conns) {
      try {
        Fd fd = open_tunnel(o);
        send_header(fd.get(), kOpEcho, o.size);
        out[0] = static_cast<uint8_t>(ok.load());
        write_all(fd.get(), out.data(), out.size());
        if (!read_exact(fd.get(), in.data(), in.size()) || in != out) {
          errno = 0;
          fail("echo closed or differs");
        }
        ok.fetch_add(1);
      } catch (const Failure& e) {
        failed.fetch_add(1);
        std::lock_guard lock(mu);
        if (first_error.empty()) first_error = e.what();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < std::max(1, o.streams); ++i) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::string err;
  for (char c : first_error) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    if (c == '"' || c == '\\') err += '\\';
    err += c;
  }
  std::printf("{\"mode\": \"churn\", \"conns\": %llu, \"failures\": %llu, \"seconds\": %.3f, "
              "\"conns_per_s\": %.1f, \"first_error\": \"%s\"}\n",
              static_cast<unsigned long long>(ok.load()),
              static_cast<unsigned long long>(failed.load()), secs,
              static_cast<double>(ok.load()) / secs, err.c_str());
  return 0;  // failures are in the report: a soak counts them instead of stopping
}

// Opens --conns tunnels, checks each reaches the server, prints a line, then holds them until
// stdin has a line or closes (or --hold-seconds pass).
int run_hold(const ClientOptions& o) {
  std::vector<Fd> fds;
  fds.reserve(o.conns);
  auto t0 = Clock::now();
  auto deadline = t0 + std::chrono::duration<double>(o.timeout);
  for (int i = 0; i < o.conns; ++i) {
    if (Clock::now() > deadline) {
      errno = 0;
      fail("deadline passed after " + std::to_string(i) + " connections");
    }
    fds.push_back(open_tunnel(o));
    send_header(fds.back().get(), kOpHold, 0);
    char c;
    if (!read_exact(fds.back().get(), &c, 1) || c != 'H') {
      errno = 0;
      fail("hold: no answer on connection " + std::to_string(i));
    }
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("{\"mode\": \"hold\", \"conns\": %zu, \"open_seconds\": %.3f}\n", fds.size(), secs);
  std::fflush(stdout);
  pollfd p{0, POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(o.hold_seconds * 1000));
  return 0;
}

// ---------------------------------------------------------------------------------------------
// h2frames: one CONNECT stream over HTTP/2 and mutual TLS 1.3, straight to an HBONE-style server
// (sockmesh's inbound, nghttpx -s), carrying many small DATA frames to a sink behind it. What it
// measures is the server's cost per frame, so the client frames by hand (a template copied per
// frame, 64 KiB of frames per SSL_write) and spends next to nothing on each. It keeps the
// server's flow-control windows and opens its own as far as HTTP/2 allows.

constexpr uint8_t kH2Data = 0x0, kH2Headers = 0x1, kH2RstStream = 0x3, kH2Settings = 0x4,
                  kH2Ping = 0x6, kH2Goaway = 0x7, kH2WindowUpdate = 0x8;
constexpr uint8_t kH2EndStream = 0x1, kH2Ack = 0x1, kH2EndHeaders = 0x4, kH2Padded = 0x8;
constexpr uint32_t kH2MaxWindow = 0x7fffffff;

void put_h2_frame(std::vector<uint8_t>& out, uint8_t type, uint8_t flags, uint32_t stream,
                  const uint8_t* payload, size_t len) {
  uint8_t hd[9] = {static_cast<uint8_t>(len >> 16),
                   static_cast<uint8_t>(len >> 8),
                   static_cast<uint8_t>(len),
                   type,
                   flags,
                   static_cast<uint8_t>(stream >> 24),
                   static_cast<uint8_t>(stream >> 16),
                   static_cast<uint8_t>(stream >> 8),
                   static_cast<uint8_t>(stream)};
  out.insert(out.end(), hd, hd + 9);
  if (len > 0) out.insert(out.end(), payload, payload + len);
}

uint32_t get_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

class H2FramesClient {
 public:
  static constexpr uint32_t kStream = 1;

  H2FramesClient(SSL_CTX* ctx, Fd fd, double timeout) : fd_(std::move(fd)), timeout_(timeout) {
    start_tls(ctx, fd_.get(), hop_, false, timeout);
    const unsigned char* alpn = nullptr;
    unsigned alpn_len = 0;
    SSL_get0_alpn_selected(hop_.ssl, &alpn, &alpn_len);
    if (alpn_len != 2 || std::memcmp(alpn, "h2", 2) != 0) {
      errno = 0;
      fail("h2frames: the server did not select ALPN h2");
    }
    std::vector<uint8_t> out;
    static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    out.insert(out.end(), kPreface, kPreface + sizeof kPreface - 1);
    std::vector<uint8_t> settings;
    auto setting = [&](uint16_t id, uint32_t value) {
      uint8_t entry[6] = {static_cast<uint8_t>(id >> 8), static_cast<uint8_t>(id)};
      put_be32(entry + 2, value);
      settings.insert(settings.end(), entry, entry + 6);
    };
    setting(0x2, 0);             // ENABLE_PUSH
    setting(0x4, kH2MaxWindow);  // INITIAL_WINDOW_SIZE
    put_h2_frame(out, kH2Settings, 0, 0, settings.data(), settings.size());
    uint8_t inc[4];
    put_be32(inc, kH2MaxWindow - 65535);
    put_h2_frame(out, kH2WindowUpdate, 0, 0, inc, sizeof inc);
    write(out);
  }

  // CONNECT authority; waits for a 200.
  void connect(const std::string& authority) {
    std::vector<uint8_t> block;
    // Literal header fields without indexing, names from the static table (:method is index 2,
    // :authority 1), no Huffman coding: the simplest valid HPACK.
    auto literal = [&](uint8_t name_index, const std::string& value) {
      block.push_back(name_index);
      block.push_back(static_cast<uint8_t>(value.size()));  // < 127
      block.insert(block.end(), value.begin(), value.end());
    };
    literal(2, "CONNECT");
    literal(1, authority);
    std::vector<uint8_t> out;
    put_h2_frame(out, kH2Headers, kH2EndHeaders, kStream, block.data(), block.size());
    write(out);
    wait_for([&] { return status_ != 0; }, "the answer to CONNECT");
    if (status_ != 200) {
      errno = 0;
      fail("h2frames: CONNECT answered " + std::to_string(status_));
    }
  }

  // Sends `frames` DATA frames of `size` bytes (template bytes: the sink only counts them),
  // within the server's windows.
  void send_frames(uint64_t frames, size_t size, const uint8_t* first = nullptr) {
    std::vector<uint8_t> tmpl;
    std::vector<uint8_t> payload(size, 'x');
    put_h2_frame(tmpl, kH2Data, 0, kStream, first != nullptr ? first : payload.data(), size);
    const uint64_t per_write = std::max<uint64_t>(1, (64 * 1024) / tmpl.size());
    std::vector<uint8_t> out;
    out.reserve(per_write * tmpl.size());
    auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    while (frames > 0) {
      if (Clock::now() > deadline) {
        errno = ETIMEDOUT;
        fail("h2frames: sending frames");
      }
      int64_t room = std::min(conn_window_, stream_window_);
      if (room < static_cast<int64_t>(size)) {
        read_frames(100);  // wait for WINDOW_UPDATE
        continue;
      }
      uint64_t n =
          std::min({frames, per_write, static_cast<uint64_t>(room) / std::max<size_t>(size, 1)});
      out.clear();
      for (uint64_t i = 0; i < n; ++i) out.insert(out.end(), tmpl.begin(), tmpl.end());
      write(out);
      conn_window_ -= static_cast<int64_t>(n * size);
      stream_window_ -= static_cast<int64_t>(n * size);
      frames -= n;
      read_frames(0);
    }
  }

  // Waits for `n` bytes of DATA from the server and returns them.
  std::vector<uint8_t> receive(size_t n) {
    wait_for([&] { return received_.size() >= n; }, "the sink's answer");
    return std::vector<uint8_t>(received_.begin(), received_.begin() + static_cast<long>(n));
  }

 private:
  static void put_be32(uint8_t* p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 24);
    p[1] = static_cast<uint8_t>(v >> 16);
    p[2] = static_cast<uint8_t>(v >> 8);
    p[3] = static_cast<uint8_t>(v);
  }

  void write(const std::vector<uint8_t>& plain) {
    size_t written = 0;
    if (SSL_write_ex(hop_.ssl, plain.data(), plain.size(), &written) != 1 ||
        written != plain.size()) {
      tls_fail("h2frames: SSL_write");
    }
    flush_tls(fd_.get(), hop_, timeout_);
  }

  template <typename Pred>
  void wait_for(Pred done, const char* what) {
    auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    while (!done()) {
      if (Clock::now() > deadline) {
        errno = ETIMEDOUT;
        fail(std::string("h2frames: waiting for ") + what);
      }
      read_frames(100);
    }
  }

  // Reads and handles what the server sent, waiting up to wait_ms for the first of it.
  void read_frames(int wait_ms) {
    if (SSL_pending(hop_.ssl) == 0) {
      pollfd pf{fd_.get(), POLLIN, 0};
      if (::poll(&pf, 1, wait_ms) <= 0) return;
    }
    uint8_t buf[64 * 1024];
    for (;;) {
      size_t got = 0;
      ERR_clear_error();
      int rv = SSL_read_ex(hop_.ssl, buf, sizeof buf, &got);
      if (rv == 1) {
        in_.insert(in_.end(), buf, buf + got);
        continue;
      }
      int e = SSL_get_error(hop_.ssl, rv);
      if (e == SSL_ERROR_WANT_READ) break;
      if (e == SSL_ERROR_ZERO_RETURN) {
        errno = 0;
        fail("h2frames: the server closed the connection");
      }
      tls_fail("h2frames: SSL_read");
    }
    std::vector<uint8_t> reply;
    size_t pos = 0;
    while (in_.size() - pos >= 9) {
      const uint8_t* h = in_.data() + pos;
      size_t len = (size_t{h[0]} << 16) | (size_t{h[1]} << 8) | h[2];
      if (in_.size() - pos < 9 + len) break;
      on_frame(h[3], h[4], get_be32(h + 5) & kH2MaxWindow, h + 9, len, reply);
      pos += 9 + len;
    }
    in_.erase(in_.begin(), in_.begin() + static_cast<long>(pos));
    if (!reply.empty()) write(reply);
  }

  void on_frame(uint8_t type, uint8_t flags, uint32_t stream, const uint8_t* p, size_t len,
                std::vector<uint8_t>& reply) {
    if ((type == kH2Data || type == kH2Headers) && (flags & kH2Padded) != 0 && len > 0) {
      size_t pad = p[0];
      p += 1;
      len = len - 1 >= pad ? len - 1 - pad : 0;
    }
    switch (type) {
      case kH2Data:
        if (stream == kStream) received_.insert(received_.end(), p, p + len);
        break;
      case kH2Headers:
        // :status 200 is static table entry 8, which every encoder sends indexed (0x88).
        if (stream == kStream) status_ = len > 0 && p[0] == 0x88 ? 200 : -1;
        break;
      case kH2RstStream:
        errno = 0;
        fail("h2frames: RST_STREAM " + std::to_string(len >= 4 ? get_be32(p) : 0));
      case kH2Settings:
        if ((flags & kH2Ack) != 0) break;
        for (size_t i = 0; i + 6 <= len; i += 6) {
          if (p[i] == 0 && p[i + 1] == 0x4) {
            int64_t value = get_be32(p + i + 2);
            stream_window_ += value - initial_window_;
            initial_window_ = value;
          }
        }
        put_h2_frame(reply, kH2Settings, kH2Ack, 0, nullptr, 0);
        break;
      case kH2Ping:
        if ((flags & kH2Ack) == 0) put_h2_frame(reply, kH2Ping, kH2Ack, 0, p, len);
        break;
      case kH2Goaway:
        errno = 0;
        fail("h2frames: GOAWAY " + std::to_string(len >= 8 ? get_be32(p + 4) : 0));
      case kH2WindowUpdate:
        if (len >= 4) {
          int64_t inc = get_be32(p) & kH2MaxWindow;
          if (stream == 0) {
            conn_window_ += inc;
          } else if (stream == kStream) {
            stream_window_ += inc;
          }
        }
        break;
      default:
        break;
    }
  }

  Fd fd_;
  Hop hop_;
  double timeout_;
  std::vector<uint8_t> in_;  // plaintext not yet parsed into frames
  std::vector<uint8_t> received_;
  int64_t conn_window_ = 65535;
  int64_t stream_window_ = 65535;
  int64_t initial_window_ = 65535;
  int status_ = 0;
};

int run_h2frames(const ClientOptions& o) {
  if (o.via != "h2" || !o.proxy) throw Failure("h2frames needs --via h2 --proxy IP:PORT");
  if (o.tls_cert.empty()) throw Failure("h2frames needs --tls CERT,KEY,CA");
  if (o.size == 0 || o.frames == 0) throw Failure("h2frames: --size and --frames must be > 0");
  SslCtx ctx = relay_tls_context(RelayTls{RelayTls::Side::kTo, o.tls_cert, o.tls_key, o.tls_ca});
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof kAlpn);
  ClientOptions plain = o;
  plain.via = "tcp";
  plain.target = *o.proxy;  // the TCP connection goes to the HTTP/2 server
  H2FramesClient c(ctx.get(), open_tunnel(plain), o.timeout);
  c.connect(o.target.ip + ":" + std::to_string(o.target.port));
  uint64_t total = o.frames * o.size;
  uint8_t hdr[16] = {'S', 'M', 'L', 'G', kOpSink};
  put_u64(hdr + 8, total);
  c.send_frames(1, sizeof hdr, hdr);
  auto t0 = Clock::now();
  c.send_frames(o.frames, o.size);
  auto ack = c.receive(8);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (get_u64(ack.data()) != total) {
    errno = 0;
    fail("h2frames: the sink counted " + std::to_string(get_u64(ack.data())) + " of " +
         std::to_string(total) + " bytes");
  }
  std::printf(
      "{\"mode\": \"h2frames\", \"frames\": %llu, \"size\": %zu, \"seconds\": %.6f, "
      "\"frames_per_s\": %.0f, \"mbps\": %.3f}\n",
      static_cast<unsigned long long>(o.frames), o.size, secs, static_cast<double>(o.frames) / secs,
      static_cast<double>(total) * 8 / secs / 1e6);
  return 0;
}

uint64_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  if (unit == "K" || unit == "KiB") v *= 1024;
  else if (unit == "M" || unit == "MiB") v *= 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") v *= 1024.0 * 1024 * 1024;
  else if (!unit.empty()) throw Failure("bad size " + s);
  return static_cast<uint64_t>(v);
}

void usage() {
  std::fprintf(
      stderr,
      "usage: sockmesh-loadgen server --listen IP:PORT [--max-seconds S] [--timeout S]\n"
      "           [--transparent yes] [--mark N] [--register PIN_ROOT,POD_IP]\n"
      "       sockmesh-loadgen relay --listen IP:PORT --to IP:PORT [--max-seconds S]\n"
      "           [--tls-listen CERT,KEY,CA | --tls-to CERT,KEY,CA [--h2 yes]]\n"
      "           [--loop epoll|asio]\n"
      "       sockmesh-loadgen client --mode throughput|pingpong|hold|churn|connect --target "
      "IP:PORT\n"
      "           [--via tcp|socks5|http --proxy IP:PORT] [--bind IP] [--timeout S]\n"
      "           throughput: [--bytes N[K|M|G]] [--streams K]\n"
      "           pingpong:   [--size B] [--iters M] [--warmup W]\n"
      "           hold:       [--conns C] [--hold-seconds S]\n"
      "           churn:      [--conns C] [--streams K] [--size B] [--seconds S]\n"
      "           connect:    [--conns C] [--size B] [--pause-ms P] (connect() -> first echoed "
      "byte)\n"
      "       sockmesh-loadgen client --mode h2frames --via h2 --proxy IP:PORT\n"
      "           --tls CERT,KEY,CA --target IP:PORT [--frames N] [--size B]\n"
      "       --netns-only yes: non-loopback addresses too, only outside the initial netns\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  std::string role = argv[1];
  std::map<std::string, std::string> flags;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || i + 1 >= argc) {
      usage();
      return 2;
    }
    flags[a.substr(2)] = argv[++i];
  }
  auto get = [&](const std::string& k, const std::string& def) {
    auto it = flags.find(k);
    return it == flags.end() ? def : it->second;
  };
  // Many connections in hold mode: raise the descriptor limit as far as allowed.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  try {
    if (get("netns-only", "no") == "yes") {
      // The initial netns is PID 1's; where that is unreadable (a container without
      // CAP_SYS_PTRACE), the launcher's: the caller must have moved us into another netns.
      struct stat self{}, init{};
      std::string other = "/proc/1/ns/net";
      if (stat(other.c_str(), &init) != 0) {
        other = "/proc/" + std::to_string(getppid()) + "/ns/net";
        if (stat(other.c_str(), &init) != 0) fail("--netns-only: cannot read " + other);
      }
      if (stat("/proc/self/ns/net", &self) != 0) fail("--netns-only: cannot read our netns");
      if (self.st_ino == init.st_ino && self.st_dev == init.st_dev) {
        errno = 0;
        fail("--netns-only: this process is in the network namespace of " + other);
      }
      g_netns_only = true;
    }
    if (role == "server") {
      ServerOptions so;
      so.transparent = get("transparent", "no") == "yes";
      so.mark = static_cast<uint32_t>(std::stoul(get("mark", "0"), nullptr, 0));
      if (auto r = get("register", ""); !r.empty()) {
        auto comma = r.find(',');
        if (comma == std::string::npos) throw Failure("--register PIN_ROOT,POD_IP");
        so.register_root = r.substr(0, comma);
        so.register_ip = r.substr(comma + 1);
      }
      return run_server(parse_addr(get("listen", "127.0.0.1:9000")),
                        std::stod(get("max-seconds", "1800")), std::stod(get("timeout", "300")),
                        so);
    }
    if (role == "relay") {
      if (!flags.count("listen") || !flags.count("to")) throw Failure("relay needs --listen and --to");
      RelayTls tls;
      if (flags.count("tls-listen") || flags.count("tls-to")) {
        if (flags.count("tls-listen") && flags.count("tls-to")) {
          throw Failure("relay: --tls-listen or --tls-to, not both");
        }
        tls.side = flags.count("tls-listen") ? RelayTls::Side::kListen : RelayTls::Side::kTo;
        // CERT,KEY,CA
        std::string files = flags.count("tls-listen") ? flags["tls-listen"] : flags["tls-to"];
        auto c1 = files.find(',');
        auto c2 = c1 == std::string::npos ? c1 : files.find(',', c1 + 1);
        if (c2 == std::string::npos) throw Failure("relay: --tls-listen/--tls-to CERT,KEY,CA");
        tls.cert = files.substr(0, c1);
        tls.key = files.substr(c1 + 1, c2 - c1 - 1);
        tls.ca = files.substr(c2 + 1);
      }
      tls.h2 = get("h2", "no") == "yes";
      if (tls.h2 && tls.side == RelayTls::Side::kNone) {
        throw Failure("relay: --h2 yes needs --tls-listen or --tls-to");
      }
      std::string loop = get("loop", "epoll");
      if (loop != "epoll" && loop != "asio") throw Failure("relay: --loop epoll or asio");
      return run_relay(parse_addr(flags["listen"]), parse_addr(flags["to"]),
                       std::stod(get("max-seconds", "1800")), std::stod(get("timeout", "300")), tls,
                       loop);
    }
    if (role != "client") {
      usage();
      return 2;
    }
    ClientOptions o;
    o.mode = get("mode", "throughput");
    o.via = get("via", "tcp");
    if (flags.count("proxy")) o.proxy = parse_addr(flags["proxy"]);
    if (o.via != "tcp" && !o.proxy) throw Failure("--via " + o.via + " needs --proxy");
    o.target = parse_addr(get("target", "127.0.0.1:9000"));
    o.bind_ip = get("bind", "");
    o.bytes = parse_size(get("bytes", "1G"));
    o.streams = std::stoi(get("streams", "1"));
    o.size = parse_size(get("size", "1024"));
    o.iters = std::stoi(get("iters", "10000"));
    o.warmup = std::stoi(get("warmup", "1000"));
    o.conns = std::stoi(get("conns", "1000"));
    o.timeout = std::stod(get("timeout", "120"));
    o.hold_seconds = std::stod(get("hold-seconds", "120"));
    o.seconds = std::stod(get("seconds", "20"));
    o.pause_ms = std::stod(get("pause-ms", "0"));
    o.frames = parse_size(get("frames", "1000000"));
    if (auto t = get("tls", ""); !t.empty()) {
      auto c1 = t.find(',');
      auto c2 = c1 == std::string::npos ? c1 : t.find(',', c1 + 1);
      if (c2 == std::string::npos) throw Failure("--tls CERT,KEY,CA");
      o.tls_cert = t.substr(0, c1);
      o.tls_key = t.substr(c1 + 1, c2 - c1 - 1);
      o.tls_ca = t.substr(c2 + 1);
    }
    if (o.mode == "throughput") return run_throughput(o);
    if (o.mode == "pingpong") return run_pingpong(o);
    if (o.mode == "hold") return run_hold(o);
    if (o.mode == "churn") return run_churn(o);
    if (o.mode == "connect") return run_connect(o);
    if (o.mode == "h2frames") return run_h2frames(o);
    usage();
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sockmesh-loadgen: %s\n", e.what());
    return 1;
  }
}
