// The CNI plugin as the container runtime drives it: run_plugin with an environment (CNI_*) and
// stdin (the network configuration with prevResult), both from the input, and the node agent's
// reply from the input too. Input: "NAME=value" lines, a NUL byte, stdin, a NUL byte, the agent's
// reply (absent: the agent cannot be reached).
//
// The agent is this file's call_agent, which the linker takes instead of agent_client.cc's (the
// plugin's library is static): no socket is ever opened, and the event the plugin would send is
// checked to decode as the agent would read it.
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "cni/event/pod_event.h"
#include "cni/plugin/agent_client.h"
#include "cni/plugin/netconf.h"
#include "cni/plugin/plugin.h"
#include "fuzz_util.h"

namespace {
std::string_view g_agent_reply;
bool g_agent_present = false;
}  // namespace

namespace sockmesh::cni {

AgentCall call_agent(const std::string& socket_path, const PodEvent& event, int timeout_ms) {
  FUZZ_CHECK(timeout_ms >= 0);
  (void)socket_path;
  std::string request = encode(event);
  std::string error;
  auto back = decode_pod_event(request, &error);
  FUZZ_CHECK(back.has_value());
  // Equal but for bytes that are not UTF-8, which encode() replaces: the encoding is a fixed point.
  FUZZ_CHECK(encode(*back) == request);
  AgentCall call;
  if (!g_agent_present) {
    call.status = CallStatus::kUnreachable;
    call.error = "connect " + socket_path + ": refused (fuzz)";
    return call;
  }
  auto reply = decode_agent_reply(g_agent_reply, &error);
  if (!reply) {
    call.status = CallStatus::kBadReply;
    call.error = "the node agent's answer: " + error;
    return call;
  }
  call.status = CallStatus::kAnswered;
  call.reply = std::move(*reply);
  return call;
}

}  // namespace sockmesh::cni

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  sockmesh::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sockmesh::cni;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto nul = in.find('\0');
  std::string_view env_text = in.substr(0, nul);
  std::string_view stdin_text = nul == std::string_view::npos ? "" : in.substr(nul + 1);
  auto nul2 = stdin_text.find('\0');
  g_agent_present = nul2 != std::string_view::npos;
  g_agent_reply = g_agent_present ? stdin_text.substr(nul2 + 1) : "";
  stdin_text = stdin_text.substr(0, nul2);

  std::map<std::string, std::string> vars;
  while (!env_text.empty()) {
    auto nl = env_text.find('\n');
    std::string_view line = env_text.substr(0, nl);
    env_text = nl == std::string_view::npos ? "" : env_text.substr(nl + 1);
    auto eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    vars[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  CniEnv env = CniEnv::from_map(vars);

  // The pieces on their own, as a runtime's input reaches them.
  PodArgs pod = parse_cni_args(env.args);
  (void)pod.is_kubernetes_pod();
  auto parsed = parse_netconf(stdin_text);
  FUZZ_CHECK(parsed.conf.has_value() != parsed.error.has_value());
  if (parsed.conf) {
    FUZZ_CHECK(version_supported(parsed.conf->cni_version));
    (void)parsed.conf->excludes(pod.namespace_name);
    if (parsed.conf->prev_result) {
      auto ips = pod_ips(*parsed.conf->prev_result, env.ifname);
      if (!ips.error) {
        for (const auto& ip : ips.ips) FUZZ_CHECK(!ip.empty());
      }
    }
    // The plugin reads the agent's namespace hints from this path when the agent cannot be
    // asked; a FIFO or a device there would block the target, not test it.
    struct stat st;
    const std::string& hints = parsed.conf->namespace_hints;
    if (!hints.empty() && stat(hints.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return 0;
  }

  PluginOutput out = run_plugin(env, stdin_text);
  FUZZ_CHECK(out.exit_code == 0 || !out.stdout_text.empty());
  return 0;
}
