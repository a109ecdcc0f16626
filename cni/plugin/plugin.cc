#include "cni/plugin/plugin.h"

#include <algorithm>
#include <optional>

#include "base/regular_file.h"
#include "cni/event/pod_event.h"
#include "cni/plugin/agent_client.h"

namespace sockmesh::cni {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kDelTimeoutMs = 5000;

struct Invocation {
  const CniEnv& env;
  PluginOutput out;
  std::string version = "1.0.0";  // of the error JSON: the netconf's once known

  PluginOutput fail(const CniError& e) {
    Json j;
    j["cniVersion"] = version;
    j["code"] = static_cast<int>(e.code);
    j["msg"] = e.msg;
    if (!e.details.empty()) j["details"] = e.details;
    // A message may quote the input (a JSON parse error quotes the bytes it stopped at): bytes
    // that are not UTF-8 are replaced, as dump() would otherwise throw and abort the plugin.
    out.stdout_text = j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    out.exit_code = 1;
    note("error " + std::to_string(static_cast<int>(e.code)) + ": " + e.msg +
         (e.details.empty() ? "" : " (" + e.details + ")"));
    return out;
  }
  void note(const std::string& line) { out.stderr_text += "sockmesh-cni: " + line + "\n"; }
};

std::optional<CniError> require_env(const CniEnv& env, std::initializer_list<const char*> names) {
  std::string missing;
  for (const char* name : names) {
    auto it = env.present.find(name);
    if (it == env.present.end() || it->second.empty()) {
      missing += (missing.empty() ? "" : ", ") + std::string(name);
    }
  }
  if (missing.empty()) return std::nullopt;
  return CniError{ErrorCode::kInvalidEnvironment,
                  "required environment variable(s) not set: " + missing +
                      ". sockmesh-cni is run by the container runtime, which sets them",
                  "CNI_COMMAND=" + env.command};
}

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

PodEvent make_event(Command command, const CniEnv& env, const PodArgs& pod,
                    std::vector<std::string> ips, int timeout_ms) {
  PodEvent e;
  e.command = command;
  e.container_id = env.container_id;
  e.netns = env.netns;
  e.ifname = env.ifname;
  e.pod_namespace = pod.namespace_name;
  e.pod_name = pod.name;
  e.pod_uid = pod.uid;
  e.ips = std::move(ips);
  e.deadline_ms = timeout_ms;
  return e;
}

std::string describe(const AgentCall& call) {
  switch (call.status) {
    case CallStatus::kAnswered:
      return call.reply.message;
    case CallStatus::kUnreachable:
    case CallStatus::kTimedOut:
    case CallStatus::kBadReply:
      return call.error;
  }
  return call.error;
}

// ADD and CHECK: ask the agent, or decide alone when it cannot be asked. Returns an error, or
// nullopt when the pod may run.
std::optional<CniError> enroll_or_skip(Invocation& inv, const NetConf& conf, Command command,
                                       const PodArgs& pod, std::vector<std::string> ips) {
  const std::string who = pod.namespace_name + "/" + pod.name;
  if (!pod.is_kubernetes_pod()) {
    inv.note("no K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS: not a Kubernetes pod, passing");
    return std::nullopt;
  }
  if (conf.excludes(pod.namespace_name)) {
    inv.note("pod " + who + ": namespace is in exclude_namespaces, passing");
    return std::nullopt;
  }
  AgentCall call = call_agent(
      conf.agent_socket, make_event(command, inv.env, pod, std::move(ips), conf.agent_timeout_ms),
      conf.agent_timeout_ms);
  if (call.status == CallStatus::kAnswered) {
    switch (call.reply.outcome) {
      case Outcome::kEnrolled:
      case Outcome::kSkipped:
      case Outcome::kRemoved:
        inv.note("pod " + who + ": " + std::string(to_string(call.reply.outcome)) +
                 (call.reply.message.empty() ? "" : " (" + call.reply.message + ")"));
        return std::nullopt;
      case Outcome::kFailed:
        return CniError{ErrorCode::kEnrollmentFailed,
                        "the sockmesh node agent could not enroll pod " + who +
                            "; the runtime retries. See the agent's log on this node "
                            "(sockmesh-loader run) for the cause",
                        call.reply.message};
      case Outcome::kUnavailable:
        break;  // the agent cannot decide yet: as if unreachable
    }
  }
  // The agent could not decide. Let the pod start only when it is certainly not to be enrolled.
  const std::string why = describe(call);
  std::string hints_error;  // no usable hints: decided as without them
  if (auto hints = read_namespace_hints(conf.namespace_hints, &hints_error)) {
    if (contains(hints->excluded, pod.namespace_name) ||
        (contains(hints->other, pod.namespace_name) &&
         !contains(hints->ambient, pod.namespace_name))) {
      inv.note("pod " + who + ": the node agent cannot be asked (" + why +
               "); its last hints say namespace " + pod.namespace_name +
               " is not in the mesh, passing");
      return std::nullopt;
    }
  }
  return CniError{ErrorCode::kTryAgainLater,
                  "the sockmesh node agent cannot be asked whether pod " + who +
                      " joins the mesh, so it is not started without it; the runtime retries. "
                      "Check that `sockmesh-loader run` is running on this node (socket " +
                      conf.agent_socket + "), or add namespace " + pod.namespace_name +
                      " to exclude_namespaces in the sockmesh-cni entry of the CNI config to "
                      "start its pods without the mesh",
                  why};
}

PluginOutput version_info(Invocation& inv) {
  Json j;
  j["cniVersion"] = "1.0.0";
  j["supportedVersions"] = kSupportedVersions;
  inv.out.stdout_text = j.dump() + "\n";
  return inv.out;
}

}  // namespace

PluginOutput run_plugin(const CniEnv& env, std::string_view stdin_text) {
  Invocation inv{env, {}};
  if (env.command.empty()) {
    return inv.fail(CniError{ErrorCode::kInvalidEnvironment,
                             "CNI_COMMAND is not set: sockmesh-cni is a CNI plugin, run by the "
                             "container runtime with CNI_COMMAND=ADD|DEL|CHECK|VERSION",
                             ""});
  }
  if (env.command == "VERSION") return version_info(inv);
  auto command = parse_command(env.command);
  if (!command) {
    return inv.fail(CniError{ErrorCode::kInvalidEnvironment,
                             "unknown CNI_COMMAND \"" + env.command +
                                 "\": sockmesh-cni knows ADD, DEL, CHECK and VERSION",
                             ""});
  }

  auto parsed = parse_netconf(stdin_text);
  if (parsed.error) return inv.fail(*parsed.error);
  const NetConf& conf = *parsed.conf;
  inv.version = conf.cni_version;

  if (*command == Command::kDel) {
    if (auto e = require_env(env, {"CNI_CONTAINERID", "CNI_IFNAME"})) return inv.fail(*e);
    PodArgs pod = parse_cni_args(env.args);
    if (!pod.is_kubernetes_pod() || conf.excludes(pod.namespace_name)) return inv.out;
    // Best effort: a DEL that fails makes the runtime retry forever and leak the sandbox, and
    // the agent cleans up pods whose netns is gone by itself.
    AgentCall call =
        call_agent(conf.agent_socket, make_event(Command::kDel, env, pod, {}, kDelTimeoutMs),
                   std::min(conf.agent_timeout_ms, kDelTimeoutMs));
    if (call.status != CallStatus::kAnswered || call.reply.outcome != Outcome::kRemoved) {
      inv.note("DEL of pod " + pod.namespace_name + "/" + pod.name +
               " not confirmed by the node agent (" + describe(call) +
               "); it removes pods whose netns is gone on its own");
    }
    return inv.out;
  }

  if (auto e = require_env(env, {"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"})) {
    return inv.fail(*e);
  }
  if (*command == Command::kCheck && version_less(conf.cni_version, "0.4.0")) {
    return inv.fail(
        CniError{ErrorCode::kIncompatibleVersion,
                 "CHECK needs cniVersion 0.4.0 or later; the config says " + conf.cni_version, ""});
  }
  if (*command == Command::kAdd && !conf.prev_result) {
    return inv.fail(CniError{ErrorCode::kInvalidNetworkConfig,
                             "sockmesh-cni got no prevResult: it is a chained plugin and must "
                             "come after the network plugin in a .conflist (sockmesh-install-cni "
                             "puts it there)",
                             ""});
  }
  std::vector<std::string> ips;
  if (conf.prev_result) {
    auto found = pod_ips(*conf.prev_result, env.ifname);
    if (found.error) return inv.fail(*found.error);
    ips = std::move(found.ips);
  }
  PodArgs pod = parse_cni_args(env.args);
  if (auto e = enroll_or_skip(inv, conf, *command, pod, std::move(ips))) return inv.fail(*e);
  if (*command == Command::kAdd) inv.out.stdout_text = conf.prev_result->dump() + "\n";
  return inv.out;
}

std::optional<NamespaceHints> read_namespace_hints(const std::string& path, std::string* error) {
  // Non-blocking and regular files only: a FIFO in its place must not hang the runtime's ADD.
  std::string text;
  if (int err = read_regular_file(path, kNoFileSizeLimit, &text); err != 0) {
    if (error != nullptr) *error = path + ": " + regular_file_error_text(err);
    return std::nullopt;
  }
  std::string why;
  auto hints = decode_namespace_hints(text, &why);
  if (!hints && error != nullptr) *error = path + ": " + why;
  return hints;
}

}  // namespace sockmesh::cni
