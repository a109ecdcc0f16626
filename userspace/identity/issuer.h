#pragma once
// Where workload certificates come from. Implementations: BuiltinCa (signs locally with a root
// kept in the state directory), FileCertificates (mounted files) and IstioCaClient (a CSR over
// gRPC to Istio's CA: issue() generates a key, sends the CSR and waits for the chain;
// trust_roots() is the configured root file; refresh() picks up a rotated one).
#include <memory>
#include <string_view>

#include "identity/certificate.h"
#include "identity/ossl.h"
#include "identity/result.h"
#include "identity/spiffe.h"

namespace sockmesh::identity {

// Trust anchors, replaced as a whole when they change. Shared read-only with the TLS layer.
using TrustRootsPtr = std::shared_ptr<const X509List>;

class CertificateIssuer {
 public:
  virtual ~CertificateIssuer() = default;

  // Obtains a certificate for `id`. May block (key generation, signing, file I/O, or a network
  // round trip for a remote CA), so callers must not hold locks that handshakes need. Must be
  // safe to call from several threads at once, including for the same identity.
  virtual Result<CertifiedKeyPtr> issue(const SpiffeId& id) = 0;

  // The roots peers' chains are verified against. Cheap; never blocks on I/O.
  virtual TrustRootsPtr trust_roots() const = 0;

  // Re-reads external state the issuer depends on (mounted root bundle, a remote CA's bundle).
  // Called periodically by CertificateCache::renew_due(); the default has nothing to re-read.
  virtual void refresh() {}

  // Ends the calls in flight and fails every later one at once: the process is stopping, and a
  // remote CA that does not answer must not hold the exit for a call's whole deadline.
  virtual void cancel() {}

  // True when `key`, which this issuer returned earlier, should be replaced before its
  // half-life, e.g. because the files it was read from were rewritten. Issuers that mint a
  // fresh certificate on every call never supersede one.
  virtual bool superseded(const CertifiedKey& key) const {
    (void)key;
    return false;
  }

  // Short name for logs and the config dump ("builtin-ca", "files").
  virtual std::string_view kind() const = 0;
};

}  // namespace sockmesh::identity
