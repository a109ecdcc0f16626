#pragma once
// How to reach the Kubernetes API: from a kubeconfig file (its current context), or from inside a
// pod (KUBERNETES_SERVICE_HOST/PORT and the mounted service account), as client-go does.
#include <map>
#include <string>

#include "loader/maps/result.h"

namespace sockmesh::agent::kube {

struct ClusterAccess {
  std::string server;  // https://host:port (http:// only for tests)
  std::string ca_file;
  std::string ca_data;  // PEM
  bool insecure_skip_tls_verify = false;
  std::string token;
  std::string token_file;  // re-read on every request: projected tokens rotate
  std::string client_cert_file, client_key_file;
  std::string client_cert_data, client_key_data;  // PEM

  // The bearer token for the next request (token_file wins when both are set).
  std::string bearer_token() const;
};

// Reads a kubeconfig (YAML): current-context -> cluster (server, certificate-authority[-data],
// insecure-skip-tls-verify) and user (token, tokenFile, client-certificate[-data],
// client-key[-data]). Relative paths are relative to the file, as kubectl reads them.
maps::Result<ClusterAccess> load_kubeconfig(const std::string& path);

// In a pod: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, <sa_dir>/token, ca.crt.
maps::Result<ClusterAccess> in_cluster(
    const std::map<std::string, std::string>& env,
    const std::string& sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

}  // namespace sockmesh::agent::kube
