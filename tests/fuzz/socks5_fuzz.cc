// The SOCKS5 entry's handshake (proxy/socks5_negotiate.h) over one end of a socket pair, the input
// written to the other end as the client's bytes, then the client's shutdown. Hostnames resolve
// as the proxy resolves a mesh service's name: one known name, else an IP literal. What the
// handshake answers must be SOCKS5: a method choice, then at most one reply.
#include <sys/socket.h>

#include <utility>  // std::exchange, which Boost 1.74's awaitable.hpp uses without including it

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include "fuzz_util.h"
#include "proxy/socks5_negotiate.h"

namespace {

using namespace sockmesh;
using Local = boost::asio::local::stream_protocol;

constexpr size_t kMaxInput = 16 * 1024;

boost::asio::io_context* g_io = nullptr;

std::optional<IpAddress> resolve(const std::string& host) {
  if (host == "echo.default.svc.cluster.local") return IpAddress::parse("10.96.0.10");
  return IpAddress::parse(host);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logs();
  g_io = new boost::asio::io_context(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return -1;
  Local::socket server(*g_io), client(*g_io);
  boost::asio::local::connect_pair(server, client);
  boost::system::error_code ec;
  size_t sent = boost::asio::write(client, boost::asio::buffer(data, size), ec);
  FUZZ_CHECK(!ec && sent == size);
  client.shutdown(Local::socket::shutdown_send, ec);

  bool done = false;
  std::optional<proxy::socks5::Negotiated> result;
  boost::asio::co_spawn(*g_io, proxy::socks5::negotiate(server, resolve),
                        [&](std::exception_ptr e, proxy::socks5::Negotiated n) {
                          done = true;
                          if (!e) result = n;  // an exception: the client hung up early
                        });
  g_io->run();
  g_io->restart();
  FUZZ_CHECK(done);
  server.close(ec);  // the proxy's side is done: the client reads to the end

  std::string answer;
  char buf[4096];
  for (;;) {
    size_t n = client.read_some(boost::asio::buffer(buf), ec);
    if (ec) break;
    answer.append(buf, n);
  }
  if (!answer.empty()) {
    FUZZ_CHECK(answer.size() == 2 || answer.size() == 12);
    FUZZ_CHECK(answer[0] == 5);
    if (answer.size() == 12) FUZZ_CHECK(answer[2] == 5 && answer[3] != 0);
  }
  if (result && result->ok) {
    FUZZ_CHECK(result->destination.port != 0);
    FUZZ_CHECK(answer.size() == 2 && answer[1] == 0);
  }
  return 0;
}
