// InboundHbone (port 15008) over real loopback TCP and TLS 1.3: a client made of the h2 module's
// own client connection, the proxy's inbound role on one worker loop (run by the test thread),
// and an echo application. Handshake, authorization, refusals, half-close, connection caps.
#include "proxy/inbound.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <map>

#include "config/local_config.h"
#include "h2/connection.h"
#include "identity/builtin_ca.h"
#include "observe/metrics.h"
#include "proxy/context.h"

namespace sockmesh::proxy {
namespace {

using Tcp = boost::asio::ip::tcp;
using namespace std::chrono_literals;

// An echo application: every accepted socket sends back what it reads, and ends when it ends.
struct EchoApp {
  explicit EchoApp(boost::asio::io_context& io, const std::string& ip) : acceptor(io) {
    Tcp::endpoint at(boost::asio::ip::make_address(ip), 0);
    acceptor.open(at.protocol());
    acceptor.set_option(Tcp::acceptor::reuse_address(true));
    acceptor.bind(at);
    acceptor.listen();
    accept();
  }
  void accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, Tcp::socket s) {
      if (ec) return;
      auto sock = std::make_shared<Tcp::socket>(std::move(s));
      auto buf = std::make_shared<std::array<char, 65536>>();
      read(sock, buf);
      accept();
    });
  }
  static void read(std::shared_ptr<Tcp::socket> s, std::shared_ptr<std::array<char, 65536>> b) {
    s->async_read_some(
        boost::asio::buffer(*b), [s, b](const boost::system::error_code& ec, size_t n) {
          if (ec) {
            boost::system::error_code ignored;
            s->shutdown(Tcp::socket::shutdown_send, ignored);
            return;
          }
          boost::asio::async_write(*s, boost::asio::buffer(b->data(), n),
                                   [s, b](const boost::system::error_code& e, size_t) {
                                     if (!e) read(s, b);
                                   });
        });
  }
  uint16_t port() const { return acceptor.local_endpoint().port(); }
  Tcp::acceptor acceptor;
};

class InboundTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = static_cast<int>(::getpid() % 200) + 20;
    block_ = "127.79." + std::to_string(n);
    server_ip_ = block_ + ".20";
    client_ip_ = block_ + ".10";
    std::string tmpl = (std::filesystem::path(::testing::TempDir()) / "inbound-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto ca = identity::BuiltinCa::load_or_create(dir_, "cluster.local");
    ASSERT_TRUE(ca) << ca.error().message;
    ca_ = *ca;
    app_ = std::make_unique<EchoApp>(worker_io(), server_ip_);
  }
  void TearDown() override {
    // Everything that lives on the worker's loop goes before the loop does: the loop (in
    // ctx_.workers) is destroyed first among the members that use it otherwise.
    for (auto& c : clients_) c->abort("test over");
    clients_.clear();
    if (worker_raw_ != nullptr) io().run_for(50ms);
    listener_.reset();
    app_.reset();
    if (worker_raw_ != nullptr) io().run_for(20ms);
    ctx_.workers.clear();  // drops queued handlers while ctx_, metrics_ and store_ still exist
    worker_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  boost::asio::io_context& worker_io() {
    if (!worker_) worker_ = std::make_unique<Worker>(0);
    return worker_->io();
  }

  // Starts the inbound role with these policies (YAML under `policies:`, or none).
  void start_inbound(const std::string& policies = "", uint32_t per_source = 0) {
    std::string yaml =
        "workloads:\n"
        "- uid: c1\n  name: client\n  namespace: default\n  serviceAccount: client\n"
        "  workloadIps: [" +
        client_ip_ +
        "]\n  protocol: HBONE\n  node: node-a\n"
        "- uid: s1\n  name: server\n  namespace: default\n  serviceAccount: server\n"
        "  workloadIps: [" +
        server_ip_ +
        "]\n  protocol: HBONE\n  node: node-b\n"
        "- uid: s2\n  name: other\n  namespace: default\n  serviceAccount: other\n"
        "  workloadIps: [" +
        block_ + ".30]\n  protocol: HBONE\n  node: node-b\n";
    if (!policies.empty()) yaml += "policies:\n" + policies;
    auto parsed = config::parse_local_config(yaml, "test.yaml");
    ASSERT_EQ(config::error_of(parsed), nullptr) << config::error_of(parsed)->to_string();
    store_.set(config::snapshot_of(parsed));

    ctx_.config.node_name = "node-b";
    ctx_.config.preserve_source_ip = false;
    ctx_.config.mark_to_app = 0;
    ctx_.config.handshake_timeout = 2000ms;
    ctx_.config.connect_timeout = 2000ms;
    ctx_.store = &store_;
    ctx_.tls = std::make_shared<tls::MeshTls>("cluster.local", *ca_->trust_roots());
    auto ca = ca_;
    ctx_.certificate_for =
        [ca](const std::string& id) -> identity::Result<identity::CertifiedKeyPtr> {
      return ca->issue(*identity::SpiffeId::parse(id));
    };
    ctx_.local_workload = [this](const state::Snapshot& s, const IpAddress& ip) {
      return ctx_.find_local(s, ip);
    };
    ctx_.metrics = &metrics_;
    ctx_.hbone_limits = std::make_shared<ConnectionLimits>(0, per_source);
    worker_io();
    ctx_.workers.push_back(std::move(worker_));
    worker_raw_ = ctx_.workers.back().get();
    inbound_ = std::make_unique<InboundHbone>(ctx_);
    listener_ = std::make_unique<Tcp::acceptor>(
        worker_raw_->io(), Tcp::endpoint(boost::asio::ip::make_address(server_ip_), 0));
    accept();
  }
  void accept() {
    listener_->async_accept([this](const boost::system::error_code& ec, Tcp::socket s) {
      if (ec) return;
      inbound_->handle(*worker_raw_, std::move(s));
      accept();
    });
  }
  boost::asio::io_context& io() { return worker_raw_->io(); }

  template <typename F>
  bool run_until(F done, std::chrono::milliseconds limit = 5000ms) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io().run_for(10ms);
      if (io().stopped()) io().restart();
    }
    return done();
  }

  // A TLS connection from the client's address presenting `identity` (empty: no certificate).
  // nullptr when the handshake fails.
  std::shared_ptr<h2::H2Connection> connect_client(const std::string& sa = "client",
                                                   std::string* failure = nullptr) {
    auto tls = std::make_unique<h2::TlsStream>(Tcp::socket(io()), ctx_.tls->client());
    if (!sa.empty()) {
      auto cert = ca_->issue(*identity::SpiffeId::make("cluster.local", "default", sa));
      EXPECT_TRUE(cert);
      EXPECT_FALSE(tls::MeshTls::use_certificate(tls->native_handle(), **cert));
    }
    auto& sock = tls->next_layer();
    sock.open(Tcp::v4());
    sock.bind(Tcp::endpoint(boost::asio::ip::make_address(client_ip_), 0));
    boost::system::error_code ec;
    sock.connect(listener_->local_endpoint(), ec);
    if (ec) {
      if (failure) *failure = "connect: " + ec.message();
      return nullptr;
    }
    bool done = false;
    tls->async_handshake(boost::asio::ssl::stream_base::client,
                         [&](const boost::system::error_code& e) {
                           ec = e;
                           done = true;
                         });
    run_until([&] { return done; });
    if (!done || ec) {
      if (failure) *failure = done ? ec.message() : "handshake did not finish";
      return nullptr;
    }
    auto c = std::make_shared<h2::H2Connection>(std::move(tls), h2::H2Connection::Role::kClient,
                                                h2::Settings{});
    EXPECT_TRUE(c->start());
    clients_.push_back(c);
    // TLS 1.3: the server may still refuse the client's certificate after the client finished.
    run_until([] { return false; }, 100ms);
    if (c->closed()) {
      if (failure) *failure = "closed after the handshake";
      return nullptr;
    }
    return c;
  }

  struct Tunnel {
    std::shared_ptr<h2::H2Stream> stream;
    int status = 0;
    std::string error_header;
    std::string data;
    bool ended = false;
    int closed = -1;
  };
  std::shared_ptr<Tunnel> open(h2::H2Connection& c, const std::string& authority) {
    auto t = std::make_shared<Tunnel>();
    h2::H2Stream::Handlers h;
    std::weak_ptr<Tunnel> weak = t;
    h.on_response = [weak](int st, const h2::HeaderList& hdrs) {
      auto t = weak.lock();
      if (!t) return;
      t->status = st;
      for (const auto& x : hdrs) {
        if (x.name == "sockmesh-error") t->error_header = x.value;
      }
    };
    h.on_data = [weak](const uint8_t* d, size_t n) {
      auto t = weak.lock();
      if (!t) return;
      t->data.append(reinterpret_cast<const char*>(d), n);
      t->stream->consume(n);
    };
    h.on_end = [weak] {
      if (auto t = weak.lock()) t->ended = true;
    };
    h.on_close = [weak](uint32_t code) {
      if (auto t = weak.lock()) t->closed = static_cast<int>(code);
    };
    t->stream = c.open_connect(authority, {}, std::move(h));
    EXPECT_NE(t->stream, nullptr);
    return t;
  }
  uint64_t counter(const std::string& name, const observe::Labels& labels = {}) {
    return metrics_.counter(name, "", labels).value();
  }

  std::string block_, server_ip_, client_ip_;
  std::filesystem::path dir_;
  std::shared_ptr<identity::BuiltinCa> ca_;
  std::unique_ptr<Worker> worker_;
  Worker* worker_raw_ = nullptr;
  std::unique_ptr<EchoApp> app_;
  state::StateStore store_;
  observe::Registry metrics_;
  ProxyContext ctx_;
  std::unique_ptr<InboundHbone> inbound_;
  std::unique_ptr<Tcp::acceptor> listener_;
  std::vector<std::shared_ptr<h2::H2Connection>> clients_;
};

TEST_F(InboundTest, AuthorizedConnectEchoesAndHalfClosesBothWays) {
  start_inbound();
  auto c = connect_client();
  ASSERT_NE(c, nullptr);
  auto t = open(*c, server_ip_ + ":" + std::to_string(app_->port()));
  ASSERT_TRUE(run_until([&] { return t->status != 0; }));
  ASSERT_EQ(t->status, 200) << t->error_header;
  std::string payload(100000, 'q');
  t->stream->send(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
  t->stream->finish();  // the app sees EOF, answers everything, and ends too
  ASSERT_TRUE(run_until([&] { return t->closed >= 0; }));
  EXPECT_EQ(t->data, payload);
  EXPECT_TRUE(t->ended);
  EXPECT_EQ(t->closed, 0);
  EXPECT_TRUE(c->usable());
}

TEST_F(InboundTest, RefusalsCarryTheirStatusAndKeepTheConnection) {
  start_inbound();
  auto c = connect_client();
  ASSERT_NE(c, nullptr);
  // Nothing listens on this port of the server (the echo app's port + 1 is unlikely to be open).
  uint16_t closed_port = static_cast<uint16_t>(app_->port() == 65535 ? 1 : app_->port() + 1);
  const std::map<std::string, int> cases = {
      {"not-an-endpoint", 400},
      {block_ + ".99:8080", 404},                             // no workload there
      {block_ + ".30:8080", 421},                             // another workload than the TLS one
      {server_ip_ + ":15008", 508},                           // the proxy's own port
      {server_ip_ + ":" + std::to_string(closed_port), 503},  // the app refuses
  };
  for (const auto& [authority, want] : cases) {
    auto t = open(*c, authority);
    ASSERT_TRUE(run_until([&] { return t->closed >= 0; })) << authority;
    EXPECT_EQ(t->status, want) << authority << ": " << t->error_header;
    EXPECT_FALSE(t->error_header.empty()) << authority;
  }
  EXPECT_TRUE(c->usable());
  auto ok = open(*c, server_ip_ + ":" + std::to_string(app_->port()));
  ASSERT_TRUE(run_until([&] { return ok->status != 0; }));
  EXPECT_EQ(ok->status, 200);
}

TEST_F(InboundTest, DeniedEverywhereGets403AndLosesItsConnection) {
  start_inbound(
      "- name: deny-client\n  namespace: default\n  scope: Namespace\n  action: Deny\n"
      "  rules:\n  - - - principals: [\"cluster.local/ns/default/sa/client\"]\n");
  auto c = connect_client();
  ASSERT_NE(c, nullptr);
  auto t = open(*c, server_ip_ + ":" + std::to_string(app_->port()));
  ASSERT_TRUE(run_until([&] { return t->closed >= 0; }));
  EXPECT_EQ(t->status, 403);
  EXPECT_TRUE(run_until([&] { return !c->usable(); }, 3000ms)) << "GOAWAY after the refusal";
  EXPECT_EQ(counter("sockmesh_hbone_denied_connections_closed_total"), 1u);
}

TEST_F(InboundTest, ClientWithoutCertificateIsNotServed) {
  start_inbound();
  std::string failure;
  auto c = connect_client("", &failure);
  EXPECT_EQ(c, nullptr);
  EXPECT_FALSE(failure.empty());
  EXPECT_TRUE(run_until([&] {
    return counter("sockmesh_tls_handshake_failures_total", {{"direction", "inbound"}}) == 1;
  }));
}

TEST_F(InboundTest, ConnectionsOverThePerSourceCapAreClosedBeforeTls) {
  start_inbound("", /*per_source=*/1);
  auto first = connect_client();
  ASSERT_NE(first, nullptr);
  std::string failure;
  EXPECT_EQ(connect_client("client", &failure), nullptr);
  EXPECT_EQ(counter("sockmesh_hbone_connections_refused_total", {{"reason", "per_source"}}), 1u)
      << failure;
  EXPECT_EQ(counter("sockmesh_tls_handshake_failures_total", {{"direction", "inbound"}}), 0u)
      << "no TLS work for a refused connection";
  // Its place comes back when it closes.
  first->abort("done");
  run_until([&] { return ctx_.hbone_limits->open() == 0; });
  EXPECT_NE(connect_client(), nullptr);
}

}  // namespace
}  // namespace sockmesh::proxy
