#include "tls/mesh_tls.h"

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include <cstring>
#include <stdexcept>

#include "base/log.h"

namespace sockmesh::tls {
namespace {

constexpr unsigned char kAlpnH2[] = {2, 'h', '2'};
constexpr std::string_view kScope = "tls";

int trust_domain_index() {
  static int idx = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return idx;
}
int peer_check_index() {
  static int idx = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return idx;
}

void fail_check(SSL* ssl, const std::string& why) {
  auto* check = static_cast<PeerCheck*>(SSL_get_ex_data(ssl, peer_check_index()));
  if (check != nullptr && check->failure.empty()) check->failure = why;
}

// Chain verification is OpenSSL's; on top, the leaf must carry a SPIFFE ID in our trust domain.
int verify_peer(int preverify_ok, X509_STORE_CTX* store) {
  auto* ssl = static_cast<SSL*>(
      X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  if (ssl == nullptr) return 0;
  if (preverify_ok == 0) {
    int err = X509_STORE_CTX_get_error(store);
    fail_check(ssl, std::string("peer certificate rejected: ") +
                        X509_verify_cert_error_string(err));
    return 0;
  }
  if (X509_STORE_CTX_get_error_depth(store) != 0) return 1;
  auto* td = static_cast<std::string*>(
      SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), trust_domain_index()));
  if (td == nullptr) return 0;  // every MeshTls context carries its trust domain
  auto id = identity::check_trust_domain(X509_STORE_CTX_get_current_cert(store), *td);
  if (!id) {
    fail_check(ssl, id.error().message);
    X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION);
    return 0;
  }
  return 1;
}

int select_h2(SSL* ssl, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
              unsigned int inlen, void*) {
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, outlen, kAlpnH2, sizeof kAlpnH2, in, inlen) !=
      OPENSSL_NPN_NEGOTIATED) {
    fail_check(ssl, "client did not offer ALPN h2");
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

// One accepted bundle, with the stack X509_STORE_CTX_set0_trusted_stack wants (shared
// references). A handshake holds the set for as long as it verifies against it.
struct MeshTls::RootSet {
  identity::TrustRootsPtr bundle;
  identity::X509StackPtr stack;
  explicit RootSet(identity::TrustRootsPtr b)
      : bundle(std::move(b)), stack(identity::to_stack(*bundle)) {
    if (!stack) throw std::bad_alloc();
  }
};

std::optional<std::string> MeshTls::check_bundle(const identity::X509List& roots) {
  return identity::check_trust_bundle(roots, std::chrono::system_clock::now());
}

MeshTls::MeshTls(std::string trust_domain, const identity::X509List& roots)
    : MeshTls(std::move(trust_domain), [fixed = std::make_shared<const identity::X509List>(
                                            identity::share_all(roots))] { return fixed; }) {}

MeshTls::MeshTls(std::string trust_domain, RootsSource roots)
    : trust_domain_(std::move(trust_domain)),
      source_(std::move(roots)),
      server_(boost::asio::ssl::context::tls_server),
      client_(boost::asio::ssl::context::tls_client) {
  identity::TrustRootsPtr first = source_ ? source_() : nullptr;
  if (!first || first->empty()) throw std::runtime_error("TLS: no trust roots");
  if (auto why = check_bundle(*first)) throw std::runtime_error("TLS: trust roots: " + *why);
  roots_ = std::make_shared<const RootSet>(first);
  last_offered_ = first;
  generation_ = 1;
  configure_common(server_.native_handle());
  configure_common(client_.native_handle());
  SSL_CTX* s = server_.native_handle();
  SSL_CTX_set_verify(s, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, verify_peer);
  SSL_CTX_set_alpn_select_cb(s, select_h2, nullptr);
  SSL_CTX* c = client_.native_handle();
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER, verify_peer);
  if (SSL_CTX_set_alpn_protos(c, kAlpnH2, sizeof kAlpnH2) != 0) {
    throw std::runtime_error("TLS: cannot set ALPN");
  }
}

MeshTls::~MeshTls() = default;

void MeshTls::configure_common(SSL_CTX* ctx) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  // AES-128-GCM first: the fastest AEAD on CPUs with AES-NI, and still 128-bit security.
  SSL_CTX_set_ciphersuites(ctx,
                           "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                           "TLS_CHACHA20_POLY1305_SHA256");
  // Identity is checked on every handshake; resumption would skip that, so it is off.
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  // The context's own store stays empty: verify_chain hands each handshake the current bundle.
  SSL_CTX_set_cert_verify_callback(ctx, verify_chain, this);
  SSL_CTX_set_ex_data(ctx, trust_domain_index(), &trust_domain_);
}

int MeshTls::verify_chain(X509_STORE_CTX* store, void* self) {
  std::shared_ptr<const RootSet> roots = static_cast<MeshTls*>(self)->current();
  X509_STORE_CTX_set0_trusted_stack(store, roots->stack.get());
  return X509_verify_cert(store);  // `roots` outlives the verification
}

std::optional<std::string> MeshTls::refresh_roots() {
  identity::TrustRootsPtr offered = source_();
  std::optional<std::string> why;
  uint64_t generation = 0;
  {
    // Held throughout: two handshakes seeing two successive bundles must not install the older
    // one last. Checking and building the stack is cheap, and happens once per bundle.
    std::lock_guard lock(mu_);
    if (offered == last_offered_) return std::nullopt;
    last_offered_ = offered;
    why = offered ? check_bundle(*offered) : "the certificate source has no trust roots";
    if (!why) {
      roots_ = std::make_shared<const RootSet>(offered);
      generation = ++generation_;
    }
  }
  if (why) {
    SM_WARN(kScope) << "refusing new trust roots, still verifying peers against the previous "
                       "bundle: "
                    << *why;
    return why;
  }
  std::string subjects;
  for (const auto& c : *offered) {
    subjects += (subjects.empty() ? "" : ", ") + identity::subject_string(c.get()) +
                " sha256=" + identity::fingerprint_sha256(c.get()).substr(0, 16);
  }
  SM_INFO(kScope) << "trust roots replaced (generation " << generation << ", " << offered->size()
                  << " certificates: " << subjects
                  << "); new handshakes verify against them, established connections continue";
  return std::nullopt;
}

std::shared_ptr<const MeshTls::RootSet> MeshTls::current() {
  refresh_roots();
  std::lock_guard lock(mu_);
  return roots_;
}

identity::TrustRootsPtr MeshTls::roots() const {
  std::lock_guard lock(mu_);
  return roots_->bundle;
}

uint64_t MeshTls::roots_generation() const {
  std::lock_guard lock(mu_);
  return generation_;
}

std::optional<std::string> MeshTls::use_certificate(SSL* ssl, const identity::CertifiedKey& cert) {
  if (SSL_use_certificate(ssl, cert.leaf()) != 1) return "SSL_use_certificate failed";
  if (SSL_use_PrivateKey(ssl, cert.private_key()) != 1) return "SSL_use_PrivateKey failed";
  SSL_clear_chain_certs(ssl);
  for (const auto& c : cert.chain()) {
    if (SSL_add1_chain_cert(ssl, c.get()) != 1) return "SSL_add1_chain_cert failed";
  }
  return std::nullopt;
}

void MeshTls::attach_peer_check(SSL* ssl, PeerCheck* check) {
  SSL_set_ex_data(ssl, peer_check_index(), check);
}

std::optional<identity::SpiffeId> MeshTls::peer_identity(SSL* ssl) {
  X509* peer = SSL_get0_peer_certificate(ssl);
  if (peer == nullptr || SSL_get_verify_result(ssl) != X509_V_OK) return std::nullopt;
  auto id = identity::spiffe_id_of(peer);
  if (!id) return std::nullopt;
  return *id;
}

std::string MeshTls::negotiated_alpn(SSL* ssl) {
  const unsigned char* data = nullptr;
  unsigned int len = 0;
  SSL_get0_alpn_selected(ssl, &data, &len);
  return std::string(reinterpret_cast<const char*>(data), len);
}

std::string MeshTls::describe_failure(SSL* ssl, const std::string& asio_message) {
  auto* check = static_cast<PeerCheck*>(SSL_get_ex_data(ssl, peer_check_index()));
  if (check != nullptr && !check->failure.empty()) return check->failure;
  return asio_message;
}

}  // namespace sockmesh::tls
