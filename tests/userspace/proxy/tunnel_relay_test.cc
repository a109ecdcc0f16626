// TunnelRelay on the client's side of a CONNECT, over real loopback TCP and TLS 1.3: the h2
// module's client and server connections, and an application socket pair. The server of these
// tests answers only once it has heard from the client, as a peer may: a client that speaks
// first must be heard before the response (TunnelRelay::send_early), and nothing the relay read
// early may be lost, doubled or written to the client before the response.
#include "proxy/tunnel_relay.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/ioctl.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <string>

#include "identity/builtin_ca.h"
#include "tls/mesh_tls.h"

namespace sockmesh::proxy {
namespace {

using Tcp = boost::asio::ip::tcp;
using namespace std::chrono_literals;

// What the test server saw of its one stream, and when it answered.
struct ServerSide {
  std::shared_ptr<h2::H2Stream> stream;
  std::string received;
  bool ended = false;
  size_t received_when_answered = 0;
  bool answered = false;
};

class TunnelRelayEarlyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::path(::testing::TempDir()) / "relay-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto ca = identity::BuiltinCa::load_or_create(dir_, "cluster.local");
    ASSERT_TRUE(ca) << ca.error().message;
    tls_ = std::make_shared<tls::MeshTls>("cluster.local", *(*ca)->trust_roots());
    auto server_cert = (*ca)->issue(*identity::SpiffeId::make("cluster.local", "default", "s"));
    auto client_cert = (*ca)->issue(*identity::SpiffeId::make("cluster.local", "default", "c"));
    ASSERT_TRUE(server_cert && client_cert);

    Tcp::acceptor acceptor(io_, Tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    auto server = std::make_unique<h2::TlsStream>(Tcp::socket(io_), tls_->server());
    auto client = std::make_unique<h2::TlsStream>(Tcp::socket(io_), tls_->client());
    ASSERT_FALSE(tls::MeshTls::use_certificate(server->native_handle(), **server_cert));
    ASSERT_FALSE(tls::MeshTls::use_certificate(client->native_handle(), **client_cert));
    client->next_layer().connect(acceptor.local_endpoint());
    acceptor.accept(server->next_layer());
    int done = 0;
    server->async_handshake(boost::asio::ssl::stream_base::server,
                            [&](const boost::system::error_code& e) {
                              EXPECT_FALSE(e) << e.message();
                              ++done;
                            });
    client->async_handshake(boost::asio::ssl::stream_base::client,
                            [&](const boost::system::error_code& e) {
                              EXPECT_FALSE(e) << e.message();
                              ++done;
                            });
    ASSERT_TRUE(run_until([&] { return done == 2; }));
    server_conn_ = std::make_shared<h2::H2Connection>(std::move(server),
                                                      h2::H2Connection::Role::kServer,
                                                      h2::Settings{});
    client_conn_ = std::make_shared<h2::H2Connection>(std::move(client),
                                                      h2::H2Connection::Role::kClient,
                                                      h2::Settings{});

    // The application's connection to the proxy: app_ is the client app, proxy_ the proxy's
    // accepted socket that the relay reads.
    Tcp::acceptor app_acceptor(io_,
                               Tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    app_ = std::make_unique<Tcp::socket>(io_);
    app_->connect(app_acceptor.local_endpoint());
    proxy_ = std::make_shared<Tcp::socket>(io_);
    app_acceptor.accept(*proxy_);
  }
  void TearDown() override {
    if (server_conn_) server_conn_->abort("test over");
    if (client_conn_) client_conn_->abort("test over");
    io_.run_for(20ms);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  template <typename F>
  bool run_until(F done, std::chrono::milliseconds limit = 5000ms) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io_.run_for(5ms);
      if (io_.stopped()) io_.restart();
    }
    return done();
  }

  // The server answers `status` once it has received `answer_after` bytes (or END_STREAM), then
  // echoes what it received, and ends its side when the client has ended.
  void serve(int status, size_t answer_after) {
    server_conn_->set_request_handler([this, status,
                                       answer_after](std::shared_ptr<h2::H2Stream> stream) {
      side_.stream = stream;
      auto answer_if_due = [this, status, answer_after] {
        if (side_.answered || (side_.received.size() < answer_after && !side_.ended)) return;
        side_.answered = true;
        side_.received_when_answered = side_.received.size();
        side_.stream->respond(status);
        if (status != 200) return;
        side_.stream->send(reinterpret_cast<const uint8_t*>(side_.received.data()),
                           side_.received.size());
        if (side_.ended) side_.stream->finish();
      };
      h2::H2Stream::Handlers h;
      h.on_data = [this, answer_if_due](const uint8_t* d, size_t n) {
        side_.received.append(reinterpret_cast<const char*>(d), n);
        side_.stream->consume(n);
        if (side_.answered && side_.received.size() > side_.received_when_answered) {
          side_.stream->send(d, n);
        }
        answer_if_due();
      };
      h.on_end = [this, answer_if_due] {
        side_.ended = true;
        if (side_.answered) {
          side_.stream->finish();
        } else {
          answer_if_due();
        }
      };
      stream->set_handlers(std::move(h));
    });
    ASSERT_TRUE(server_conn_->start());
    ASSERT_TRUE(client_conn_->start());
  }

  // Opens the CONNECT and hands the relay the client's socket at once, as Outbound does. The
  // response goes to `responses`; a 200 starts the relay.
  std::shared_ptr<TunnelRelay> open_early() {
    auto holder = std::make_shared<std::weak_ptr<TunnelRelay>>();
    h2::H2Stream::Handlers h;
    h.on_response = [this, holder](int status, const h2::HeaderList&) {
      status_ = status;
      unread_at_response_ = unread(*proxy_);
      app_had_at_response_ = echoed_.size() + unread(*app_);
      auto relay = holder->lock();
      ASSERT_NE(relay, nullptr);
      if (status != 200) {
        relay->stop_early();
        return;
      }
      relay->start([this](const TunnelRelay::Result& r) {
        result_ = r;
        finished_ = true;
      });
    };
    h.on_close = [this](uint32_t code) { closed_early_ = static_cast<int>(code); };
    auto on_response = h.on_response;
    auto on_close = h.on_close;
    auto stream = client_conn_->open_connect("10.0.0.1:80", {}, std::move(h));
    EXPECT_NE(stream, nullptr);
    auto relay = std::make_shared<TunnelRelay>(proxy_, stream);
    *holder = relay;
    relay->send_early(std::move(on_response), std::move(on_close));
    return relay;
  }

  static size_t unread(Tcp::socket& s) {
    int n = 0;
    return ::ioctl(s.native_handle(), FIONREAD, &n) == 0 ? static_cast<size_t>(n) : 0;
  }

  // Reads from the app's socket until `want` bytes or EOF, running the loop meanwhile.
  std::string app_read(size_t want, bool* eof = nullptr) {
    std::string got;
    boost::system::error_code ec;
    app_->non_blocking(true, ec);
    run_until([&] {
      char buf[65536];
      for (;;) {
        boost::system::error_code e;
        size_t n = app_->read_some(boost::asio::buffer(buf), e);
        if (e == boost::asio::error::eof) {
          if (eof) *eof = true;
          return true;
        }
        if (e) return eof == nullptr && got.size() >= want;
        got.append(buf, n);
      }
    });
    return got;
  }

  std::string pattern(size_t n) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 7919) & 0xff);
    return s;
  }

  std::filesystem::path dir_;
  boost::asio::io_context io_;
  std::shared_ptr<tls::MeshTls> tls_;
  std::shared_ptr<h2::H2Connection> server_conn_, client_conn_;
  std::unique_ptr<Tcp::socket> app_;
  std::shared_ptr<Tcp::socket> proxy_;
  ServerSide side_;
  int status_ = 0;
  size_t unread_at_response_ = 0;
  size_t app_had_at_response_ = 0;
  std::string echoed_;
  int closed_early_ = -1;
  bool finished_ = false;
  TunnelRelay::Result result_;
};

// The server answers only after it has the client's first bytes: a relay that waited for the
// response before reading would never be answered.
TEST_F(TunnelRelayEarlyTest, AClientThatSpeaksFirstIsHeardBeforeTheResponse) {
  serve(200, 5);
  boost::asio::write(*app_, boost::asio::buffer(std::string("hello")));
  auto relay = open_early();
  ASSERT_TRUE(run_until([&] { return status_ != 0; })) << "no response: the early bytes never left";
  EXPECT_EQ(status_, 200);
  EXPECT_EQ(side_.received_when_answered, 5u);
  EXPECT_EQ(unread_at_response_, 0u) << "the relay had read the client's bytes before the 200";
  EXPECT_EQ(app_read(5), "hello");
  app_->shutdown(Tcp::socket::shutdown_send);
  bool eof = false;
  EXPECT_EQ(app_read(0, &eof), "");
  EXPECT_TRUE(eof);
  ASSERT_TRUE(run_until([&] { return finished_; }));
  EXPECT_EQ(result_.error, "");
  EXPECT_EQ(result_.bytes_to_stream, 5u) << "bytes sent before start() are counted";
  EXPECT_EQ(result_.bytes_to_socket, 5u);
}

// More than the relay's high watermark (1 MiB) before the answer: the relay pauses and resumes,
// nothing reaches the app before the 200, and every byte arrives once, in order.
TEST_F(TunnelRelayEarlyTest, ManyEarlyBytesArriveWholeAndInOrderAndNothingComesBackBeforeThe200) {
  const std::string data = pattern(4 << 20);
  serve(200, 2 << 20);
  auto relay = open_early();
  size_t written = 0;
  boost::system::error_code ec;
  app_->non_blocking(true, ec);
  ASSERT_TRUE(run_until(
      [&] {
        if (written < data.size()) {
          boost::system::error_code e;
          written += app_->write_some(boost::asio::buffer(data.data() + written,
                                                          data.size() - written), e);
          if (written == data.size()) app_->shutdown(Tcp::socket::shutdown_send, e);
        }
        char buf[65536];
        for (;;) {
          boost::system::error_code e;
          size_t n = app_->read_some(boost::asio::buffer(buf), e);
          if (e) break;
          echoed_.append(buf, n);
        }
        return finished_;
      },
      20000ms));
  EXPECT_EQ(status_, 200);
  EXPECT_GE(side_.received_when_answered, size_t{2} << 20);
  EXPECT_EQ(app_had_at_response_, 0u);
  EXPECT_EQ(side_.received.size(), data.size());
  EXPECT_TRUE(side_.received == data) << "the server got the bytes out of order or altered";
  EXPECT_EQ(echoed_.size(), data.size());
  EXPECT_TRUE(echoed_ == data);
  EXPECT_EQ(result_.bytes_to_stream, data.size());
}

// A refusal: the early bytes are dropped with the stream, nothing is written to the client's
// socket, and the socket is left open for its owner to answer (Outbound resets it).
TEST_F(TunnelRelayEarlyTest, ARefusalLeavesTheSocketToItsOwnerAndWritesNothingToIt) {
  serve(403, 3);
  boost::asio::write(*app_, boost::asio::buffer(std::string("abc")));
  auto relay = open_early();
  ASSERT_TRUE(run_until([&] { return status_ != 0; }));
  EXPECT_EQ(status_, 403);
  EXPECT_EQ(side_.received, "abc");
  // More from the app after the refusal is not read by the stopped relay.
  boost::asio::write(*app_, boost::asio::buffer(std::string("def")));
  run_until([] { return false; }, 100ms);
  EXPECT_TRUE(proxy_->is_open());
  EXPECT_EQ(unread(*proxy_), 3u);
  EXPECT_EQ(unread(*app_), 0u);
  EXPECT_FALSE(finished_);
}

// The client half-closes before the answer: END_STREAM follows its bytes, the server answers
// then, and its echo and its own end reach the client.
TEST_F(TunnelRelayEarlyTest, AHalfCloseBeforeTheResponseReachesTheServer) {
  serve(200, 1 << 20);  // answers at END_STREAM
  boost::asio::write(*app_, boost::asio::buffer(std::string("last words")));
  app_->shutdown(Tcp::socket::shutdown_send);
  auto relay = open_early();
  ASSERT_TRUE(run_until([&] { return status_ != 0; }));
  EXPECT_TRUE(side_.ended);
  bool eof = false;
  EXPECT_EQ(app_read(10, &eof), "last words");
  EXPECT_TRUE(eof);
  ASSERT_TRUE(run_until([&] { return finished_; }));
  EXPECT_EQ(result_.error, "");
}

// The client resets before the answer: the stream is reset (the server stops waiting), and the
// close reaches the relay's owner with the relay's reason, as Outbound logs it.
TEST_F(TunnelRelayEarlyTest, AClientResetBeforeTheResponseResetsTheStream) {
  bool server_closed = false;
  serve(200, 1 << 20);
  boost::asio::write(*app_, boost::asio::buffer(std::string("partial")));
  auto relay = open_early();
  ASSERT_TRUE(run_until([&] { return side_.received == "partial"; }));
  h2::H2Stream::Handlers h;
  h.on_close = [&](uint32_t) { server_closed = true; };
  side_.stream->set_handlers(std::move(h));
  ::linger l{1, 0};
  ::setsockopt(app_->native_handle(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
  app_->close();
  ASSERT_TRUE(run_until([&] { return closed_early_ >= 0 && server_closed; }));
  EXPECT_EQ(status_, 0);
  EXPECT_NE(relay->error().find("socket read"), std::string::npos) << relay->error();
  EXPECT_FALSE(proxy_->is_open());
}

}  // namespace
}  // namespace sockmesh::proxy
