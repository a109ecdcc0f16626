#pragma once
// Peer certificate checks for the TLS layer. OpenSSL's built-in verification knows nothing
// about SPIFFE IDs and reports failures as numeric codes; these helpers add the identity check
// and turn each failure into a reason an operator can act on.
#include <optional>
#include <string>
#include <string_view>

#include "identity/certificate.h"
#include "identity/ossl.h"
#include "identity/result.h"
#include "identity/spiffe.h"

namespace sockmesh::identity {

enum class VerifyError {
  kMalformed,         // no leaf, or OpenSSL could not run the check at all
  kNoTrustRoots,      // nothing to verify against
  kUntrustedIssuer,   // the chain does not lead to one of the roots (another CA, a missing
                      // intermediate, a self-signed leaf, a signature that does not verify)
  kExpired,           // a certificate in the chain is past notAfter
  kNotYetValid,       // a certificate in the chain is before notBefore
  kInvalidChain,      // any other X.509 rule: issuer not a CA, wrong key or extended key usage
  kNoSpiffeId,        // no URI SAN, or the URI SAN is not spiffe://
  kInvalidSpiffeId,   // several URI SANs, or a spiffe:// URI that is not a workload ID
  kWrongTrustDomain,  // a valid workload ID in a trust domain other than the expected one
};

std::string_view verify_error_name(VerifyError e);

struct VerifyFailure {
  VerifyError code;
  std::string message;
};

using VerifyStatus = Result<void, VerifyFailure>;

// What the peer is expected to be, which decides the extended key usage required of its leaf.
enum class PeerRole { kAny, kServer, kClient };

// Checks that `leaf`, helped by the untrusted intermediates in `chain` (may be null; may also
// contain the leaf, as SSL_get_peer_cert_chain returns it on the server side), chains to one of
// `roots` and that every certificate on the path is valid at `now`. Does not look at SANs.
VerifyStatus verify_chain(X509* leaf, STACK_OF(X509) * chain, const X509List& roots, TimePoint now,
                          PeerRole role = PeerRole::kAny);

// Why `roots` cannot serve as a trust bundle (empty, a certificate that is not a CA, one that
// has expired by `now`), or nullopt when it can. A rotated bundle that fails this is refused.
std::optional<std::string> check_trust_bundle(const X509List& roots, TimePoint now);

// Extracts the peer's workload SPIFFE ID and checks it lies in `trust_domain`. Does not verify
// the chain; only meaningful after verify_chain succeeded.
Result<SpiffeId, VerifyFailure> check_trust_domain(X509* leaf, std::string_view trust_domain);

// verify_chain then check_trust_domain; the peer's identity when both pass.
Result<SpiffeId, VerifyFailure> verify_peer(X509* leaf, STACK_OF(X509) * chain,
                                            const X509List& roots, std::string_view trust_domain,
                                            TimePoint now, PeerRole role = PeerRole::kAny);

}  // namespace sockmesh::identity
