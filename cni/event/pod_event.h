#pragma once
// The wire format between sockmesh-cni (the chained CNI plugin) and the node agent
// (`sockmesh-loader run`): the one definition both sides compile.
//
// Transport: a Unix SOCK_SEQPACKET socket (default /var/run/sockmesh/cni.sock, mode 0600). The
// plugin connects, sends ONE message, a PodEvent as a JSON object, and waits up to its deadline
// for ONE message back, an AgentReply as a JSON object; then both sides close. SEQPACKET keeps
// message boundaries, so there is no framing to get wrong, and a message larger than
// kMaxMessageBytes is refused as truncated. istio-cni sends the same facts as an HTTP POST over a
// Unix stream socket; HTTP would add a parser to a binary that must stay small and static.
//
//   PodEvent   {"version": 1, "command": "ADD"|"DEL"|"CHECK", "containerId": "...",
//               "netns": "/var/run/netns/cni-...", "ifname": "eth0",
//               "podNamespace": "...", "podName": "...", "podUid": "...",
//               "ips": ["10.244.1.5", "fd00::5"], "deadlineMs": 10000}
//   AgentReply {"version": 1, "outcome": "enrolled"|"skipped"|"removed"|"failed"|"unavailable",
//               "message": "..."}
//
// Try it by hand: `socat - UNIX-CONNECT:/var/run/sockmesh/cni.sock,type=5` (5 = SOCK_SEQPACKET).
//
// The agent also publishes NamespaceHints (default /var/run/sockmesh/cni-namespaces.json): which
// namespaces it last knew to be ambient. The plugin reads them only when the agent cannot be
// reached, to let pods of namespaces that are known not to be enrolled start anyway.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sockmesh::cni {

inline constexpr int kProtocolVersion = 1;
inline constexpr size_t kMaxMessageBytes = size_t{64} * 1024;
inline constexpr char kDefaultAgentSocket[] = "/var/run/sockmesh/cni.sock";
inline constexpr char kDefaultNamespaceHints[] = "/var/run/sockmesh/cni-namespaces.json";

enum class Command { kAdd, kDel, kCheck };

std::string_view to_string(Command command);
std::optional<Command> parse_command(std::string_view text);

struct PodEvent {
  Command command = Command::kAdd;
  std::string container_id;
  std::string netns;  // may be empty on DEL
  std::string ifname;
  std::string pod_namespace;
  std::string pod_name;
  std::string pod_uid;           // K8S_POD_UID; empty when the runtime does not pass it
  std::vector<std::string> ips;  // the pod's addresses from prevResult, without prefix length
  int64_t deadline_ms = 0;       // how long the plugin waits for the reply

  bool operator==(const PodEvent&) const = default;
};

enum class Outcome {
  kEnrolled,     // ADD/CHECK: the pod is in the mesh (capture on, proxy has it)
  kSkipped,      // ADD/CHECK: the pod is not to be enrolled; nothing was done
  kRemoved,      // DEL: whatever was enrolled is gone (also when nothing was)
  kFailed,       // the agent tried and failed; the message says why, nothing is left half-done
  kUnavailable,  // the agent cannot decide yet (starting, labels not synced): treat as unreachable
};

std::string_view to_string(Outcome outcome);
std::optional<Outcome> parse_outcome(std::string_view text);

struct AgentReply {
  Outcome outcome = Outcome::kFailed;
  std::string message;

  bool operator==(const AgentReply&) const = default;
};

std::string encode(const PodEvent& event);
std::string encode(const AgentReply& reply);
// nullopt and *error set when the text is not valid JSON or a field is missing or mistyped.
std::optional<PodEvent> decode_pod_event(std::string_view text, std::string* error);
std::optional<AgentReply> decode_agent_reply(std::string_view text, std::string* error);

// What the agent last knew about namespaces, for the plugin's use while the agent is down.
struct NamespaceHints {
  std::string source;                 // "kubernetes" or "local-config"
  std::vector<std::string> ambient;   // namespaces whose pods are enrolled
  std::vector<std::string> other;     // known namespaces whose pods are not (unless opted in)
  std::vector<std::string> excluded;  // never enrolled

  bool operator==(const NamespaceHints&) const = default;
};

std::string encode(const NamespaceHints& hints);
std::optional<NamespaceHints> decode_namespace_hints(std::string_view text, std::string* error);

}  // namespace sockmesh::cni
