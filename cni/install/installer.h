#pragma once
// sockmesh-install-cni's work: put sockmesh-cni on the node as istio-cni's installer puts its
// plugin there, and keep it there.
//   - the binary into the CNI bin dir;
//   - a kubeconfig for the plugin from the pod's service account (rewritten as the token rotates);
//   - an entry {"type": "sockmesh-cni", ...} appended to the plugins of the node's network
//     config: the first *.conf or *.conflist of the CNI conf dir in name order (the one the runtime
//     uses); a .conf is turned into a .conflist holding it as the first plugin.
// Every write is atomic. What was done is noted in a state file in the conf dir
// (.sockmesh-cni-install.json, hidden from libcni), so that uninstall removes exactly that: a
// config file it changed and nobody touched since gets its original bytes back; one changed since
// loses only the sockmesh-cni entry.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sockmesh::cni::install {

inline constexpr char kPluginType[] = "sockmesh-cni";
inline constexpr char kStateFileName[] = ".sockmesh-cni-install.json";

struct InstallerOptions {
  std::string cni_bin_dir = "/opt/cni/bin";
  std::string cni_conf_dir = "/etc/cni/net.d";
  std::string plugin_binary;  // the sockmesh-cni to copy; empty: do not copy
  std::string service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
  std::string kubernetes_host;  // KUBERNETES_SERVICE_HOST
  std::string kubernetes_port;  // KUBERNETES_SERVICE_PORT
  std::string kubeconfig_name = "ZZZ-sockmesh-cni-kubeconfig";
  // The plugin's settings.
  std::string agent_socket;     // empty: the plugin's default
  std::string namespace_hints;  // empty: the plugin's default
  std::vector<std::string> exclude_namespaces = {"kube-system"};
  int agent_timeout_ms = 0;  // 0: the plugin's default
};

struct Report {
  std::vector<std::string> changes;   // what was written or removed; empty: nothing to do
  std::vector<std::string> problems;  // what could not be done (and will be tried again)
  bool waiting_for_config = false;    // no network config in the conf dir yet
};

// Pure parts, tested against golden files.

// The file libcni would load first: the first *.conf or *.conflist by name (hidden files skipped).
std::optional<std::string> first_config(const std::vector<std::string>& names);
// sockmesh-cni's entry in a conflist's "plugins".
nlohmann::ordered_json plugin_entry(const InstallerOptions& options,
                                    const std::string& kubeconfig_path);

struct Edit {
  std::string text;
  bool changed = false;
  std::string error;  // not a usable network config; text is unchanged then
};
// Appends `entry` to a conflist's plugins, or replaces an earlier sockmesh-cni entry in place;
// with `is_conf`, turns a .conf's text into a conflist {cniVersion, name, plugins: [conf, entry]}.
Edit insert_plugin(const std::string& text, bool is_conf, const nlohmann::ordered_json& entry);
// Removes every sockmesh-cni entry from a conflist.
Edit remove_plugin(const std::string& text);
bool has_plugin(const std::string& text);

// A kubeconfig (YAML) with the server, the cluster CA and the service account token.
std::string render_kubeconfig(const std::string& server, const std::string& ca_pem,
                              const std::string& token);

class Installer {
 public:
  explicit Installer(InstallerOptions options);
  // Installs or repairs; idempotent (a second call with nothing changed on disk changes nothing).
  Report sync();
  // Removes what sync() added, as the state file records it.
  Report uninstall();

  const InstallerOptions& options() const { return options_; }
  std::string state_path() const { return options_.cni_conf_dir + "/" + kStateFileName; }
  std::string kubeconfig_path() const {
    return options_.cni_conf_dir + "/" + options_.kubeconfig_name;
  }
  std::string binary_path() const { return options_.cni_bin_dir + "/" + kPluginType; }

 private:
  struct ConfigNote {
    std::string path;            // the conflist that holds our entry
    std::string converted_from;  // the .conf it was made from; empty when not converted
    std::string original;        // the bytes before us (of converted_from when converted)
    std::string written;         // the bytes we wrote
  };
  struct State {
    bool binary = false;
    bool kubeconfig = false;
    std::optional<ConfigNote> config;
  };
  State load_state() const;
  bool save_state(const State& state, Report* report) const;
  void sync_binary(State* state, Report* report);
  bool sync_kubeconfig(State* state, Report* report);
  void sync_config(State* state, bool with_kubeconfig, Report* report);
  // Takes our entry out of a config we no longer use (the first file changed) or on uninstall.
  void restore(const ConfigNote& note, bool keep_converted_from, Report* report);

  InstallerOptions options_;
};

}  // namespace sockmesh::cni::install
