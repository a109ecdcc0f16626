#pragma once
// A workload certificate with its private key, as handed to the TLS layer.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "identity/ossl.h"
#include "identity/result.h"
#include "identity/spiffe.h"

namespace sockmesh::identity {

using TimePoint = std::chrono::system_clock::time_point;
// Source of "now". Injected wherever validity periods matter so that tests can move time
// instead of sleeping; an empty function means the system clock.
using Clock = std::function<TimePoint()>;
inline TimePoint now_from(const Clock& clock) {
  return clock ? clock() : std::chrono::system_clock::now();
}

class CertifiedKey;
// Shared and immutable: a renewal makes a new object, so a connection that took a pointer at
// handshake time keeps a consistent certificate and key for as long as it lives.
using CertifiedKeyPtr = std::shared_ptr<const CertifiedKey>;

class CertifiedKey {
 public:
  // Takes ownership of the parts and checks them: the key must belong to the leaf and the leaf
  // must carry exactly one workload SPIFFE ID (see spiffe_id_of). The chain is the leaf's
  // issuers in order, leaf's issuer first; it does not contain the leaf and normally not the
  // root either.
  static Result<CertifiedKeyPtr> create(X509Ptr leaf, X509List chain, EvpPkeyPtr key);
  // cert_chain_pem: leaf first, then intermediates (the layout of Istio's cert-chain.pem).
  // key_pem: PKCS#8 or traditional; encrypted keys are rejected rather than prompting.
  static Result<CertifiedKeyPtr> from_pem(std::string_view cert_chain_pem,
                                          std::string_view key_pem);

  CertifiedKey(const CertifiedKey&) = delete;
  CertifiedKey& operator=(const CertifiedKey&) = delete;

  // Non-const pointers because OpenSSL's setters (SSL_use_certificate, ...) take them; callers
  // must treat the objects as read-only and X509_up_ref/EVP_PKEY_up_ref them to keep them.
  X509* leaf() const { return leaf_.get(); }
  const X509List& chain() const { return chain_; }
  EVP_PKEY* private_key() const { return key_.get(); }

  const SpiffeId& spiffe_id() const { return spiffe_id_; }
  // The SPIFFE ID as a string ("spiffe://td/ns/x/sa/y").
  const std::string& identity() const { return identity_; }
  TimePoint not_before() const { return not_before_; }
  TimePoint not_after() const { return not_after_; }
  // Lowercase hex, no separators; for logs and the admin config dump.
  const std::string& serial() const { return serial_; }

  bool valid_at(TimePoint t) const { return t >= not_before_ && t < not_after_; }
  // The point `fraction` of the way from not_before to not_after (0.5 = half-life).
  TimePoint refresh_at(double fraction) const;

  // Leaf then chain, PEM-encoded.
  std::string cert_chain_pem() const;
  // Unencrypted PKCS#8. Only for writing to a 0600 file or a trusted local channel.
  std::string private_key_pem() const;

 private:
  CertifiedKey(X509Ptr leaf, X509List chain, EvpPkeyPtr key, SpiffeId id, TimePoint not_before,
               TimePoint not_after, std::string serial);

  X509Ptr leaf_;
  X509List chain_;
  EvpPkeyPtr key_;
  SpiffeId spiffe_id_;
  std::string identity_;
  TimePoint not_before_;
  TimePoint not_after_;
  std::string serial_;
};

// ---- PEM and certificate helpers ----

// Every CERTIFICATE block in order. Fails on an empty input or on a damaged block, so that a
// file caught half-written is not mistaken for a shorter chain.
Result<X509List> certificates_from_pem(std::string_view pem);
// The single private key in the input.
Result<EvpPkeyPtr> private_key_from_pem(std::string_view pem);
std::string to_pem(X509* cert);
std::string to_pem(const X509List& certs);
// Unencrypted PKCS#8 ("BEGIN PRIVATE KEY").
std::string private_key_to_pem(EVP_PKEY* key);

std::optional<TimePoint> to_time_point(const ASN1_TIME* t);
// RFC 3339 UTC with seconds ("2025-01-31T12:00:00Z"), for messages and the config dump.
std::string format_utc(TimePoint t);
// Serial number in lowercase hex.
std::string serial_hex(X509* cert);
// SHA-256 of the DER encoding, lowercase hex; identifies a root across processes.
std::string fingerprint_sha256(X509* cert);
// One-line subject, e.g. "O=sockmesh".
std::string subject_string(X509* cert);

}  // namespace sockmesh::identity
