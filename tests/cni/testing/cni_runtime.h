#pragma once
// The test as container runtime (there is no cnitool on Debian): runs the plugins of a conflist
// in order for ADD and CHECK and in reverse for DEL, each with CNI_* in its environment and its
// network config (name, cniVersion, prevResult injected as libcni does) on stdin, inside the
// "node" network namespace the test made, so that the bridge and host veths never touch the
// machine's own network.
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sockmesh::cni::testing {

struct PodRef {
  std::string container_id;
  std::string netns;  // the pod's netns path
  std::string ifname = "eth0";
  std::string pod_namespace;
  std::string pod_name;
  std::string pod_uid;
};

struct PluginRun {
  std::string type;
  int exit_code = -1;
  std::string out;
  std::string err;
  nlohmann::ordered_json json() const { return nlohmann::ordered_json::parse(out); }
};

// Runs the plugin at `path` as a runtime does: exactly `env` as its environment, `stdin_text` on
// stdin, stdout and stderr captured; inside the netns at `netns_path` when it is not empty.
PluginRun run_plugin_process(const std::string& path, const std::map<std::string, std::string>& env,
                             const std::string& stdin_text, const std::string& netns_path = "");

struct ChainRun {
  std::vector<PluginRun> plugins;  // in the order they ran; stops at the first failure
  bool ok() const;
  const PluginRun& last() const { return plugins.back(); }
  // The JSON the chain produced (the last plugin's stdout).
  nlohmann::ordered_json result() const;
  std::string describe() const;
};

class CniRuntime {
 public:
  // `node_netns`: where plugins run (/run/netns/<node>); `plugin_dirs`: CNI_PATH.
  CniRuntime(nlohmann::ordered_json conflist, std::string node_netns,
             std::vector<std::string> plugin_dirs);

  ChainRun add(const PodRef& pod);
  // CHECK and DEL get the result of the last ADD of the pod as prevResult, as libcni caches it.
  ChainRun check(const PodRef& pod);
  ChainRun del(const PodRef& pod);
  // One plugin alone with a config of the test's choosing.
  PluginRun exec(const std::string& type, const std::string& command, const PodRef& pod,
                 const std::string& stdin_text,
                 const std::map<std::string, std::string>& extra = {});

 private:
  ChainRun run(const std::string& command, const PodRef& pod, bool reverse);
  std::string find_plugin(const std::string& type) const;

  nlohmann::ordered_json conflist_;
  std::string node_netns_;
  std::vector<std::string> plugin_dirs_;
  std::map<std::string, nlohmann::ordered_json> results_;  // by container id
};

}  // namespace sockmesh::cni::testing
