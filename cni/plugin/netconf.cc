#include "cni/plugin/netconf.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdlib>

#include "cni/event/pod_event.h"

namespace sockmesh::cni {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kEnvNames[] = {"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS",
                                     "CNI_IFNAME",  "CNI_ARGS",        "CNI_PATH"};

std::vector<int> version_parts(std::string_view v) {
  std::vector<int> parts;
  int current = 0;
  for (char c : v) {
    if (c == '.') {
      parts.push_back(current);
      current = 0;
    } else if (c >= '0' && c <= '9') {
      current = current * 10 + (c - '0');
    }
  }
  parts.push_back(current);
  return parts;
}

CniError decoding(std::string msg, std::string details = "") {
  return CniError{ErrorCode::kDecodingFailure, std::move(msg), std::move(details)};
}

// Strips "/len" and checks the address.
bool normalize_address(const std::string& cidr, std::string* out) {
  std::string addr = cidr.substr(0, cidr.find('/'));
  unsigned char buf[16];
  if (inet_pton(AF_INET, addr.c_str(), buf) != 1 && inet_pton(AF_INET6, addr.c_str(), buf) != 1) {
    return false;
  }
  *out = addr;
  return true;
}

}  // namespace

bool version_supported(std::string_view version) {
  return std::find(kSupportedVersions.begin(), kSupportedVersions.end(), version) !=
         kSupportedVersions.end();
}

bool version_less(std::string_view a, std::string_view b) {
  return version_parts(a) < version_parts(b);
}

CniEnv CniEnv::from_process() {
  std::map<std::string, std::string> vars;
  for (const char* name : kEnvNames) {
    if (const char* v = std::getenv(name)) vars[name] = v;
  }
  return from_map(vars);
}

CniEnv CniEnv::from_map(const std::map<std::string, std::string>& vars) {
  CniEnv env;
  auto get = [&](const char* name) {
    auto it = vars.find(name);
    return it == vars.end() ? std::string() : it->second;
  };
  env.command = get("CNI_COMMAND");
  env.container_id = get("CNI_CONTAINERID");
  env.netns = get("CNI_NETNS");
  env.ifname = get("CNI_IFNAME");
  env.args = get("CNI_ARGS");
  env.path = get("CNI_PATH");
  env.present = vars;
  return env;
}

PodArgs parse_cni_args(std::string_view args) {
  PodArgs pod;
  while (!args.empty()) {
    size_t end = args.find(';');
    std::string_view pair = args.substr(0, end);
    args = end == std::string_view::npos ? std::string_view() : args.substr(end + 1);
    size_t eq = pair.find('=');
    if (eq == std::string_view::npos) continue;
    std::string_view key = pair.substr(0, eq);
    std::string value(pair.substr(eq + 1));
    if (key == "K8S_POD_NAMESPACE") pod.namespace_name = value;
    if (key == "K8S_POD_NAME") pod.name = value;
    if (key == "K8S_POD_UID") pod.uid = value;
  }
  return pod;
}

bool NetConf::excludes(const std::string& pod_namespace) const {
  return std::find(exclude_namespaces.begin(), exclude_namespaces.end(), pod_namespace) !=
         exclude_namespaces.end();
}

NetConfResult parse_netconf(std::string_view stdin_text) {
  NetConfResult out;
  Json j;
  try {
    j = Json::parse(stdin_text);
  } catch (const Json::exception& e) {
    // parse_error, and out_of_range for a number that overflows (e.g. 2E220222): both are bad
    // input, neither may escape (found by the cni_plugin fuzz target).
    out.error = decoding(
        "the network configuration on stdin is not valid JSON: check the .conflist in the CNI "
        "conf dir",
        e.what());
    return out;
  }
  if (!j.is_object()) {
    out.error = decoding("the network configuration on stdin is not a JSON object");
    return out;
  }
  NetConf conf;
  auto string_field = [&](const char* key, std::string* dst) -> bool {
    auto it = j.find(key);
    if (it == j.end()) return true;
    if (!it->is_string()) {
      out.error =
          decoding(std::string("network configuration field \"") + key + "\" must be a string");
      return false;
    }
    *dst = it->get<std::string>();
    return true;
  };
  if (!string_field("cniVersion", &conf.cni_version) || !string_field("name", &conf.name) ||
      !string_field("type", &conf.type) || !string_field("agent_socket", &conf.agent_socket) ||
      !string_field("namespace_hints", &conf.namespace_hints) ||
      !string_field("kubeconfig", &conf.kubeconfig)) {
    return out;
  }
  // libcni reads a missing cniVersion as 0.1.0.
  if (conf.cni_version.empty()) conf.cni_version = "0.1.0";
  if (!version_supported(conf.cni_version)) {
    std::string supported;
    for (const auto& v : kSupportedVersions) supported += (supported.empty() ? "" : ", ") + v;
    out.error = CniError{ErrorCode::kIncompatibleVersion,
                         "sockmesh-cni does not support CNI version " + conf.cni_version +
                             ": set cniVersion in the .conflist to one of " + supported,
                         "supported versions: " + supported};
    return out;
  }
  if (conf.agent_socket.empty()) conf.agent_socket = kDefaultAgentSocket;
  if (conf.namespace_hints.empty()) conf.namespace_hints = kDefaultNamespaceHints;

  if (auto it = j.find("exclude_namespaces"); it != j.end()) {
    if (!it->is_array()) {
      out.error = decoding("\"exclude_namespaces\" must be an array of namespace names");
      return out;
    }
    for (const auto& ns : *it) {
      if (!ns.is_string()) {
        out.error = decoding("\"exclude_namespaces\" must be an array of namespace names");
        return out;
      }
      conf.exclude_namespaces.push_back(ns.get<std::string>());
    }
  } else {
    conf.exclude_namespaces = {"kube-system"};
  }
  if (auto it = j.find("agent_timeout_ms"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > 600000) {
      out.error = CniError{ErrorCode::kInvalidNetworkConfig,
                           "\"agent_timeout_ms\" must be an integer between 1 and 600000", ""};
      return out;
    }
    conf.agent_timeout_ms = it->get<int>();
  }
  if (auto it = j.find("prevResult"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      out.error = decoding("\"prevResult\" must be a JSON object (the previous plugin's result)");
      return out;
    }
    conf.prev_result = *it;
  }
  out.conf = std::move(conf);
  return out;
}

PodIpsResult pod_ips(const nlohmann::ordered_json& result, const std::string& ifname) {
  PodIpsResult out;
  auto bad = [&](const std::string& what) {
    out.error = decoding("prevResult has a malformed address: " + what);
    return out;
  };
  if (auto ips = result.find("ips"); ips != result.end()) {
    if (!ips->is_array()) return bad("\"ips\" is not an array");
    const Json* interfaces = nullptr;
    if (auto it = result.find("interfaces"); it != result.end() && it->is_array()) {
      interfaces = &*it;
    }
    std::vector<std::string> pod_side, any;
    for (const auto& entry : *ips) {
      if (!entry.is_object()) return bad("an \"ips\" entry is not an object");
      auto address = entry.find("address");
      if (address == entry.end() || !address->is_string()) return bad("\"address\" missing");
      std::string ip;
      if (!normalize_address(address->get<std::string>(), &ip)) {
        return bad(address->get<std::string>());
      }
      any.push_back(ip);
      auto index = entry.find("interface");
      if (interfaces == nullptr || index == entry.end() || !index->is_number_integer()) continue;
      auto i = index->get<int64_t>();
      if (i < 0 || static_cast<size_t>(i) >= interfaces->size()) continue;
      const auto& iface = (*interfaces)[static_cast<size_t>(i)];
      auto sandbox = iface.find("sandbox");
      auto name = iface.find("name");
      bool in_pod =
          (sandbox != iface.end() && sandbox->is_string() &&
           !sandbox->get<std::string>().empty()) ||
          (name != iface.end() && name->is_string() && name->get<std::string>() == ifname);
      if (in_pod) pod_side.push_back(ip);
    }
    out.ips = pod_side.empty() ? any : pod_side;
    return out;
  }
  for (const char* family : {"ip4", "ip6"}) {
    auto it = result.find(family);
    if (it == result.end() || !it->is_object()) continue;
    auto ip = it->find("ip");
    if (ip == it->end() || !ip->is_string()) return bad(std::string(family) + ".ip missing");
    std::string addr;
    if (!normalize_address(ip->get<std::string>(), &addr)) return bad(ip->get<std::string>());
    out.ips.push_back(addr);
  }
  return out;
}

}  // namespace sockmesh::cni
