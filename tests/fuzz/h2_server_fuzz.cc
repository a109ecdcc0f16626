// The HBONE server side after TLS: an H2Connection in the server role (h2/connection.cc) fed the
// input as the bytes a peer sends once the handshake is done, in cleartext
// (use_cleartext_for_testing). The client preface is put in front of the input. Requests are
// answered as proxy/inbound.cc answers them: 431 when the headers are over the limit, 405 for
// anything but CONNECT, 400 for an :authority that is not ip:port; otherwise the target port
// picks what the "application" does: echo the tunnel's bytes (port % 3 == 0), refuse with 503
// (1), or answer 200 a turn of the event loop later, after early DATA has arrived (2).
//
// The peer's side is one end of a socket pair; its shutdown after the input is the peer closing.
// A connection that is still open once nothing more can happen is aborted.
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "fuzz_util.h"
#include "h2/connection.h"
#include "proxy/forwarded.h"

namespace {

using namespace sockmesh;
using Tcp = boost::asio::ip::tcp;

constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr size_t kMaxInput = 64 * 1024;  // fits a socket pair's buffer in one write

boost::asio::io_context* g_io = nullptr;
boost::asio::ssl::context* g_tls = nullptr;

void open_tunnel(const std::shared_ptr<h2::H2Stream>& stream) {
  stream->respond(200);
  std::weak_ptr<h2::H2Stream> weak = stream;
  h2::H2Stream::Handlers handlers;
  handlers.on_data = [weak](const uint8_t* data, size_t len) {
    auto s = weak.lock();
    if (!s) return;
    s->send(data, len);  // the application echoes
    s->consume(len);
  };
  handlers.on_end = [weak] {
    if (auto s = weak.lock()) s->finish();
  };
  stream->set_handlers(std::move(handlers));
}

void handle_request(const std::shared_ptr<h2::H2Stream>& stream) {
  const h2::Request& req = stream->request();
  (void)proxy::forwarded_for(req);
  if (req.oversized) return stream->respond(431, {{"sockmesh-error", "headers too large"}});
  if (req.method != "CONNECT") return stream->respond(405, {{"sockmesh-error", req.method}});
  auto target = Endpoint::parse(req.authority);
  if (!target) return stream->respond(400, {{"sockmesh-error", "malformed :authority"}});
  switch (target->port % 3) {
    case 0:
      open_tunnel(stream);
      break;
    case 1:
      stream->respond(503, {{"sockmesh-error", "connection refused"}});
      break;
    default:
      boost::asio::post(*g_io, [stream] {
        if (!stream->closed()) open_tunnel(stream);
      });
      break;
  }
}

// Reads whatever the server wrote, so that it never waits for room in the socket.
void drain(int fd) {
  char buf[65536];
  while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logs();
  g_io = new boost::asio::io_context(1);
  g_tls = new boost::asio::ssl::context(boost::asio::ssl::context::tls_server);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return -1;  // not added to the corpus
  int fds[2];
  FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  int peer = fds[1];
  std::string input(kPreface, sizeof kPreface - 1);
  input.append(reinterpret_cast<const char*>(data), size);
  FUZZ_CHECK(::send(peer, input.data(), input.size(), MSG_NOSIGNAL) ==
             static_cast<ssize_t>(input.size()));
  ::shutdown(peer, SHUT_WR);

  Tcp::socket socket(*g_io);
  socket.assign(Tcp::v4(), fds[0]);  // a stream socket; the protocol tag is not checked
  auto tls = std::make_unique<h2::TlsStream>(std::move(socket), *g_tls);
  h2::Settings settings;
  auto conn =
      std::make_shared<h2::H2Connection>(std::move(tls), h2::H2Connection::Role::kServer, settings);
  conn->use_cleartext_for_testing();
  bool closed = false;
  conn->set_request_handler(handle_request);
  conn->set_close_handler([&closed](const std::string&) { closed = true; });
  if (conn->start()) {
    int idle = 0;
    while (!closed && idle < 100) {
      size_t ran = g_io->poll();
      drain(peer);
      idle = ran == 0 ? idle + 1 : 0;
    }
    if (!closed) conn->abort("fuzz: nothing more happens");
  }
  FUZZ_CHECK(conn->closed() || !closed);
  conn.reset();
  while (g_io->poll() > 0) drain(peer);
  g_io->restart();
  ::close(peer);
  return 0;
}
