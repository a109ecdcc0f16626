#pragma once
// Workload certificates from Istio's CA (istiod, or anything serving
// istio.v1.auth.IstioCertificateService): for each identity a fresh P-256 key and CSR, sent over
// gRPC with TLS to the CA address, the CA's server certificate verified against the root file.
// Each call carries `authorization: Bearer <token>` (the token file is read again for every
// call, since Kubernetes rotates projected tokens) and `clusterid`; the request's metadata says
// `ImpersonatedIdentity: <SPIFFE ID>`, as a node proxy asks on behalf of the pods on its node.
// The returned chain is checked (csr.h) before it is used.
//
// The root file is also the mesh's trust bundle (trust_roots()). refresh() re-reads it when it
// changed; new handshakes and new CA connections then use the new roots, live ones keep theirs.
//
// issue() blocks for a network round trip (bounded by the call timeout) and at most
// max_in_flight calls run at once; the proxy calls it from the certificate cache's renewal
// thread only, never from an io thread (CertificateCacheOptions::issue_in_background).
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "identity/issuer.h"
#include "identity/root_file.h"

namespace grpc {
class ClientContext;
}

namespace sockmesh::identity {

struct IstioCaOptions {
  // "https://host:port", "host:port" or "[v6]:port".
  std::string address;
  // PEM roots: verify the CA's server certificate and the chains it returns; the mesh bundle.
  std::filesystem::path root_ca_file;
  // Bearer token file; empty: no authorization header.
  std::filesystem::path token_file;
  std::string cluster_id = "Kubernetes";
  // validity_duration asked for.
  std::chrono::seconds ttl = std::chrono::hours(24);
  // Node proxy: request metadata ImpersonatedIdentity = the identity asked for.
  bool impersonate = true;
  std::chrono::milliseconds call_timeout{10000};
  size_t max_in_flight = 8;
  Clock clock;
  // Told after every call whether it produced a certificate (for the fetch counters).
  std::function<void(bool ok)> on_fetch;
};

class IstioCaClient final : public CertificateIssuer {
 public:
  struct Channel;  // the gRPC channel and stub; opaque here so that callers need no grpc++
  // Fails when the address is malformed or the root file is missing or not a usable bundle.
  static Result<std::shared_ptr<IstioCaClient>> create(IstioCaOptions options);
  ~IstioCaClient() override;

  Result<CertifiedKeyPtr> issue(const SpiffeId& id) override;
  TrustRootsPtr trust_roots() const override;
  // Reloads the root file if it changed; a bad new file is logged and the old roots stay.
  void refresh() override;
  // TryCancel() on every call in flight; calls after it fail with "stopping".
  void cancel() override;
  std::string_view kind() const override { return "istio-ca"; }

  // "host:port" as dialled.
  const std::string& target() const { return target_; }

 private:
  static std::shared_ptr<Channel> make_channel(const std::string& target, const std::string& pem);
  IstioCaClient(IstioCaOptions options, std::string target, WatchedRootFile roots);
  std::shared_ptr<Channel> channel() const;
  Result<CertifiedKeyPtr> call(const SpiffeId& id);

  const IstioCaOptions options_;
  const std::string target_;

  WatchedRootFile roots_;

  mutable std::mutex mu_;
  std::shared_ptr<Channel> channel_;      // rebuilt when the roots change
  std::set<grpc::ClientContext*> calls_;  // in flight, for cancel()
  bool cancelled_ = false;

  std::mutex slots_mu_;
  std::condition_variable slots_cv_;
  size_t in_flight_ = 0;
};

// "https://host:port" -> "host:port"; nullopt for anything that is not host:port.
std::optional<std::string> ca_target_of(std::string_view address);

}  // namespace sockmesh::identity
