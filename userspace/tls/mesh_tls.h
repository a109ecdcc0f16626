#pragma once
// TLS for HBONE: TLS 1.3 only, ALPN "h2", mutual authentication with X.509-SVIDs issued by the
// mesh roots. Which certificate a connection presents is decided per connection (by workload
// IP), not per context, so one context serves every workload on the node.
//
// The trust roots are not copied into the contexts: each handshake verifies the peer's chain
// against the bundle current at that moment, taken from a RootsSource (the certificate cache,
// which re-reads a mounted root-cert.pem). A rotated bundle therefore applies to the next
// handshake; established connections are not re-verified and keep running. A new bundle that
// is not usable (empty, a certificate that is not a CA, an expired one) is refused with a log
// line and the previous one stays in force.
#include <openssl/ssl.h>

#include <boost/asio/ssl/context.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "identity/certificate.h"
#include "identity/issuer.h"
#include "identity/spiffe.h"
#include "identity/verify.h"

namespace sockmesh::tls {

// What the verify callback learnt about the peer; attached to an SSL during its handshake so
// that a failed handshake can say why in words (and in a metric label).
struct PeerCheck {
  std::string failure;  // empty while nothing failed
};

class MeshTls {
 public:
  // The bundle in force now; asked on every handshake, so it must be cheap (no I/O).
  using RootsSource = std::function<identity::TrustRootsPtr()>;

  // Throws std::runtime_error if the roots cannot be used (a start-up configuration error).
  MeshTls(std::string trust_domain, const identity::X509List& roots);
  MeshTls(std::string trust_domain, RootsSource roots);
  ~MeshTls();
  MeshTls(const MeshTls&) = delete;
  MeshTls& operator=(const MeshTls&) = delete;

  // Takes the source's bundle if it is a new one and usable. Handshakes call this themselves;
  // it is public for tests and for callers that want the refusal reason. Returns the reason a
  // new bundle was refused (once per bundle), nullopt otherwise.
  std::optional<std::string> refresh_roots();
  // The bundle handshakes verify against now.
  identity::TrustRootsPtr roots() const;
  // How many bundles have been installed (1 after construction); bumps on each accepted swap.
  uint64_t roots_generation() const;

  boost::asio::ssl::context& server() { return server_; }
  boost::asio::ssl::context& client() { return client_; }
  const std::string& trust_domain() const { return trust_domain_; }
  // Why an unusable bundle is unusable, nullopt when it is fine (exposed for tests).
  static std::optional<std::string> check_bundle(const identity::X509List& roots);

  // Present `cert` on this connection. Call before the handshake.
  static std::optional<std::string> use_certificate(SSL* ssl, const identity::CertifiedKey& cert);
  // Attach `check` for the handshake's duration (the caller keeps it alive until then).
  static void attach_peer_check(SSL* ssl, PeerCheck* check);
  // After the handshake: the peer's verified identity.
  static std::optional<identity::SpiffeId> peer_identity(SSL* ssl);
  static std::string negotiated_alpn(SSL* ssl);
  // Text of the OpenSSL error queue and the verify result, for logs.
  static std::string describe_failure(SSL* ssl, const std::string& asio_message);

 private:
  struct RootSet;
  void configure_common(SSL_CTX* ctx);
  std::shared_ptr<const RootSet> current();
  static int verify_chain(X509_STORE_CTX* store, void* self);

  std::string trust_domain_;
  RootsSource source_;
  boost::asio::ssl::context server_;
  boost::asio::ssl::context client_;

  mutable std::mutex mu_;
  std::shared_ptr<const RootSet> roots_;
  identity::TrustRootsPtr last_offered_;  // the source's latest bundle, installed or refused
  uint64_t generation_ = 0;
};

}  // namespace sockmesh::tls
