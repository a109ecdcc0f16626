#pragma once
// TLS for HBONE: TLS 1.3 only, ALPN "h2", mutual authentication with X.509-SVIDs issued by the
// mesh roots. Which certificate a connection presents is decided per connection (by workload
// IP), not per context, so one context serves every workload on the node.
#include <openssl/ssl.h>

#include <boost/asio/ssl/context.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "identity/certificate.h"
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
  // Throws std::runtime_error if the roots cannot be loaded (a start-up configuration error).
  MeshTls(std::string trust_domain, const identity::X509List& roots);

  boost::asio::ssl::context& server() { return server_; }
  boost::asio::ssl::context& client() { return client_; }
  const std::string& trust_domain() const { return trust_domain_; }

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
  void configure_common(SSL_CTX* ctx, const identity::X509List& roots);

  std::string trust_domain_;
  boost::asio::ssl::context server_;
  boost::asio::ssl::context client_;
};

}  // namespace sockmesh::tls
