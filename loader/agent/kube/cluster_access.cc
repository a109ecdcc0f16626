#include "loader/agent/kube/cluster_access.h"

#include <sys/stat.h>

#include <cerrno>

#include <yaml-cpp/yaml.h>

#include "loader/agent/files.h"

namespace sockmesh::agent::kube {
namespace {

using maps::Error;

std::string base64_decode(const std::string& in, bool* ok) {
  static const std::string kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  *ok = true;
  for (char c : in) {
    if (c == '=' || c == '\n' || c == '\r' || c == ' ') continue;
    auto pos = kAlphabet.find(c);
    if (pos == std::string::npos) {
      *ok = false;
      return "";
    }
    acc = (acc << 6) | static_cast<uint32_t>(pos);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// Finds the entry named `name` in a kubeconfig list (clusters, users, contexts).
YAML::Node named(const YAML::Node& list, const std::string& name, const char* inner) {
  if (!list || !list.IsSequence()) return YAML::Node();
  for (const auto& item : list) {
    if (item["name"] && item["name"].as<std::string>() == name) return item[inner];
  }
  return YAML::Node();
}

std::string str(const YAML::Node& node, const char* key) {
  return node && node[key] ? node[key].as<std::string>() : std::string();
}

}  // namespace

std::string ClusterAccess::bearer_token() const {
  if (!token_file.empty()) {
    if (auto text = read_file(token_file)) return trim(*text);
  }
  return token;
}

maps::Result<ClusterAccess> load_kubeconfig(const std::string& path) {
  auto text = read_file(path);
  if (!text) return text.error();
  std::string dir = path.substr(0, path.rfind('/') == std::string::npos ? 0 : path.rfind('/'));
  auto resolve = [&](const std::string& p) {
    return p.empty() || p[0] == '/' || dir.empty() ? p : dir + "/" + p;
  };
  ClusterAccess access;
  try {
    YAML::Node root = YAML::Load(*text);
    std::string context_name = str(root, "current-context");
    YAML::Node context;
    if (context_name.empty()) {
      if (root["contexts"] && root["contexts"].IsSequence() && root["contexts"].size() == 1) {
        context = root["contexts"][0]["context"];
      }
    } else {
      context = named(root["contexts"], context_name, "context");
    }
    if (!context) return Error{EINVAL, path + ": no current context"};
    YAML::Node cluster = named(root["clusters"], str(context, "cluster"), "cluster");
    if (!cluster) return Error{EINVAL, path + ": context names an unknown cluster"};
    YAML::Node user = named(root["users"], str(context, "user"), "user");

    access.server = str(cluster, "server");
    if (access.server.empty()) return Error{EINVAL, path + ": the cluster has no server"};
    while (!access.server.empty() && access.server.back() == '/') access.server.pop_back();
    access.ca_file = resolve(str(cluster, "certificate-authority"));
    bool ok = true;
    access.ca_data = base64_decode(str(cluster, "certificate-authority-data"), &ok);
    if (!ok) return Error{EINVAL, path + ": certificate-authority-data is not base64"};
    access.insecure_skip_tls_verify =
        cluster["insecure-skip-tls-verify"] && cluster["insecure-skip-tls-verify"].as<bool>();
    if (user) {
      access.token = str(user, "token");
      access.token_file = resolve(str(user, "tokenFile"));
      access.client_cert_file = resolve(str(user, "client-certificate"));
      access.client_key_file = resolve(str(user, "client-key"));
      access.client_cert_data = base64_decode(str(user, "client-certificate-data"), &ok);
      if (!ok) return Error{EINVAL, path + ": client-certificate-data is not base64"};
      access.client_key_data = base64_decode(str(user, "client-key-data"), &ok);
      if (!ok) return Error{EINVAL, path + ": client-key-data is not base64"};
    }
  } catch (const YAML::Exception& e) {
    return Error{EINVAL, path + ": " + e.what()};
  }
  return access;
}

maps::Result<ClusterAccess> in_cluster(const std::map<std::string, std::string>& env,
                                       const std::string& sa_dir) {
  auto host = env.find("KUBERNETES_SERVICE_HOST");
  auto port = env.find("KUBERNETES_SERVICE_PORT");
  if (host == env.end() || port == env.end() || host->second.empty() || port->second.empty()) {
    return Error{ENOENT, "not in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set"};
  }
  ClusterAccess access;
  std::string h = host->second;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";
  access.server = "https://" + h + ":" + port->second;
  access.token_file = sa_dir + "/token";
  access.ca_file = sa_dir + "/ca.crt";
  struct stat st {};
  if (stat(access.token_file.c_str(), &st) != 0) {
    return Error::from_errno(errno, "service account token " + access.token_file);
  }
  return access;
}

}  // namespace sockmesh::agent::kube
