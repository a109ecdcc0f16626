#include "cni/event/pod_event.h"

#include <nlohmann/json.hpp>

namespace sockmesh::cni {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kCommands[] = {"ADD", "DEL", "CHECK"};
constexpr std::string_view kOutcomes[] = {"enrolled", "skipped", "removed", "failed",
                                          "unavailable"};

// Reads a field of an object with its expected JSON type; fills *error when it is missing (and
// required) or has another type.
bool get_string(const Json& j, const char* key, bool required, std::string* out,
                std::string* error) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) *error = std::string("missing field \"") + key + "\"";
    return !required;
  }
  if (!it->is_string()) {
    *error = std::string("field \"") + key + "\" must be a string";
    return false;
  }
  *out = it->get<std::string>();
  return true;
}

bool get_strings(const Json& j, const char* key, std::vector<std::string>* out,
                 std::string* error) {
  auto it = j.find(key);
  if (it == j.end()) return true;
  if (!it->is_array()) {
    *error = std::string("field \"") + key + "\" must be an array of strings";
    return false;
  }
  for (const auto& item : *it) {
    if (!item.is_string()) {
      *error = std::string("field \"") + key + "\" must be an array of strings";
      return false;
    }
    out->push_back(item.get<std::string>());
  }
  return true;
}

std::optional<Json> parse_object(std::string_view text, std::string* error) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *error = "not valid JSON";
    return std::nullopt;
  }
  if (!j.is_object()) {
    *error = "not a JSON object";
    return std::nullopt;
  }
  return j;
}

// The text of a message. The fields come from the runtime's environment (CNI_CONTAINERID, ...) or
// from the agent's own messages, neither of which is sure to be UTF-8: such bytes are replaced
// (U+FFFD) rather than thrown on, which would abort the plugin or the agent's reply.
std::string dump(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

bool check_version(const Json& j, std::string* error) {
  auto it = j.find("version");
  if (it == j.end() || !it->is_number_integer()) {
    *error = "missing or non-integer field \"version\"" +
             (it == j.end() ? std::string() : " (got " + it->dump() + ")");
    return false;
  }
  // Compared as a JSON number: get<int>() would truncate 4294967297 to 1.
  if (*it != kProtocolVersion) {
    *error = "protocol version " + it->dump() + " is not " + std::to_string(kProtocolVersion) +
             ": sockmesh-cni and the node agent come from different releases";
    return false;
  }
  return true;
}

}  // namespace

std::string_view to_string(Command command) { return kCommands[static_cast<int>(command)]; }

std::optional<Command> parse_command(std::string_view text) {
  for (size_t i = 0; i < std::size(kCommands); ++i) {
    if (kCommands[i] == text) return static_cast<Command>(i);
  }
  return std::nullopt;
}

std::string_view to_string(Outcome outcome) { return kOutcomes[static_cast<int>(outcome)]; }

std::optional<Outcome> parse_outcome(std::string_view text) {
  for (size_t i = 0; i < std::size(kOutcomes); ++i) {
    if (kOutcomes[i] == text) return static_cast<Outcome>(i);
  }
  return std::nullopt;
}

std::string encode(const PodEvent& e) {
  Json j = {{"version", kProtocolVersion},
            {"command", std::string(to_string(e.command))},
            {"containerId", e.container_id},
            {"netns", e.netns},
            {"ifname", e.ifname},
            {"podNamespace", e.pod_namespace},
            {"podName", e.pod_name},
            {"podUid", e.pod_uid},
            {"ips", e.ips},
            {"deadlineMs", e.deadline_ms}};
  return dump(j);
}

std::string encode(const AgentReply& r) {
  Json j = {{"version", kProtocolVersion},
            {"outcome", std::string(to_string(r.outcome))},
            {"message", r.message}};
  return dump(j);
}

std::optional<PodEvent> decode_pod_event(std::string_view text, std::string* error) {
  auto j = parse_object(text, error);
  if (!j || !check_version(*j, error)) return std::nullopt;
  PodEvent e;
  std::string command;
  if (!get_string(*j, "command", true, &command, error)) return std::nullopt;
  auto parsed = parse_command(command);
  if (!parsed) {
    *error = "unknown command \"" + command + "\"";
    return std::nullopt;
  }
  e.command = *parsed;
  if (!get_string(*j, "containerId", true, &e.container_id, error) ||
      !get_string(*j, "netns", false, &e.netns, error) ||
      !get_string(*j, "ifname", true, &e.ifname, error) ||
      !get_string(*j, "podNamespace", true, &e.pod_namespace, error) ||
      !get_string(*j, "podName", true, &e.pod_name, error) ||
      !get_string(*j, "podUid", false, &e.pod_uid, error) ||
      !get_strings(*j, "ips", &e.ips, error)) {
    return std::nullopt;
  }
  if (auto it = j->find("deadlineMs"); it != j->end()) {
    if (!it->is_number_integer()) {
      *error = "field \"deadlineMs\" must be an integer";
      return std::nullopt;
    }
    e.deadline_ms = it->get<int64_t>();
  }
  return e;
}

std::optional<AgentReply> decode_agent_reply(std::string_view text, std::string* error) {
  auto j = parse_object(text, error);
  if (!j || !check_version(*j, error)) return std::nullopt;
  AgentReply r;
  std::string outcome;
  if (!get_string(*j, "outcome", true, &outcome, error) ||
      !get_string(*j, "message", false, &r.message, error)) {
    return std::nullopt;
  }
  auto parsed = parse_outcome(outcome);
  if (!parsed) {
    *error = "unknown outcome \"" + outcome + "\"";
    return std::nullopt;
  }
  r.outcome = *parsed;
  return r;
}

std::string encode(const NamespaceHints& h) {
  Json j = {{"version", kProtocolVersion},
            {"source", h.source},
            {"ambient", h.ambient},
            {"other", h.other},
            {"excluded", h.excluded}};
  return dump(j, 2) + "\n";
}

std::optional<NamespaceHints> decode_namespace_hints(std::string_view text, std::string* error) {
  auto j = parse_object(text, error);
  if (!j || !check_version(*j, error)) return std::nullopt;
  NamespaceHints h;
  if (!get_string(*j, "source", false, &h.source, error) ||
      !get_strings(*j, "ambient", &h.ambient, error) ||
      !get_strings(*j, "other", &h.other, error) ||
      !get_strings(*j, "excluded", &h.excluded, error)) {
    return std::nullopt;
  }
  return h;
}

}  // namespace sockmesh::cni
