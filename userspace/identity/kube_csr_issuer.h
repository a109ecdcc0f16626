#pragma once
// Workload certificates from a Kubernetes signer, through the certificates.k8s.io/v1
// CertificateSigningRequest API: for each identity a fresh P-256 key and CSR (csr.h), POSTed as a
// CertificateSigningRequest with the configured signerName, usages digital signature, key
// encipherment, client auth and server auth, and expirationSeconds = the TTL (at least 600, the
// API's minimum). The issuer then watches that one object (fieldSelector metadata.name) until it
// carries an Approved condition and status.certificate, or a Denied or Failed condition, or the
// approval timeout passes; the returned chain is checked against the mesh roots (csr.h), and the
// CSR object is deleted afterwards in every case, so that none is left behind.
//
// Approving is someone else's job (a controller or an operator with `kubectl certificate
// approve`); the signer named by signerName issues the certificate once it is approved.
//
// The API server is reached over HTTPS with libcurl, its certificate verified against
// api_ca_file; each request carries `authorization: Bearer <token>`, the token file read again
// for every request (Kubernetes rotates projected tokens). The mesh roots (root_ca_file, the
// signer's CA bundle) are the trust bundle (trust_roots()); refresh() re-reads them when the file
// changed.
//
// issue() blocks for up to approval_timeout; at most max_in_flight run at once. cancel() ends the
// requests in flight at once (each still tries its DELETE, bounded by a short timeout).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "identity/issuer.h"
#include "identity/root_file.h"

namespace sockmesh::identity {

struct KubeCsrOptions {
  // "https://host:port" (http:// is accepted for tests only).
  std::string api_server;
  // PEM roots for the API server's certificate; empty: the system's roots.
  std::filesystem::path api_ca_file;
  // Bearer token file, read for every request; empty: no authorization header.
  std::filesystem::path token_file;
  // spec.signerName, e.g. "example.com/istio-workloads". Required.
  std::string signer_name;
  // The mesh's roots: the issued chains must chain to them; the trust bundle. Required.
  std::filesystem::path root_ca_file;
  // spec.expirationSeconds; raised to 600 (the API's minimum) when shorter.
  std::chrono::seconds ttl = std::chrono::hours(24);
  // How long to wait for approval and the certificate after the POST.
  std::chrono::milliseconds approval_timeout{60000};
  // Each HTTP request but the watch (POST, DELETE), and the TCP/TLS connect of the watch.
  std::chrono::milliseconds request_timeout{10000};
  // CSR object names are <prefix><random hex>.
  std::string name_prefix = "sockmesh-";
  size_t max_in_flight = 8;
  Clock clock;
  // Told after every issue() whether it produced a certificate (for the fetch counters).
  std::function<void(bool ok)> on_fetch;
};

class KubeCsrIssuer final : public CertificateIssuer {
 public:
  // Fails when the API server address, the signer name or the root file is missing or unusable.
  static Result<std::shared_ptr<KubeCsrIssuer>> create(KubeCsrOptions options);
  ~KubeCsrIssuer() override;

  Result<CertifiedKeyPtr> issue(const SpiffeId& id) override;
  TrustRootsPtr trust_roots() const override;
  // Reloads the root file if it changed; a bad new file is logged and the old roots stay.
  void refresh() override;
  // Aborts the watches in flight; later issue() calls fail with "stopping".
  void cancel() override;
  std::string_view kind() const override { return "kubernetes-csr"; }

  const KubeCsrOptions& options() const { return options_; }

  struct Response {
    long status = 0;
    std::string body;
  };

 private:
  KubeCsrIssuer(KubeCsrOptions options, WatchedRootFile roots);
  Result<CertifiedKeyPtr> run(const SpiffeId& id);
  Result<std::string> wait_for_certificate(const std::string& name, const SpiffeId& id);
  void delete_csr(const std::string& name);

  const KubeCsrOptions options_;
  std::atomic<bool> cancelled_{false};

  WatchedRootFile roots_;

  std::mutex slots_mu_;
  std::condition_variable slots_cv_;
  size_t in_flight_ = 0;
};

// The CertificateSigningRequest object POSTed for `csr_pem` (JSON text); exposed for tests.
std::string csr_object_json(const std::string& name, const std::string& csr_pem,
                            const std::string& signer_name, const SpiffeId& id,
                            std::chrono::seconds expiration);

// "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT" from `env`, as client-go finds the
// API server inside a pod ([v6] bracketed); empty when either is unset.
std::string in_cluster_api_server(const std::map<std::string, std::string>& env);

}  // namespace sockmesh::identity
