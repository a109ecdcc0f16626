#include "testing/cni_runtime.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <optional>

namespace sockmesh::cni::testing {

using Json = nlohmann::ordered_json;

bool ChainRun::ok() const {
  return !plugins.empty() && std::all_of(plugins.begin(), plugins.end(),
                                         [](const PluginRun& p) { return p.exit_code == 0; });
}

Json ChainRun::result() const { return Json::parse(last().out); }

std::string ChainRun::describe() const {
  std::string out;
  for (const auto& p : plugins) {
    out += p.type + " exit " + std::to_string(p.exit_code) + "\n  stdout: " + p.out +
           "\n  stderr: " + p.err + "\n";
  }
  return out;
}

CniRuntime::CniRuntime(Json conflist, std::string node_netns, std::vector<std::string> plugin_dirs)
    : conflist_(std::move(conflist)),
      node_netns_(std::move(node_netns)),
      plugin_dirs_(std::move(plugin_dirs)) {}

std::string CniRuntime::find_plugin(const std::string& type) const {
  for (const auto& dir : plugin_dirs_) {
    std::string path = dir + "/" + type;
    struct stat st {};
    if (stat(path.c_str(), &st) == 0) return path;
  }
  return "/nonexistent/" + type;
}

PluginRun CniRuntime::exec(const std::string& type, const std::string& command, const PodRef& pod,
                           const std::string& stdin_text,
                           const std::map<std::string, std::string>& extra) {
  std::string cni_path;
  for (const auto& d : plugin_dirs_) cni_path += (cni_path.empty() ? "" : ":") + d;
  std::map<std::string, std::string> env = {
      {"CNI_COMMAND", command},
      {"CNI_CONTAINERID", pod.container_id},
      {"CNI_NETNS", pod.netns},
      {"CNI_IFNAME", pod.ifname},
      {"CNI_PATH", cni_path},
      {"CNI_ARGS",
       "IgnoreUnknown=1;K8S_POD_NAMESPACE=" + pod.pod_namespace + ";K8S_POD_NAME=" + pod.pod_name +
           ";K8S_POD_INFRA_CONTAINER_ID=" + pod.container_id + ";K8S_POD_UID=" + pod.pod_uid},
      {"PATH", "/usr/sbin:/usr/bin:/sbin:/bin"},
  };
  for (const auto& [k, v] : extra) env[k] = v;
  std::map<std::string, std::string> set;
  for (const auto& [k, v] : env) {
    if (!v.empty() || k == "CNI_NETNS") set[k] = v;
  }
  PluginRun run = run_plugin_process(find_plugin(type), set, stdin_text, node_netns_);
  run.type = type;
  return run;
}

PluginRun run_plugin_process(const std::string& path, const std::map<std::string, std::string>& env,
                             const std::string& stdin_text, const std::string& netns_path) {
  int in[2], out[2], err[2];
  PluginRun run;
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    return run;
  }
  pid_t pid = fork();
  if (pid == 0) {
    if (!netns_path.empty()) {
      int node = open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (node < 0 || setns(node, CLONE_NEWNET) != 0) _exit(126);
    }
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    std::vector<std::string> kv;
    for (const auto& [k, v] : env) kv.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : kv) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = path;
    char* argv[] = {exe.data(), nullptr};
    execve(exe.c_str(), argv, envp.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  size_t done = 0;
  while (done < stdin_text.size()) {
    ssize_t n = write(in[1], stdin_text.data() + done, stdin_text.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(in[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof(buf))) > 0) run.out.append(buf, static_cast<size_t>(n));
  while ((n = read(err[0], buf, sizeof(buf))) > 0) run.err.append(buf, static_cast<size_t>(n));
  close(out[0]);
  close(err[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

ChainRun CniRuntime::run(const std::string& command, const PodRef& pod, bool reverse) {
  ChainRun chain;
  std::vector<Json> plugins(conflist_["plugins"].begin(), conflist_["plugins"].end());
  if (reverse) std::reverse(plugins.begin(), plugins.end());
  std::optional<Json> prev;
  if (command != "ADD") {
    if (auto it = results_.find(pod.container_id); it != results_.end()) prev = it->second;
  }
  for (const auto& plugin : plugins) {
    Json conf = plugin;
    conf["cniVersion"] = conflist_["cniVersion"];
    conf["name"] = conflist_["name"];
    if (prev) conf["prevResult"] = *prev;
    PluginRun r = exec(plugin.value("type", ""), command, pod, conf.dump());
    chain.plugins.push_back(r);
    if (r.exit_code != 0) break;
    if (command == "ADD") prev = Json::parse(r.out);
  }
  if (command == "ADD" && chain.ok()) results_[pod.container_id] = *prev;
  if (command == "DEL" && chain.ok()) results_.erase(pod.container_id);
  return chain;
}

ChainRun CniRuntime::add(const PodRef& pod) { return run("ADD", pod, false); }
ChainRun CniRuntime::check(const PodRef& pod) { return run("CHECK", pod, false); }
ChainRun CniRuntime::del(const PodRef& pod) { return run("DEL", pod, true); }

}  // namespace sockmesh::cni::testing
