#include "loader/agent/kube/owner_daemonset.h"

#include <nlohmann/json.hpp>

#include "loader/agent/kube/reflector.h"

namespace sockmesh::agent::kube {

const char* owner_state_name(OwnerState s) {
  switch (s) {
    case OwnerState::kPresent:
      return "present";
    case OwnerState::kDeleting:
      return "being deleted";
    case OwnerState::kGone:
      return "gone";
    case OwnerState::kUnknown:
      return "unknown";
  }
  return "unknown";
}

bool parse_owner(const std::string& owner, std::string* ns, std::string* name, std::string* error) {
  auto slash = owner.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == owner.size() ||
      owner.find('/', slash + 1) != std::string::npos) {
    *error = "expected <namespace>/<daemonset>, got \"" + owner + "\"";
    return false;
  }
  *ns = owner.substr(0, slash);
  *name = owner.substr(slash + 1);
  return true;
}

OwnerAnswer owner_daemonset_state(ApiClient& api, const std::string& owner) {
  std::string ns, name, error;
  if (!parse_owner(owner, &ns, &name, &error)) return {OwnerState::kUnknown, error};
  auto response =
      api.get("/apis/apps/v1/namespaces/" + url_encode(ns) + "/daemonsets/" + url_encode(name));
  if (!response) return {OwnerState::kUnknown, response.error().message};
  if (response->status == 404) return {OwnerState::kGone, "the API answers 404"};
  if (response->status != 200) {
    return {OwnerState::kUnknown, "the API answers HTTP " + std::to_string(response->status)};
  }
  auto object = nlohmann::json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object() || object.value("kind", "") != "DaemonSet") {
    return {OwnerState::kUnknown, "the API's answer is not a DaemonSet"};
  }
  const auto& meta = object.value("metadata", nlohmann::json::object());
  if (meta.is_object()) {
    auto ts = meta.find("deletionTimestamp");
    if (ts != meta.end() && ts->is_string() && !ts->get<std::string>().empty()) {
      return {OwnerState::kDeleting, "deletionTimestamp " + ts->get<std::string>()};
    }
  }
  return {OwnerState::kPresent, "uid " + (meta.is_object() ? meta.value("uid", "?") : "?")};
}

}  // namespace sockmesh::agent::kube
