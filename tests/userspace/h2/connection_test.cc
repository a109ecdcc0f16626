// H2Connection over real loopback TCP and TLS 1.3 (the mesh's contexts, certificates from the
// built-in CA): a client and a server connection of this class, or one of them and a peer that
// writes and reads frames by hand.
#include "h2/connection.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <filesystem>
#include <map>
#include <string>

#include "identity/builtin_ca.h"
#include "tls/mesh_tls.h"

namespace sockmesh::h2 {
namespace {

using Tcp = boost::asio::ip::tcp;
using namespace std::chrono_literals;

constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

class H2ConnectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::path(::testing::TempDir()) / "h2-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto ca = identity::BuiltinCa::load_or_create(dir_, "cluster.local");
    ASSERT_TRUE(ca) << ca.error().message;
    ca_ = *ca;
    tls_ = std::make_shared<tls::MeshTls>("cluster.local", *ca_->trust_roots());
    auto server_cert = ca_->issue(*identity::SpiffeId::make("cluster.local", "default", "server"));
    auto client_cert = ca_->issue(*identity::SpiffeId::make("cluster.local", "default", "client"));
    ASSERT_TRUE(server_cert && client_cert);
    server_cert_ = *server_cert;
    client_cert_ = *client_cert;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A TLS connection over loopback, handshaken on both ends.
  struct TlsPair {
    std::unique_ptr<TlsStream> server, client;
  };
  TlsPair connected_pair() {
    Tcp::acceptor acceptor(io_, Tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    TlsPair p;
    p.server = std::make_unique<TlsStream>(Tcp::socket(io_), tls_->server());
    p.client = std::make_unique<TlsStream>(Tcp::socket(io_), tls_->client());
    EXPECT_FALSE(tls::MeshTls::use_certificate(p.server->native_handle(), *server_cert_));
    EXPECT_FALSE(tls::MeshTls::use_certificate(p.client->native_handle(), *client_cert_));
    p.client->next_layer().connect(acceptor.local_endpoint());
    acceptor.accept(p.server->next_layer());
    int done = 0;
    boost::system::error_code server_ec, client_ec;
    p.server->async_handshake(boost::asio::ssl::stream_base::server,
                              [&](const boost::system::error_code& e) {
                                server_ec = e;
                                ++done;
                              });
    p.client->async_handshake(boost::asio::ssl::stream_base::client,
                              [&](const boost::system::error_code& e) {
                                client_ec = e;
                                ++done;
                              });
    run_until([&] { return done == 2; });
    EXPECT_FALSE(server_ec) << server_ec.message();
    EXPECT_FALSE(client_ec) << client_ec.message();
    return p;
  }

  // Runs the loop until `done` or 5 s; returns done().
  template <typename F>
  bool run_until(F done, std::chrono::milliseconds limit = 5000ms) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io_.run_for(10ms);
      if (io_.stopped()) io_.restart();
    }
    return done();
  }

  // Reads frames from a peer written by hand (blocking, on an already handshaken stream).
  struct Frame {
    uint8_t type = 0, flags = 0;
    uint32_t stream = 0;
    std::string payload;
  };
  static Frame read_frame(TlsStream& s) {
    uint8_t hd[9];
    boost::asio::read(s, boost::asio::buffer(hd));
    Frame f;
    size_t n = (size_t{hd[0]} << 16) | (size_t{hd[1]} << 8) | hd[2];
    f.type = hd[3];
    f.flags = hd[4];
    f.stream =
        ((uint32_t{hd[5]} << 24) | (uint32_t{hd[6]} << 16) | (uint32_t{hd[7]} << 8) | hd[8]) &
        0x7fffffffu;
    f.payload.resize(n);
    if (n > 0) boost::asio::read(s, boost::asio::buffer(f.payload));
    return f;
  }
  static std::map<uint16_t, uint32_t> settings_of(const Frame& f) {
    std::map<uint16_t, uint32_t> out;
    const auto* p = reinterpret_cast<const uint8_t*>(f.payload.data());
    for (size_t i = 0; i + 6 <= f.payload.size(); i += 6) {
      out[static_cast<uint16_t>((p[i] << 8) | p[i + 1])] = (uint32_t{p[i + 2]} << 24) |
                                                           (uint32_t{p[i + 3]} << 16) |
                                                           (uint32_t{p[i + 4]} << 8) | p[i + 5];
    }
    return out;
  }

  boost::asio::io_context io_;
  std::filesystem::path dir_;
  std::shared_ptr<identity::BuiltinCa> ca_;
  std::shared_ptr<tls::MeshTls> tls_;
  identity::CertifiedKeyPtr server_cert_, client_cert_;
};

TEST_F(H2ConnectionTest, ConnectEchoesDataAndHalfClosesBothWays) {
  auto p = connected_pair();
  auto server =
      std::make_shared<H2Connection>(std::move(p.server), H2Connection::Role::kServer, Settings{});
  auto client =
      std::make_shared<H2Connection>(std::move(p.client), H2Connection::Role::kClient, Settings{});
  std::string server_got, authority;
  bool server_saw_end = false;
  server->set_request_handler([&](std::shared_ptr<H2Stream> s) {
    authority = s->request().authority;
    EXPECT_EQ(s->request().method, "CONNECT");
    ASSERT_NE(s->request().header("x-test"), nullptr);
    EXPECT_EQ(*s->request().header("x-test"), "yes");
    H2Stream* raw = s.get();
    H2Stream::Handlers h;
    h.on_data = [&, raw](const uint8_t* d, size_t n) {
      server_got.append(reinterpret_cast<const char*>(d), n);
      raw->send(d, n);  // echo
      raw->consume(n);
    };
    h.on_end = [&, raw] {
      server_saw_end = true;
      raw->finish();
    };
    s->set_handlers(std::move(h));
    s->respond(200);
  });
  ASSERT_TRUE(server->start());
  ASSERT_TRUE(client->start());

  int status = 0;
  std::string client_got;
  bool client_saw_end = false;
  int closed_with = -1;
  H2Stream::Handlers h;
  std::shared_ptr<H2Stream> stream;
  h.on_response = [&](int st, const HeaderList&) { status = st; };
  h.on_data = [&](const uint8_t* d, size_t n) {
    client_got.append(reinterpret_cast<const char*>(d), n);
    stream->consume(n);
  };
  h.on_end = [&] { client_saw_end = true; };
  h.on_close = [&](uint32_t code) { closed_with = static_cast<int>(code); };
  stream = client->open_connect("127.0.0.1:8080", {{"x-test", "yes"}}, std::move(h));
  ASSERT_NE(stream, nullptr);
  ASSERT_TRUE(run_until([&] { return status != 0; }));
  EXPECT_EQ(status, 200);
  EXPECT_EQ(authority, "127.0.0.1:8080");
  std::string payload(300000, 'x');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>('a' + i % 26);
  ASSERT_TRUE(stream->send(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()));
  stream->finish();  // half-close: the server still answers afterwards
  ASSERT_TRUE(run_until([&] { return closed_with >= 0; }));
  EXPECT_TRUE(server_saw_end);
  EXPECT_TRUE(client_saw_end);
  EXPECT_EQ(server_got, payload);
  EXPECT_EQ(client_got, payload);
  EXPECT_EQ(closed_with, 0);
  EXPECT_TRUE(client->usable());
  client->abort("test over");
  server->abort("test over");
}

// Chunks from 1 byte to 300 KiB, on two streams of one connection at once, queued while earlier
// ones are still going out (small ones coalesce in the send queue, large ones span several
// frames, frames of both streams share write batches): every byte comes back in order on its
// own stream.
TEST_F(H2ConnectionTest, MixedChunksOnTwoStreamsKeepTheirOrder) {
  auto p = connected_pair();
  // Small stream windows: most chunks wait in the send queues for the peer's WINDOW_UPDATEs.
  Settings settings;
  settings.stream_window = 64 * 1024;
  auto server =
      std::make_shared<H2Connection>(std::move(p.server), H2Connection::Role::kServer, settings);
  auto client =
      std::make_shared<H2Connection>(std::move(p.client), H2Connection::Role::kClient, settings);
  server->set_request_handler([&](std::shared_ptr<H2Stream> s) {
    H2Stream* raw = s.get();
    H2Stream::Handlers h;
    h.on_data = [raw](const uint8_t* d, size_t n) {
      raw->send(d, n);  // echo, frame by frame
      raw->consume(n);
    };
    h.on_end = [raw] { raw->finish(); };
    s->set_handlers(std::move(h));
    s->respond(200);
  });
  ASSERT_TRUE(server->start());
  ASSERT_TRUE(client->start());

  constexpr int kStreams = 2;
  std::shared_ptr<H2Stream> streams[kStreams];
  std::string sent[kStreams], got[kStreams];
  int ok = 0, closed = 0;
  for (int i = 0; i < kStreams; ++i) {
    H2Stream::Handlers h;
    h.on_response = [&](int st, const HeaderList&) { ok += st == 200; };
    h.on_data = [&, i](const uint8_t* d, size_t n) {
      got[i].append(reinterpret_cast<const char*>(d), n);
      streams[i]->consume(n);
    };
    h.on_close = [&](uint32_t code) {
      EXPECT_EQ(code, 0u);
      ++closed;
    };
    streams[i] = client->open_connect("127.0.0.1:" + std::to_string(8080 + i), {}, std::move(h));
    ASSERT_NE(streams[i], nullptr);
  }
  ASSERT_TRUE(run_until([&] { return ok == kStreams; }));
  const size_t sizes[] = {1,         100, 16 * 1024,  16 * 1024 - 1,
                          70 * 1024, 5,   300 * 1024, 16 * 1024 + 1,
                          40000,     3,   256 * 1024};
  uint32_t seed = 1;
  for (int round = 0; round < 3; ++round) {
    for (size_t size : sizes) {
      for (int i = 0; i < kStreams; ++i) {
        // As a relay's read: a 256 KiB buffer, cut to what came (small ones coalesce).
        Bytes chunk;
        chunk.reserve(std::max<size_t>(size, 256 * 1024));
        for (size_t k = 0; k < size; ++k) {
          seed = seed * 1103515245u + 12345u;
          chunk.push_back(static_cast<uint8_t>(seed >> 16));
        }
        sent[i].append(reinterpret_cast<const char*>(chunk.data()), size);
        ASSERT_TRUE(streams[i]->send(std::move(chunk)));
      }
    }
    // Some chunks go out in this turn of the loop, the rest queue behind them.
    run_until([&] { return false; }, 20ms);
  }
  for (auto& s : streams) s->finish();
  ASSERT_TRUE(run_until([&] { return closed == kStreams; }, 10000ms));
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_EQ(got[i].size(), sent[i].size()) << "stream " << i;
    EXPECT_TRUE(got[i] == sent[i]) << "stream " << i << ": the bytes differ";
  }
  client->abort("test over");
  server->abort("test over");
}

TEST_F(H2ConnectionTest, PeerResetReachesTheOtherSide) {
  auto p = connected_pair();
  auto server =
      std::make_shared<H2Connection>(std::move(p.server), H2Connection::Role::kServer, Settings{});
  auto client =
      std::make_shared<H2Connection>(std::move(p.client), H2Connection::Role::kClient, Settings{});
  int server_closed = -1;
  server->set_request_handler([&](std::shared_ptr<H2Stream> s) {
    H2Stream::Handlers h;
    h.on_data = [](const uint8_t*, size_t) {};
    h.on_close = [&](uint32_t code) { server_closed = static_cast<int>(code); };
    s->set_handlers(std::move(h));
    s->respond(200);
  });
  ASSERT_TRUE(server->start());
  ASSERT_TRUE(client->start());
  int status = 0;
  H2Stream::Handlers h;
  h.on_response = [&](int st, const HeaderList&) { status = st; };
  auto stream = client->open_connect("127.0.0.1:1", {}, std::move(h));
  ASSERT_TRUE(run_until([&] { return status == 200; }));
  stream->reset(NGHTTP2_CANCEL);
  ASSERT_TRUE(run_until([&] { return server_closed >= 0; }));
  EXPECT_EQ(server_closed, NGHTTP2_CANCEL);
  EXPECT_TRUE(server->usable()) << "a stream reset is not a connection error";
  client->abort("test over");
  server->abort("test over");
}

TEST_F(H2ConnectionTest, RefusalIsFinalAndTheConnectionStays) {
  auto p = connected_pair();
  auto server =
      std::make_shared<H2Connection>(std::move(p.server), H2Connection::Role::kServer, Settings{});
  auto client =
      std::make_shared<H2Connection>(std::move(p.client), H2Connection::Role::kClient, Settings{});
  server->set_request_handler([&](std::shared_ptr<H2Stream> s) {
    s->respond(403, {{"sockmesh-error", "no"}});
  });
  ASSERT_TRUE(server->start());
  ASSERT_TRUE(client->start());
  int status = 0;
  std::string reason;
  bool closed = false;
  H2Stream::Handlers h;
  h.on_response = [&](int st, const HeaderList& hdrs) {
    status = st;
    for (const auto& x : hdrs) {
      if (x.name == "sockmesh-error") reason = x.value;
    }
  };
  h.on_close = [&](uint32_t) { closed = true; };
  auto stream = client->open_connect("127.0.0.1:1", {}, std::move(h));
  ASSERT_TRUE(run_until([&] { return closed; }));
  EXPECT_EQ(status, 403);
  EXPECT_EQ(reason, "no");
  EXPECT_TRUE(client->usable());
  EXPECT_EQ(client->active_streams(), 0u);
  client->abort("test over");
  server->abort("test over");
}

// Issue #14 item 9: the HBONE client's SETTINGS carry SETTINGS_ENABLE_PUSH=0.
TEST_F(H2ConnectionTest, ClientSettingsDisableServerPush) {
  auto p = connected_pair();
  auto client =
      std::make_shared<H2Connection>(std::move(p.client), H2Connection::Role::kClient, Settings{});
  ASSERT_TRUE(client->start());
  io_.poll();
  std::string preface(sizeof kPreface - 1, '\0');
  auto& peer = *p.server;
  // The client writes as soon as it starts; run its loop until the bytes are out.
  run_until([&] { return peer.next_layer().available() > 0; }, 2000ms);
  boost::asio::read(peer, boost::asio::buffer(preface));
  EXPECT_EQ(preface, kPreface);
  Frame f = read_frame(peer);
  ASSERT_EQ(f.type, NGHTTP2_SETTINGS);
  auto s = settings_of(f);
  ASSERT_EQ(s.count(NGHTTP2_SETTINGS_ENABLE_PUSH), 1u) << "no ENABLE_PUSH in the client SETTINGS";
  EXPECT_EQ(s[NGHTTP2_SETTINGS_ENABLE_PUSH], 0u);
  client->abort("test over");
}

// The server advertises the stream limit it enforces (the library is told none; see start()).
TEST_F(H2ConnectionTest, ServerAdvertisesItsStreamLimit) {
  auto p = connected_pair();
  Settings settings;
  settings.max_concurrent_streams = 7;
  auto server =
      std::make_shared<H2Connection>(std::move(p.server), H2Connection::Role::kServer, settings);
  ASSERT_TRUE(server->start());
  auto& peer = *p.client;
  run_until([&] { return peer.next_layer().available() > 0; }, 2000ms);
  Frame f = read_frame(peer);
  ASSERT_EQ(f.type, NGHTTP2_SETTINGS);
  auto s = settings_of(f);
  EXPECT_EQ(s[NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS], 7u);
  EXPECT_EQ(s.count(NGHTTP2_SETTINGS_ENABLE_PUSH), 0u) << "a server does not send ENABLE_PUSH";
  server->abort("test over");
}

TEST_F(H2ConnectionTest, ServerClosesAConnectionIdleWithoutStreams) {
  auto p = connected_pair();
  Settings settings;
  settings.idle_timeout = 200ms;
  auto server =
      std::make_shared<H2Connection>(std::move(p.server), H2Connection::Role::kServer, settings);
  auto client =
      std::make_shared<H2Connection>(std::move(p.client), H2Connection::Role::kClient, Settings{});
  std::string server_reason;
  bool idle_reported = false;
  server->set_close_handler([&](const std::string& r) { server_reason = r; });
  server->set_limit_handler(
      [&](H2Connection::Limit l) { idle_reported |= l == H2Connection::Limit::kIdle; });
  ASSERT_TRUE(server->start());
  ASSERT_TRUE(client->start());
  ASSERT_TRUE(run_until([&] { return server->closed(); }, 3000ms));
  EXPECT_TRUE(idle_reported);
  EXPECT_NE(server_reason.find("idle"), std::string::npos) << server_reason;
  ASSERT_TRUE(run_until([&] { return !client->usable(); }, 2000ms))
      << "the client saw the GOAWAY or the close";
  client->abort("test over");
}

// A connection waiting for input (its socket read handed to the reactor, receive_socket) learns
// of a peer that goes away without a TLS close_notify: a FIN reads as "peer closed the
// connection", an RST as a failed read; either way it closes and says so.
TEST_F(H2ConnectionTest, AWaitingConnectionClosesWhenThePeerVanishes) {
  for (bool reset : {false, true}) {
    SCOPED_TRACE(reset ? "peer resets" : "peer closes");
    auto p = connected_pair();
    auto server = std::make_shared<H2Connection>(std::move(p.server), H2Connection::Role::kServer,
                                                 Settings{});
    std::string reason;
    server->set_close_handler([&](const std::string& r) { reason = r; });
    ASSERT_TRUE(server->start());
    // The client's preface and SETTINGS, then nothing: the server has read them and waits.
    std::string preface(kPreface);
    preface.append("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9);
    boost::asio::write(*p.client, boost::asio::buffer(preface));
    run_until([] { return false; }, 200ms);
    ASSERT_FALSE(server->closed());
    if (reset) {
      p.client->next_layer().set_option(boost::asio::socket_base::linger(true, 0));
      p.client->next_layer().close();
    } else {
      // A FIN (a close() would reset: the server's SETTINGS are unread here).
      p.client->next_layer().shutdown(Tcp::socket::shutdown_send);
    }
    ASSERT_TRUE(run_until([&] { return server->closed(); }, 3000ms));
    if (reset) {
      EXPECT_NE(reason.find("read failed"), std::string::npos) << reason;
    } else {
      EXPECT_NE(reason.find("peer closed the connection"), std::string::npos) << reason;
    }
  }
}

TEST_F(H2ConnectionTest, IdleTimeoutWaitsForTheLastStream) {
  auto p = connected_pair();
  Settings settings;
  settings.idle_timeout = 200ms;
  auto server =
      std::make_shared<H2Connection>(std::move(p.server), H2Connection::Role::kServer, settings);
  auto client =
      std::make_shared<H2Connection>(std::move(p.client), H2Connection::Role::kClient, Settings{});
  std::shared_ptr<H2Stream> held;
  server->set_request_handler([&](std::shared_ptr<H2Stream> s) {
    H2Stream::Handlers h;
    h.on_data = [](const uint8_t*, size_t) {};
    s->set_handlers(std::move(h));
    s->respond(200);
    held = s;
  });
  ASSERT_TRUE(server->start());
  ASSERT_TRUE(client->start());
  int status = 0;
  H2Stream::Handlers h;
  h.on_response = [&](int st, const HeaderList&) { status = st; };
  auto stream = client->open_connect("127.0.0.1:1", {}, std::move(h));
  ASSERT_TRUE(run_until([&] { return status == 200; }));
  run_until([] { return false; }, 700ms);
  EXPECT_FALSE(server->closed()) << "an open tunnel is use";
  stream->reset(NGHTTP2_CANCEL);
  EXPECT_TRUE(run_until([&] { return server->closed(); }, 3000ms));
  client->abort("test over");
}

}  // namespace
}  // namespace sockmesh::h2
