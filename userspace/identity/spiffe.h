#pragma once
// Workload identities as Istio names them: spiffe://<trust-domain>/ns/<namespace>/sa/<account>.
#include <compare>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <openssl/types.h>

#include "identity/result.h"

namespace sockmesh::identity {

struct SpiffeId {
  std::string trust_domain;
  std::string namespace_name;
  std::string service_account;

  // Accepts only the mesh's workload form. The general SPIFFE rules apply on top: scheme exactly
  // "spiffe" (lowercase), trust domain of [a-z0-9._-] and at most 255 bytes, path segments of
  // [A-Za-z0-9._-] that are neither empty, "." nor "..", no query, fragment, port, userinfo or
  // percent-encoding, whole ID at most 2048 bytes. Anything else (other paths, extra or trailing
  // segments) is nullopt: a peer presenting it gets no identity rather than a guessed one.
  static std::optional<SpiffeId> parse(std::string_view text);

  // Validates the parts (same rules as parse) and builds an ID; nullopt when any part is invalid.
  static std::optional<SpiffeId> make(std::string_view trust_domain, std::string_view ns,
                                      std::string_view sa);

  std::string to_string() const;

  auto operator<=>(const SpiffeId&) const = default;
};

// True for a name usable as a SPIFFE trust domain (see SpiffeId::parse).
bool valid_trust_domain(std::string_view trust_domain);

// Why spiffe_id_of() found no usable identity.
enum class SanError {
  kNoUriSan,           // the certificate has no URI SAN at all
  kMultipleUriSans,    // more than one URI SAN: the X.509-SVID spec requires exactly one
  kNotSpiffe,          // the single URI SAN is not a spiffe:// URI
  kMalformedSpiffeId,  // spiffe:// but not spiffe://<td>/ns/<ns>/sa/<sa> or invalid characters
};

struct SanFailure {
  SanError code;
  std::string message;
};

// Reads the identity an X.509-SVID carries. Per the X.509-SVID spec the certificate must hold
// exactly one URI SAN and it must be the SPIFFE ID; DNS/IP SANs are ignored. Zero URI SANs and
// several URI SANs are both errors (several would let one certificate claim two identities and
// leave the choice to whichever code reads it), as is a single URI SAN that is not a workload
// SPIFFE ID. Does not check the signature or validity period; see verify.h.
Result<SpiffeId, SanFailure> spiffe_id_of(X509* cert);

}  // namespace sockmesh::identity

template <>
struct std::hash<sockmesh::identity::SpiffeId> {
  size_t operator()(const sockmesh::identity::SpiffeId& id) const noexcept;
};
