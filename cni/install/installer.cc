#include "cni/install/installer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "cni/install/files.h"
#include "cni/plugin/netconf.h"

namespace sockmesh::cni::install {
namespace {

using Json = nlohmann::ordered_json;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string format(const Json& j) { return j.dump(2) + "\n"; }

std::string base64(const std::string& in) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (static_cast<uint8_t>(in[i]) << 16) | (static_cast<uint8_t>(in[i + 1]) << 8) |
                 static_cast<uint8_t>(in[i + 2]);
    for (int shift : {18, 12, 6, 0}) out.push_back(kAlphabet[(v >> shift) & 63]);
  }
  if (i + 1 == in.size()) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    uint32_t v = (static_cast<uint8_t>(in[i]) << 16) | (static_cast<uint8_t>(in[i + 1]) << 8);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

bool is_ours(const Json& plugin) {
  return plugin.is_object() && plugin.value("type", "") == kPluginType;
}

mode_t mode_of(const std::string& path, mode_t fallback) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : fallback;
}

}  // namespace

std::optional<std::string> first_config(const std::vector<std::string>& names) {
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  for (const auto& name : sorted) {
    if (name.empty() || name[0] == '.') continue;
    if (ends_with(name, ".conf") || ends_with(name, ".conflist")) return name;
  }
  return std::nullopt;
}

Json plugin_entry(const InstallerOptions& options, const std::string& kubeconfig_path) {
  Json entry;
  entry["type"] = kPluginType;
  if (!options.agent_socket.empty()) entry["agent_socket"] = options.agent_socket;
  if (!options.namespace_hints.empty()) entry["namespace_hints"] = options.namespace_hints;
  entry["exclude_namespaces"] = options.exclude_namespaces;
  if (options.agent_timeout_ms > 0) entry["agent_timeout_ms"] = options.agent_timeout_ms;
  if (!kubeconfig_path.empty()) entry["kubeconfig"] = kubeconfig_path;
  return entry;
}

Edit insert_plugin(const std::string& text, bool is_conf, const Json& entry) {
  Edit edit;
  edit.text = text;
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    edit.error = "not a JSON object";
    return edit;
  }
  if (is_conf) {
    if (!j.contains("type")) {
      edit.error = "a .conf without \"type\"";
      return edit;
    }
    // libcni's ConfListFromConf: the list takes the conf's name and version, the conf stays
    // whole as the first plugin.
    Json list;
    if (j.contains("cniVersion")) list["cniVersion"] = j["cniVersion"];
    list["name"] = j.value("name", "");
    list["plugins"] = Json::array({j, entry});
    edit.text = format(list);
    edit.changed = true;
    return edit;
  }
  auto plugins = j.find("plugins");
  if (plugins == j.end() || !plugins->is_array() || plugins->empty()) {
    edit.error = "a .conflist without a \"plugins\" list";
    return edit;
  }
  if (is_ours((*plugins)[0])) {
    edit.error = "sockmesh-cni cannot be the first plugin: it needs a network plugin before it";
    return edit;
  }
  bool found = false;
  for (auto& plugin : *plugins) {
    if (!is_ours(plugin)) continue;
    if (!found && plugin == entry) {
      found = true;
      continue;
    }
    if (!found) {
      plugin = entry;  // settings changed: replaced where it is
      found = true;
      edit.changed = true;
    }
  }
  if (!found) {
    plugins->push_back(entry);
    edit.changed = true;
  }
  // A second entry of ours (someone copied it) would run twice: keep the first only.
  bool first = true;
  Json kept = Json::array();
  for (auto& plugin : *plugins) {
    if (is_ours(plugin)) {
      if (!first) {
        edit.changed = true;
        continue;
      }
      first = false;
    }
    kept.push_back(plugin);
  }
  *plugins = kept;
  if (edit.changed) edit.text = format(j);
  return edit;
}

Edit remove_plugin(const std::string& text) {
  Edit edit;
  edit.text = text;
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    edit.error = "not a JSON object";
    return edit;
  }
  auto plugins = j.find("plugins");
  if (plugins == j.end() || !plugins->is_array()) return edit;
  Json kept = Json::array();
  for (const auto& plugin : *plugins) {
    if (is_ours(plugin)) {
      edit.changed = true;
    } else {
      kept.push_back(plugin);
    }
  }
  if (!edit.changed) return edit;
  *plugins = kept;
  edit.text = format(j);
  return edit;
}

bool has_plugin(const std::string& text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto plugins = j.find("plugins");
  if (plugins == j.end() || !plugins->is_array()) return false;
  return std::any_of(plugins->begin(), plugins->end(), is_ours);
}

std::string render_kubeconfig(const std::string& server, const std::string& ca_pem,
                              const std::string& token) {
  std::string out;
  out += "# Written by sockmesh-install-cni for sockmesh-cni, from the service account of the\n";
  out += "# sockmesh-cni pod; rewritten when the token rotates, removed on uninstall.\n";
  out += "apiVersion: v1\nkind: Config\n";
  out += "clusters:\n- name: local\n  cluster:\n";
  out += "    server: " + server + "\n";
  out += "    certificate-authority-data: " + base64(ca_pem) + "\n";
  out += "users:\n- name: sockmesh-cni\n  user:\n";
  out += "    token: " + token + "\n";
  out += "contexts:\n- name: sockmesh-cni-context\n  context:\n    cluster: local\n";
  out += "    user: sockmesh-cni\n";
  out += "current-context: sockmesh-cni-context\n";
  return out;
}

Installer::Installer(InstallerOptions options) : options_(std::move(options)) {}

Installer::State Installer::load_state() const {
  State state;
  auto text = read_file(state_path());
  if (!text) return state;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return state;
  state.binary = j.value("binary", false);
  state.kubeconfig = j.value("kubeconfig", false);
  if (auto c = j.find("config"); c != j.end() && c->is_object()) {
    ConfigNote note;
    note.path = c->value("path", "");
    note.converted_from = c->value("convertedFrom", "");
    note.original = c->value("original", "");
    note.written = c->value("written", "");
    if (!note.path.empty()) state.config = note;
  }
  return state;
}

bool Installer::save_state(const State& state, Report* report) const {
  nlohmann::json j = {{"version", 1}, {"binary", state.binary}, {"kubeconfig", state.kubeconfig}};
  if (state.config) {
    j["config"] = {{"path", state.config->path},
                   {"convertedFrom", state.config->converted_from},
                   {"original", state.config->original},
                   {"written", state.config->written}};
  }
  std::string text = j.dump(2) + "\n";
  if (auto old = read_file(state_path()); old && *old == text) return true;
  std::string error;
  if (!write_file_atomic(state_path(), text, 0600, &error)) {
    report->problems.push_back(error);
    return false;
  }
  return true;
}

void Installer::sync_binary(State* state, Report* report) {
  if (options_.plugin_binary.empty()) return;
  int err = 0;
  auto source = read_file(options_.plugin_binary, &err);
  if (!source) {
    report->problems.push_back("reading the plugin " + options_.plugin_binary + ": " +
                               std::strerror(err));
    return;
  }
  if (auto installed = read_file(binary_path()); installed && *installed == *source) {
    state->binary = true;
    return;
  }
  std::string error;
  if (!write_file_atomic(binary_path(), *source, 0755, &error)) {
    report->problems.push_back(error);
    return;
  }
  state->binary = true;
  report->changes.push_back("installed " + binary_path());
}

bool Installer::sync_kubeconfig(State* state, Report* report) {
  const std::string& dir = options_.service_account_dir;
  auto token = read_file(dir + "/token");
  auto ca = read_file(dir + "/ca.crt");
  if (!token || !ca || options_.kubernetes_host.empty() || options_.kubernetes_port.empty()) {
    // Not in a cluster: the plugin does not need one (the agent decides).
    return false;
  }
  std::string host = options_.kubernetes_host;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  std::string text =
      render_kubeconfig("https://" + host + ":" + options_.kubernetes_port, *ca, trim(*token));
  if (auto current = read_file(kubeconfig_path()); current && *current == text) {
    state->kubeconfig = true;
    return true;
  }
  std::string error;
  if (!write_file_atomic(kubeconfig_path(), text, 0600, &error)) {
    report->problems.push_back(error);
    return false;
  }
  report->changes.push_back((state->kubeconfig ? "rewrote " : "wrote ") + kubeconfig_path());
  state->kubeconfig = true;
  return true;
}

void Installer::restore(const ConfigNote& note, bool keep_converted_from, Report* report) {
  std::string error;
  auto current = read_file(note.path);
  if (!current) return;  // gone: nothing of ours is left there
  if (*current == note.written) {
    if (!note.converted_from.empty()) {
      if (!keep_converted_from && !file_exists(note.converted_from)) {
        if (!write_file_atomic(note.converted_from, note.original, 0644, &error)) {
          report->problems.push_back(error);
          return;
        }
      }
      if (!remove_file(note.path, &error)) {
        report->problems.push_back(error);
        return;
      }
      report->changes.push_back("restored " + note.converted_from + " (removed " + note.path + ")");
      return;
    }
    if (!write_file_atomic(note.path, note.original, mode_of(note.path, 0644), &error)) {
      report->problems.push_back(error);
      return;
    }
    report->changes.push_back("restored " + note.path);
    return;
  }
  // Changed by someone else since: take out our entry only.
  Edit edit = remove_plugin(*current);
  if (!edit.changed) return;
  if (!write_file_atomic(note.path, edit.text, mode_of(note.path, 0644), &error)) {
    report->problems.push_back(error);
    return;
  }
  report->changes.push_back("removed sockmesh-cni from " + note.path);
}

void Installer::sync_config(State* state, bool with_kubeconfig, Report* report) {
  const std::string& dir = options_.cni_conf_dir;
  auto first = first_config(list_dir(dir));
  if (!first) {
    report->waiting_for_config = true;
    return;
  }
  const std::string target = dir + "/" + *first;
  const bool is_conf = ends_with(target, ".conf");

  // The network plugin's config moved (a file that sorts first appeared, or a new .conf replaced
  // the one we converted): leave the old one as it was.
  if (state->config && state->config->path != target) {
    bool conf_rewritten = state->config->converted_from == target;
    restore(*state->config, conf_rewritten, report);
    state->config.reset();
  }

  int err = 0;
  auto text = read_file(target, &err);
  if (!text) {
    report->problems.push_back("reading " + target + ": " + std::strerror(err));
    return;
  }
  Json entry = plugin_entry(options_, with_kubeconfig ? kubeconfig_path() : "");
  Edit edit = insert_plugin(*text, is_conf, entry);
  if (!edit.error.empty()) {
    report->problems.push_back(target + " is not a usable network config (" + edit.error +
                               "); waiting for it to be fixed");
    return;
  }
  {
    Json j = Json::parse(edit.text, nullptr, false);
    std::string version = j.value("cniVersion", "0.1.0");
    if (!version_supported(version)) {
      report->problems.push_back(target + " has cniVersion " + version +
                                 ", which sockmesh-cni does not speak: not inserted (every pod "
                                 "would fail ADD)");
      return;
    }
  }
  std::string error;
  if (is_conf) {
    std::string list_path = target.substr(0, target.size() - 5) + ".conflist";
    if (file_exists(list_path)) {
      report->problems.push_back("both " + target + " and " + list_path +
                                 " exist: not converting the .conf over the .conflist");
      return;
    }
    if (!write_file_atomic(list_path, edit.text, mode_of(target, 0644), &error) ||
        !remove_file(target, &error)) {
      report->problems.push_back(error);
      return;
    }
    state->config = ConfigNote{list_path, target, *text, edit.text};
    report->changes.push_back("converted " + target + " into " + list_path +
                              " with sockmesh-cni appended");
    return;
  }

  const bool had_ours = has_plugin(*text);
  const bool noted = state->config && state->config->path == target;
  if (!edit.changed) {
    if (!noted) {
      // Ours already (a state file lost, or written by an earlier version): note it.
      state->config = ConfigNote{target, "", remove_plugin(*text).text, *text};
    }
    return;
  }
  if (!write_file_atomic(target, edit.text, mode_of(target, 0644), &error)) {
    report->problems.push_back(error);
    return;
  }
  ConfigNote note{target, "", *text, edit.text};
  if (had_ours) {
    // Only our entry's settings changed: the original is still the one noted.
    note.original = noted ? state->config->original : remove_plugin(*text).text;
    note.converted_from = noted ? state->config->converted_from : "";
    report->changes.push_back("updated the sockmesh-cni entry in " + target);
  } else if (noted) {
    report->changes.push_back("repaired " + target +
                              ": it was rewritten without sockmesh-cni; appended again");
  } else {
    report->changes.push_back("appended sockmesh-cni to " + target);
  }
  state->config = note;
}

Report Installer::sync() {
  Report report;
  State state = load_state();
  sync_binary(&state, &report);
  bool with_kubeconfig = sync_kubeconfig(&state, &report);
  sync_config(&state, with_kubeconfig, &report);
  save_state(state, &report);
  return report;
}

Report Installer::uninstall() {
  Report report;
  State state = load_state();
  std::string error;
  if (state.config) {
    restore(*state.config, false, &report);
  } else {
    // No notes (lost): take our entry out of every config that has one.
    for (const auto& name : list_dir(options_.cni_conf_dir)) {
      if (name[0] == '.' || !ends_with(name, ".conflist")) continue;
      std::string path = options_.cni_conf_dir + "/" + name;
      auto text = read_file(path);
      if (!text || !has_plugin(*text)) continue;
      restore(ConfigNote{path, "", "", ""}, false, &report);
    }
  }
  if (state.kubeconfig && file_exists(kubeconfig_path())) {
    if (remove_file(kubeconfig_path(), &error)) {
      report.changes.push_back("removed " + kubeconfig_path());
    } else {
      report.problems.push_back(error);
    }
  }
  if (state.binary && file_exists(binary_path())) {
    if (remove_file(binary_path(), &error)) {
      report.changes.push_back("removed " + binary_path());
    } else {
      report.problems.push_back(error);
    }
  }
  if (!remove_file(state_path(), &error)) report.problems.push_back(error);
  return report;
}

}  // namespace sockmesh::cni::install
