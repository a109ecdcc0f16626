// MeshTls over real loopback TCP: each test drives a client and a server SSL through a real
// handshake (non-blocking sockets, one thread) and looks at what each side concluded.
#include "tls/mesh_tls.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "../identity/test_util.h"

namespace sockmesh::tls {
namespace {

using identity::CertifiedKeyPtr;
using identity::EvpPkeyPtr;
using identity::X509List;
using identity::X509Ptr;
using identity::testing::LeafSpec;
using identity::testing::make_cert;
using identity::testing::make_p256_key;
using std::chrono::hours;

constexpr char kTrustDomain[] = "cluster.local";
constexpr char kClientId[] = "spiffe://cluster.local/ns/default/sa/client";
constexpr char kServerId[] = "spiffe://cluster.local/ns/default/sa/server";

struct Ca {
  EvpPkeyPtr key;
  X509Ptr cert;
};

Ca make_ca(const std::string& org, hours valid_for = hours(24)) {
  Ca ca{make_p256_key(), nullptr};
  LeafSpec spec;
  spec.is_ca = true;
  spec.organization = org;
  spec.not_before = std::chrono::system_clock::now() - hours(48);
  spec.not_after = std::chrono::system_clock::now() + valid_for;
  ca.cert = make_cert(spec, ca.key.get(), nullptr, ca.key.get());
  return ca;
}

struct RawLeaf {
  X509Ptr cert;
  EvpPkeyPtr key;
};

RawLeaf raw_leaf(const Ca& ca, std::vector<std::string> uris, std::vector<std::string> dns = {}) {
  RawLeaf l{nullptr, make_p256_key()};
  LeafSpec spec;
  spec.uris = std::move(uris);
  spec.dns = std::move(dns);
  spec.not_before = std::chrono::system_clock::now() - hours(1);
  spec.not_after = std::chrono::system_clock::now() + hours(12);
  l.cert = make_cert(spec, l.key.get(), ca.cert.get(), ca.key.get());
  return l;
}

CertifiedKeyPtr leaf(const Ca& ca, const std::string& id) {
  RawLeaf l = raw_leaf(ca, {id});
  auto key = identity::CertifiedKey::create(std::move(l.cert), {}, std::move(l.key));
  if (!key) throw std::runtime_error(key.error().message);
  return *key;
}

identity::TrustRootsPtr bundle(std::initializer_list<const Ca*> cas) {
  auto list = std::make_shared<X509List>();
  for (const Ca* ca : cas) list->push_back(identity::share(ca->cert.get()));
  return list;
}

// A trust-root source the test can swap, as the certificate cache does on rotation.
class SwappableRoots {
 public:
  explicit SwappableRoots(identity::TrustRootsPtr r) : roots_(std::move(r)) {}
  void set(identity::TrustRootsPtr r) {
    std::lock_guard lock(mu_);
    roots_ = std::move(r);
  }
  MeshTls::RootsSource source() {
    return [this] {
      std::lock_guard lock(mu_);
      return roots_;
    };
  }

 private:
  std::mutex mu_;
  identity::TrustRootsPtr roots_;
};

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// A connected pair of non-blocking TCP sockets over 127.0.0.1.
std::pair<std::unique_ptr<Fd>, std::unique_ptr<Fd>> loopback_pair() {
  Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener.fd, 1) != 0 ||
      ::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error("loopback listener");
  }
  auto client = std::make_unique<Fd>(::socket(AF_INET, SOCK_STREAM, 0));
  if (::connect(client->fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw std::runtime_error("loopback connect");
  }
  auto server = std::make_unique<Fd>(::accept(listener.fd, nullptr, nullptr));
  if (server->fd < 0) throw std::runtime_error("loopback accept");
  for (int fd : {client->fd, server->fd}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return {std::move(client), std::move(server)};
}

struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};
using SslPtr = std::unique_ptr<SSL, SslFree>;

// One TLS connection over loopback: the two ends and what their handshakes concluded.
struct Session {
  std::unique_ptr<Fd> client_fd, server_fd;
  SslPtr client, server;
  PeerCheck client_check, server_check;
  bool client_ok = false, server_ok = false;
  std::string client_error, server_error;  // OpenSSL's error queue when a side failed

  Session(SSL_CTX* client_ctx, SSL_CTX* server_ctx) {
    std::tie(client_fd, server_fd) = loopback_pair();
    client.reset(SSL_new(client_ctx));
    server.reset(SSL_new(server_ctx));
    SSL_set_fd(client.get(), client_fd->fd);
    SSL_set_fd(server.get(), server_fd->fd);
    SSL_set_connect_state(client.get());
    SSL_set_accept_state(server.get());
    MeshTls::attach_peer_check(client.get(), &client_check);
    MeshTls::attach_peer_check(server.get(), &server_check);
  }
  ~Session() {
    MeshTls::attach_peer_check(client.get(), nullptr);
    MeshTls::attach_peer_check(server.get(), nullptr);
  }

  // Steps both handshakes until each has finished or failed (bounded: 5 s, 1000 rounds).
  void handshake() {
    enum State { kRunning, kDone, kFailed };
    State c = kRunning, s = kRunning;
    auto step = [](SSL* ssl, State* st, bool* ok, std::string* error) {
      if (*st != kRunning) return;
      ERR_clear_error();
      int rc = SSL_do_handshake(ssl);
      if (rc == 1) {
        *st = kDone;
        *ok = true;
        return;
      }
      int err = SSL_get_error(ssl, rc);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return;
      *st = kFailed;
      char buf[256];
      unsigned long e;
      while ((e = ERR_get_error()) != 0) {
        ERR_error_string_n(e, buf, sizeof buf);
        *error += std::string(buf) + ";";
      }
      if (error->empty()) *error = "SSL_get_error " + std::to_string(err);
    };
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (int round = 0; round < 1000 && std::chrono::steady_clock::now() < deadline; ++round) {
      step(client.get(), &c, &client_ok, &client_error);
      step(server.get(), &s, &server_ok, &server_error);
      if (c != kRunning && s != kRunning) return;
      // TLS 1.3: the client is done before the server has checked its certificate; once
      // either side failed, the other cannot finish either.
      if ((c == kFailed || s == kFailed) && round > 50) return;
      pollfd fds[2] = {{client_fd->fd, POLLIN, 0}, {server_fd->fd, POLLIN, 0}};
      ::poll(fds, 2, 10);
    }
  }

  // Sends `text` from one end and reads it at the other; true when it arrived intact.
  static bool exchange(SSL* from, SSL* to, const std::string& text) {
    if (SSL_write(from, text.data(), static_cast<int>(text.size())) !=
        static_cast<int>(text.size())) {
      return false;
    }
    std::string got;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (got.size() < text.size() && std::chrono::steady_clock::now() < deadline) {
      char buf[256];
      int n = SSL_read(to, buf, sizeof buf);
      if (n > 0) {
        got.append(buf, n);
        continue;
      }
      int err = SSL_get_error(to, n);
      if (err != SSL_ERROR_WANT_READ) return false;
      pollfd p{SSL_get_fd(to), POLLIN, 0};
      ::poll(&p, 1, 10);
    }
    return got == text;
  }
};

// A MeshTls pair (client side, server side) with certificates set per connection.
class MeshTlsTest : public ::testing::Test {
 protected:
  Ca mesh_ = make_ca("mesh");
  Ca other_ = make_ca("other");
  CertifiedKeyPtr client_cert_ = leaf(mesh_, kClientId);
  CertifiedKeyPtr server_cert_ = leaf(mesh_, kServerId);
  MeshTls tls_{kTrustDomain, *bundle({&mesh_})};

  std::unique_ptr<Session> mesh_session(MeshTls& client_tls, const CertifiedKeyPtr& client_cert,
                                        MeshTls& server_tls, const CertifiedKeyPtr& server_cert) {
    auto s = std::make_unique<Session>(client_tls.client().native_handle(),
                                       server_tls.server().native_handle());
    EXPECT_EQ(MeshTls::use_certificate(s->client.get(), *client_cert), std::nullopt);
    EXPECT_EQ(MeshTls::use_certificate(s->server.get(), *server_cert), std::nullopt);
    s->handshake();
    return s;
  }

  // A plain OpenSSL client context (TLS 1.3, ALPN h2, verifying nothing) that tests bend.
  static SSL_CTX* plain_client() {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
    static const unsigned char h2[] = {2, 'h', '2'};
    SSL_CTX_set_alpn_protos(ctx, h2, sizeof h2);
    return ctx;
  }
  struct CtxFree {
    void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
  };
  using CtxPtr = std::unique_ptr<SSL_CTX, CtxFree>;

  std::unique_ptr<Session> plain_client_session(SSL_CTX* client_ctx, RawLeaf* client_leaf) {
    auto s = std::make_unique<Session>(client_ctx, tls_.server().native_handle());
    if (client_leaf != nullptr) {
      EXPECT_EQ(SSL_use_certificate(s->client.get(), client_leaf->cert.get()), 1);
      EXPECT_EQ(SSL_use_PrivateKey(s->client.get(), client_leaf->key.get()), 1);
    }
    EXPECT_EQ(MeshTls::use_certificate(s->server.get(), *server_cert_), std::nullopt);
    s->handshake();
    return s;
  }
};

TEST_F(MeshTlsTest, ContextsAreTls13Only) {
  for (SSL_CTX* ctx : {tls_.client().native_handle(), tls_.server().native_handle()}) {
    EXPECT_EQ(SSL_CTX_get_min_proto_version(ctx), TLS1_3_VERSION);
    EXPECT_EQ(SSL_CTX_get_max_proto_version(ctx), TLS1_3_VERSION);
    EXPECT_NE(SSL_CTX_get_options(ctx) & SSL_OP_NO_TICKET, 0u) << "resumption would skip checks";
  }
  // A client that stops at TLS 1.2 gets no connection.
  CtxPtr old(plain_client());
  SSL_CTX_set_max_proto_version(old.get(), TLS1_2_VERSION);
  RawLeaf l = raw_leaf(mesh_, {kClientId});
  auto s = plain_client_session(old.get(), &l);
  EXPECT_FALSE(s->server_ok);
  EXPECT_NE(s->server_error.find("protocol"), std::string::npos) << s->server_error;
}

TEST_F(MeshTlsTest, MutualHandshakeNamesBothPeers) {
  auto s = mesh_session(tls_, client_cert_, tls_, server_cert_);
  ASSERT_TRUE(s->client_ok) << s->client_error << s->client_check.failure;
  ASSERT_TRUE(s->server_ok) << s->server_error << s->server_check.failure;
  EXPECT_EQ(SSL_version(s->client.get()), TLS1_3_VERSION);
  EXPECT_EQ(MeshTls::negotiated_alpn(s->client.get()), "h2");
  EXPECT_EQ(MeshTls::negotiated_alpn(s->server.get()), "h2");
  auto client_seen = MeshTls::peer_identity(s->server.get());
  auto server_seen = MeshTls::peer_identity(s->client.get());
  ASSERT_TRUE(client_seen && server_seen);
  EXPECT_EQ(client_seen->to_string(), kClientId);
  EXPECT_EQ(server_seen->to_string(), kServerId);
  EXPECT_TRUE(Session::exchange(s->client.get(), s->server.get(), "ping"));
  EXPECT_TRUE(Session::exchange(s->server.get(), s->client.get(), "pong"));
}

TEST_F(MeshTlsTest, ServerRequiresAClientCertificate) {
  CtxPtr anon(plain_client());
  auto s = plain_client_session(anon.get(), nullptr);
  EXPECT_FALSE(s->server_ok);
  EXPECT_NE(s->server_error.find("certificate"), std::string::npos) << s->server_error;
  EXPECT_EQ(MeshTls::peer_identity(s->server.get()), std::nullopt);
}

TEST_F(MeshTlsTest, ServerRequiresAlpnH2) {
  CtxPtr http1(plain_client());
  static const unsigned char h1[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  SSL_CTX_set_alpn_protos(http1.get(), h1, sizeof h1);
  RawLeaf l = raw_leaf(mesh_, {kClientId});
  auto s = plain_client_session(http1.get(), &l);
  EXPECT_FALSE(s->server_ok);
  EXPECT_EQ(MeshTls::describe_failure(s->server.get(), "asio"), "client did not offer ALPN h2");
}

TEST_F(MeshTlsTest, ClientFromAnotherCaIsRejected) {
  RawLeaf l = raw_leaf(other_, {kClientId});
  CtxPtr c(plain_client());
  auto s = plain_client_session(c.get(), &l);
  EXPECT_FALSE(s->server_ok);
  EXPECT_EQ(s->server_check.failure.rfind("peer certificate rejected: ", 0), 0u)
      << s->server_check.failure;
  EXPECT_EQ(MeshTls::describe_failure(s->server.get(), "asio"), s->server_check.failure);
}

TEST_F(MeshTlsTest, ClientFromAnotherTrustDomainIsRejected) {
  RawLeaf l = raw_leaf(mesh_, {"spiffe://evil.example/ns/default/sa/client"});
  CtxPtr c(plain_client());
  auto s = plain_client_session(c.get(), &l);
  EXPECT_FALSE(s->server_ok);
  EXPECT_NE(s->server_check.failure.find("cluster.local"), std::string::npos)
      << s->server_check.failure;
}

TEST_F(MeshTlsTest, ClientWithoutSpiffeIdIsRejected) {
  RawLeaf l = raw_leaf(mesh_, {}, {"client.example"});
  CtxPtr c(plain_client());
  auto s = plain_client_session(c.get(), &l);
  EXPECT_FALSE(s->server_ok);
  EXPECT_FALSE(s->server_check.failure.empty());
}

TEST_F(MeshTlsTest, ClientRejectsServerFromAnotherCa) {
  MeshTls foreign(kTrustDomain, *bundle({&other_}));
  auto s = mesh_session(tls_, client_cert_, foreign, leaf(other_, kServerId));
  EXPECT_FALSE(s->client_ok);
  EXPECT_EQ(s->client_check.failure.rfind("peer certificate rejected: ", 0), 0u)
      << s->client_check.failure;
}

TEST(MeshTlsRoots, UnusableBundlesAreRefusedAtStart) {
  EXPECT_THROW(MeshTls(kTrustDomain, X509List{}), std::runtime_error);
  Ca ca = make_ca("mesh");
  RawLeaf not_a_ca = raw_leaf(ca, {kClientId});
  X509List list;
  list.push_back(identity::share(not_a_ca.cert.get()));
  EXPECT_THROW(MeshTls(kTrustDomain, list), std::runtime_error);
  EXPECT_EQ(MeshTls::check_bundle(*bundle({&ca})), std::nullopt);
}

// Rotation as operators do it: the old root, then both, then the new one alone. Handshakes
// follow the bundle in force; an established connection carries on through every step; a bad
// bundle changes nothing.
TEST(MeshTlsRoots, ReloadAppliesToNewHandshakesOnly) {
  Ca old_ca = make_ca("old-root");
  Ca new_ca = make_ca("new-root");
  SwappableRoots server_roots(bundle({&old_ca}));
  MeshTls server(kTrustDomain, server_roots.source());
  MeshTls client(kTrustDomain, *bundle({&old_ca, &new_ca}));  // trusts the server throughout
  CertifiedKeyPtr server_cert = leaf(old_ca, kServerId);
  CertifiedKeyPtr old_client = leaf(old_ca, kClientId);
  CertifiedKeyPtr new_client = leaf(new_ca, kClientId);
  auto connect = [&](const CertifiedKeyPtr& client_cert) {
    auto s =
        std::make_unique<Session>(client.client().native_handle(), server.server().native_handle());
    MeshTls::use_certificate(s->client.get(), *client_cert);
    MeshTls::use_certificate(s->server.get(), *server_cert);
    s->handshake();
    return s;
  };

  auto live = connect(old_client);
  ASSERT_TRUE(live->server_ok) << live->server_error;
  EXPECT_FALSE(connect(new_client)->server_ok) << "new root not trusted yet";
  EXPECT_EQ(server.roots_generation(), 1u);

  server_roots.set(bundle({&old_ca, &new_ca}));
  EXPECT_TRUE(connect(old_client)->server_ok);
  EXPECT_TRUE(connect(new_client)->server_ok);
  EXPECT_EQ(server.roots_generation(), 2u);
  EXPECT_EQ(server.roots()->size(), 2u);

  server_roots.set(bundle({&new_ca}));
  auto refused = connect(old_client);
  EXPECT_FALSE(refused->server_ok);
  EXPECT_EQ(refused->server_check.failure.rfind("peer certificate rejected", 0), 0u);
  EXPECT_TRUE(connect(new_client)->server_ok);
  EXPECT_EQ(server.roots_generation(), 3u);
  // Not re-verified: the connection made under the old root still carries bytes.
  EXPECT_TRUE(Session::exchange(live->client.get(), live->server.get(), "still here"));
  EXPECT_TRUE(Session::exchange(live->server.get(), live->client.get(), "and back"));

  // Unusable bundles: each refused with its reason, the new root alone stays in force.
  RawLeaf not_a_ca = raw_leaf(new_ca, {kClientId});
  auto leaf_bundle = std::make_shared<X509List>();
  leaf_bundle->push_back(identity::share(not_a_ca.cert.get()));
  Ca expired = make_ca("expired-root", hours(-1));
  const std::pair<identity::TrustRootsPtr, std::string> bad[] = {
      {std::make_shared<X509List>(), "no certificates"},
      {leaf_bundle, "is not a CA"},
      {bundle({&new_ca, &expired}), "has expired"},
      {nullptr, "no trust roots"},
  };
  for (const auto& [roots, why] : bad) {
    server_roots.set(roots);
    auto refusal = server.refresh_roots();
    ASSERT_TRUE(refusal.has_value()) << why;
    EXPECT_NE(refusal->find(why), std::string::npos) << *refusal;
    EXPECT_EQ(server.refresh_roots(), std::nullopt) << "refused once, not on every handshake";
    EXPECT_TRUE(connect(new_client)->server_ok) << why;
    EXPECT_FALSE(connect(old_client)->server_ok) << why;
    EXPECT_EQ(server.roots_generation(), 3u);
  }
}

}  // namespace
}  // namespace sockmesh::tls
