// The admin, metrics and readiness ports' HTTP/1.1 server (observe/http_server.cc), over real
// loopback TCP: each input is what one client sends on one connection before it shuts down its
// sending side. The server must answer each request it parses and end the connection at the
// client's EOF; the client reads until the server closes. Routes echo the decoded request (path,
// query, body), as handlers such as /logging read it.
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "base/ip_address.h"
#include "fuzz_util.h"
#include "observe/http_server.h"

namespace {

using namespace sockmesh;
using Tcp = boost::asio::ip::tcp;

constexpr size_t kMaxInput = 64 * 1024;

boost::asio::io_context* g_io = nullptr;
observe::HttpServer* g_server = nullptr;
Tcp::endpoint g_at;

observe::HttpResponse echo(const observe::HttpRequest& r) {
  observe::HttpResponse out;
  out.body = r.method + " " + r.path + "\n";
  for (const auto& [k, v] : r.query) out.body += k + "=" + v + "\n";
  out.body += std::to_string(r.body.size()) + " bytes of body\n";
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logs();
  g_io = new boost::asio::io_context(1);
  g_server = new observe::HttpServer(*g_io, "fuzz");
  g_server->route("/", echo);
  g_server->route("/logging", echo);
  g_server->route("/stats/prometheus", echo);
  auto loopback = IpAddress::parse("127.0.0.1");
  FUZZ_CHECK(loopback.has_value());
  auto err = g_server->listen(Endpoint{*loopback, 0});
  FUZZ_CHECK(!err.has_value());
  Endpoint at = g_server->local_endpoint();
  g_at = Tcp::endpoint(boost::asio::ip::make_address(at.ip.to_string()), at.port);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return -1;
  Tcp::socket client(*g_io);
  boost::system::error_code ec;
  // Asynchronously: a blocking connect() returns EINTR when one of libFuzzer's signals (its
  // timeout alarm) lands in it, which CI saw after 52,000 runs. Asio's reactor retries EINTR.
  bool connected = false;
  client.async_connect(g_at, [&](const boost::system::error_code& e) {
    ec = e;
    connected = true;
  });
  for (int i = 0; !connected && i < 1000000; ++i) g_io->run_one();
  FUZZ_CHECK(connected);
  if (ec) fprintf(stderr, "connect: %s\n", ec.message().c_str());
  FUZZ_CHECK(!ec);
  bool done = false;
  std::string answer;
  boost::asio::async_write(client, boost::asio::buffer(data, size),
                           [&](const boost::system::error_code& e, size_t) {
                             boost::system::error_code ignored;
                             if (!e) client.shutdown(Tcp::socket::shutdown_send, ignored);
                           });
  auto buffer = boost::asio::dynamic_buffer(answer);
  boost::asio::async_read(client, buffer, [&](const boost::system::error_code&, size_t) {
    done = true;  // EOF (or a reset): the server has ended the connection
  });
  for (int i = 0; !done && i < 1000000; ++i) g_io->run_one();
  FUZZ_CHECK(done);
  while (g_io->poll() > 0) {
  }
  if (!answer.empty()) FUZZ_CHECK(answer.rfind("HTTP/", 0) == 0);
  return 0;
}
