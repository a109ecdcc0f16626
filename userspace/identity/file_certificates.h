#pragma once
// Certificates provisioned by something else (cert-manager, Istio's file-mounted certs, a test
// harness) and mounted as files. Layout under the configured directory:
//
//   root-cert.pem                            trust roots, one or more PEM certificates
//   <namespace>/<service-account>/cert-chain.pem   leaf first, then intermediates
//   <namespace>/<service-account>/key.pem          the leaf's private key (PKCS#8 or SEC1)
//
// plus, for a single identity, the flat layout Istio mounts at /etc/certs:
//
//   cert-chain.pem, key.pem                  used when the per-identity directory is absent
//
// The trust domain is not part of the path; instead the certificate's SPIFFE ID must equal the
// identity asked for, so a misplaced file is an error rather than a wrong identity.
//
// Files are re-read when stat() says they changed (inode, size, mtime or ctime), which covers
// Kubernetes' symlink swap as well as in-place rewrites. issue() checks on every call;
// superseded() lets CertificateCache::renew_due() notice a rotation before the half-life, and
// refresh() reloads root-cert.pem. A half-written update (certificate and key not matching
// yet) is reported as an error and the previous material stays in use until the next check.
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "identity/file_util.h"
#include "identity/issuer.h"

namespace sockmesh::identity {

class FileCertificates final : public CertificateIssuer {
 public:
  static constexpr std::string_view kRootFile = "root-cert.pem";
  static constexpr std::string_view kChainFile = "cert-chain.pem";
  static constexpr std::string_view kKeyFile = "key.pem";

  // Fails when <dir>/root-cert.pem is missing or unparsable: without roots no peer can be
  // verified, so this is a configuration error worth stopping for.
  static Result<std::shared_ptr<FileCertificates>> create(std::filesystem::path dir,
                                                          Clock clock = {});

  // Returns the mounted certificate for `id`, re-reading the files if they changed. Errors name
  // the files involved: missing, unparsable, key not matching, SPIFFE ID not equal to `id`,
  // expired.
  Result<CertifiedKeyPtr> issue(const SpiffeId& id) override;
  TrustRootsPtr trust_roots() const override;
  // Reloads root-cert.pem if it changed; keeps the old roots (and logs) if the new file is bad.
  void refresh() override;
  bool superseded(const CertifiedKey& key) const override;
  std::string_view kind() const override { return "files"; }

  const std::filesystem::path& dir() const { return dir_; }

 private:
  struct Source {
    std::filesystem::path chain;
    std::filesystem::path key;
    std::optional<files::Stamp> chain_stamp;
    std::optional<files::Stamp> key_stamp;
  };
  struct Loaded {
    Source source;
    CertifiedKeyPtr key;
  };

  FileCertificates(std::filesystem::path dir, Clock clock, TrustRootsPtr roots,
                   std::optional<files::Stamp> roots_stamp);
  // The files that currently serve `id`, stamped; the per-identity directory wins.
  Source locate(const SpiffeId& id) const;

  const std::filesystem::path dir_;
  const Clock clock_;

  mutable std::mutex mu_;
  TrustRootsPtr roots_;
  std::optional<files::Stamp> roots_stamp_;
  std::optional<files::Stamp> rejected_roots_stamp_;   // a bad root-cert.pem, warned about once
  std::map<std::string, Loaded, std::less<>> loaded_;  // by SPIFFE ID string
};

}  // namespace sockmesh::identity
