#pragma once
// The two halves of getting a certificate from a remote CA: the request we send (a fresh key and
// a CSR naming the workload's SPIFFE ID) and the check of the chain that comes back. Kept apart
// from the transport so that both can be tested without a CA.
#include <string>
#include <string_view>
#include <vector>

#include "identity/certificate.h"
#include "identity/ossl.h"
#include "identity/result.h"
#include "identity/spiffe.h"

namespace sockmesh::identity {

struct CertificateRequest {
  EvpPkeyPtr key;       // ECDSA P-256, never leaves the process
  std::string csr_pem;  // "BEGIN CERTIFICATE REQUEST"
};

// A new P-256 key and a CSR signed with it (SHA-256) whose only subjectAltName is the SPIFFE ID
// as a URI, with an empty subject, as Istio's agents send them.
Result<CertificateRequest> make_certificate_request(const SpiffeId& id);

// A critical subjectAltName extension holding one URI (the SPIFFE ID), built as a structure, not
// from a config string, so nothing in the ID is read as extension syntax. Null on failure; the
// caller frees it. For CSRs here and for the built-in CA's leaves.
X509_EXTENSION* uri_san_extension(const std::string& uri);

// Checks a chain returned for `requested` (PEM blocks, leaf first, the root possibly last) and
// pairs it with `key`: the leaf must hold `key`'s public half, carry exactly the SPIFFE ID asked
// for, and chain (through the intermediates given) to one of `roots` at `now`. Errors say which
// of these failed. The returned CertifiedKey's chain holds the intermediates, not the root.
Result<CertifiedKeyPtr> accept_issued_chain(const std::vector<std::string>& chain_pem,
                                            EvpPkeyPtr key, const SpiffeId& requested,
                                            const X509List& roots, TimePoint now);

}  // namespace sockmesh::identity
