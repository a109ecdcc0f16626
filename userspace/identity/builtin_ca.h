#pragma once
// The built-in mesh CA: a self-signed root kept in the proxy's state directory that signs
// workload certificates locally. It makes a node usable without istiod, and lets proxies that
// share a state directory (several proxies on one machine, tests) trust each other.
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "identity/certificate.h"
#include "identity/issuer.h"

namespace sockmesh::identity {

struct BuiltinCaOptions {
  std::chrono::seconds workload_lifetime = std::chrono::hours(24);
  // Workload certificates start this far in the past so that a peer whose clock lags a little
  // does not reject a certificate issued a moment ago as not yet valid.
  std::chrono::seconds clock_skew = std::chrono::minutes(5);
  // Only used when a new root is created.
  std::chrono::seconds root_lifetime = std::chrono::hours(24 * 3653);  // ~10 years
  Clock clock;
};

class BuiltinCa final : public CertificateIssuer {
 public:
  static constexpr std::string_view kKeyFile = "ca-key.pem";
  static constexpr std::string_view kCertFile = "ca-cert.pem";

  // Loads <state_dir>/ca-key.pem and ca-cert.pem, or creates them when absent (ECDSA P-256 root,
  // subject O=sockmesh, key file 0600, directory 0700 when created here). Safe against other
  // processes doing the same concurrently: each file is published with an exclusive link, the
  // first writer wins and everyone else loads the winner's files, so all end with one root.
  // Existing but unreadable, mismatched or expired files are an error, never overwritten. Also
  // an error: a directory writable by group or others (anyone could plant a CA there), an
  // invalid trust domain, non-positive lifetimes.
  static Result<std::shared_ptr<BuiltinCa>> load_or_create(const std::filesystem::path& state_dir,
                                                           std::string_view trust_domain,
                                                           BuiltinCaOptions options = {});

  // A fresh key and certificate for `id`: ECDSA P-256, URI SAN = the SPIFFE ID (critical, empty
  // subject, as Istio issues them), valid from now - clock_skew for workload_lifetime (never
  // past the root's own expiry), random 128-bit serial, digitalSignature + keyEncipherment,
  // serverAuth + clientAuth. The chain is empty: the root is the only issuer and peers already
  // hold it as a trust root. Refuses identities outside the CA's trust domain.
  Result<CertifiedKeyPtr> issue(const SpiffeId& id) override;
  TrustRootsPtr trust_roots() const override { return roots_; }
  std::string_view kind() const override { return "builtin-ca"; }

  X509* root() const { return roots_->front().get(); }
  const std::string& trust_domain() const { return trust_domain_; }
  // Whether this process wrote the root (as opposed to loading an existing one).
  bool created_root() const { return created_root_; }

 private:
  BuiltinCa(std::string trust_domain, X509Ptr root, EvpPkeyPtr key, BuiltinCaOptions options,
            bool created_root);

  const std::string trust_domain_;
  const EvpPkeyPtr key_;
  const TrustRootsPtr roots_;
  const TimePoint root_not_after_;
  const BuiltinCaOptions options_;
  const bool created_root_;
};

}  // namespace sockmesh::identity
