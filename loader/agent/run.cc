#include "loader/agent/run.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <map>

#include "base/log.h"
#include "loader/agent/cni_server.h"
#include "loader/agent/enroller.h"
#include "loader/agent/kube/kubernetes_labels.h"
#include "loader/agent/kube/owner_daemonset.h"
#include "loader/agent/local_config_labels.h"
#include "loader/agent/node_agent.h"
#include "loader/agent/pod_discovery.h"

extern char** environ;

namespace sockmesh::agent {
namespace {

std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::string node_name(const RunOptions& options, const std::map<std::string, std::string>& env) {
  if (!options.node_name.empty()) return options.node_name;
  if (auto it = env.find("NODE_NAME"); it != env.end() && !it->second.empty()) return it->second;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

int fail(const std::string& message) {
  SM_ERROR("agent") << message;
  return 1;
}

std::unique_ptr<LabelSource> make_source(const RunOptions& options, std::string* error) {
  auto env = environment();
  std::string mode = options.labels_from;
  if (mode == "auto") {
    mode = !options.kubeconfig.empty() || env.count("KUBERNETES_SERVICE_HOST") ? "kubernetes"
                                                                               : "config";
  }
  if (mode == "kubernetes") {
    auto access = options.kubeconfig.empty() ? kube::in_cluster(env)
                                             : kube::load_kubeconfig(options.kubeconfig);
    if (!access) {
      *error = "Kubernetes API: " + access.error().message;
      return nullptr;
    }
    return std::make_unique<kube::KubernetesLabels>(*access, node_name(options, env));
  }
  if (mode != "config") {
    *error = "--labels-from must be kubernetes, config or auto, not " + mode;
    return nullptr;
  }
  auto source = std::make_unique<LocalConfigLabels>(options.config_path, options.config_poll);
  if (auto s = source->load(); !s) {
    *error = "local config: " + s.error().message;
    return nullptr;
  }
  return source;
}

// At SIGTERM with --uninstall-when-removed: whether this stop is an uninstall. Anything short of
// a clear answer from the API keeps the datapath, because removing it during an upgrade would
// take every pod of the node out of the mesh.
bool stop_is_uninstall(const RunOptions& options) {
  const std::string& owner = options.uninstall_when_removed;
  auto env = environment();
  auto access = options.kubeconfig.empty() ? kube::in_cluster(env)
                                           : kube::load_kubeconfig(options.kubeconfig);
  if (!access) {
    SM_WARN("agent") << "cannot ask the Kubernetes API whether DaemonSet " << owner
                     << " is still there (" << access.error().message
                     << "); keeping the datapath";
    return false;
  }
  kube::ApiClient api(*access, std::chrono::seconds(5));
  auto answer = kube::owner_daemonset_state(api, owner);
  switch (answer.state) {
    case kube::OwnerState::kGone:
    case kube::OwnerState::kDeleting:
      SM_INFO("agent") << "DaemonSet " << owner << " is " << kube::owner_state_name(answer.state)
                       << " (" << answer.detail << "): this is an uninstall; removing the datapath";
      return true;
    case kube::OwnerState::kPresent:
      SM_INFO("agent") << "DaemonSet " << owner << " is still there (" << answer.detail
                       << "): an upgrade or a restart; enrolled pods stay enrolled";
      return false;
    case kube::OwnerState::kUnknown:
      break;
  }
  SM_WARN("agent") << "cannot tell whether DaemonSet " << owner << " is still there ("
                   << answer.detail << "); keeping the datapath (remove it with "
                   << "sockmesh-loader uninstall --force)";
  return false;
}

}  // namespace

int run_agent(const RunOptions& options, std::unique_ptr<WorkloadHandoff> handoff) {
  // Signals are taken synchronously by this thread; every thread started below inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // The plugin's socket first: a second agent on the node stops here, before it changes anything.
  const std::string cni_socket_path =
      options.socket_path.empty() ? options.run_dir + "/cni.sock" : options.socket_path;
  auto cni_socket = CniEventServer::claim(cni_socket_path);
  if (!cni_socket) return fail("CNI event socket: " + cni_socket.error().message);

  if (!options.skip_install) {
    // install() logs what it changes.
    auto report = loader::install(options.install);
    if (!report) return fail("installing the datapath: " + report.error().message);
  }

  std::string error;
  auto source = make_source(options, &error);
  if (!source) return fail(error);

  LoaderEnrollerOptions enroller_options{options.install.pin_root};
  enroller_options.exempt_probes = options.exempt_probes;
  enroller_options.probe_cgroup = options.probe_cgroup;
  enroller_options.cgroup_root = options.install.cgroup;
  LoaderEnroller enroller(enroller_options);
  enroller.refresh_probe_exemption();
  ProcPodNetnsFinder finder;
  AgentOptions agent_options;
  agent_options.excluded_namespaces = options.excluded_namespaces;
  agent_options.trust_domain = options.trust_domain;
  agent_options.state_file = options.run_dir + "/agent-pods.json";
  agent_options.hints_file = options.run_dir + "/cni-namespaces.json";
  if (!handoff)
    SM_INFO("agent") << "no proxy handoff configured: pods are enrolled in the datapath only";
  NodeAgent agent(agent_options, &enroller, std::move(handoff), &finder);
  agent.set_label_source(source.get());
  if (auto s = agent.start(); !s) return fail("reconciling enrolled pods: " + s.error().message);

  CniEventServer server(
      cni_socket_path, [&](const cni::PodEvent& e) { return agent.handle(e); },
      [&](const cni::PodEvent& e) { agent.reply_lost(e); });
  if (auto s = server.start(std::move(*cni_socket)); !s) {
    return fail("CNI event socket: " + s.error().message);
  }
  source->start([&](LabelViewPtr view) { agent.update_labels(std::move(view)); });
  SM_INFO("agent") << "running: labels from " << source->name() << ", pin root "
                   << options.install.pin_root;

  for (;;) {
    timespec wait{};
    wait.tv_sec = options.sweep_interval.count() / 1000;
    wait.tv_nsec = (options.sweep_interval.count() % 1000) * 1000000;
    int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGTERM || sig == SIGINT) break;
    agent.sweep();
    enroller.refresh_probe_exemption();  // a restarted kubelet has a new cgroup
  }
  bool uninstall = !options.uninstall_when_removed.empty() && stop_is_uninstall(options);
  if (!uninstall) {
    SM_INFO("agent") << "stopping; enrolled pods stay enrolled (a restarted agent adopts them)";
  }
  agent.shutdown();
  server.stop();
  source->stop();
  if (!uninstall) return 0;
  int rc = 0;
  if (auto s = agent.unenroll_all(); !s) {
    SM_ERROR("agent") << s.error().message << "; removing the datapath anyway";
    rc = 1;
  }
  // --force: a pod that could not be unenrolled above must not keep the node's pins alive.
  if (auto s = loader::uninstall(options.install.pin_root, /*force=*/true); !s) {
    SM_ERROR("agent") << "removing the datapath under " << options.install.pin_root << ": "
                      << s.error().message;
    return 1;
  }
  SM_INFO("agent") << "datapath removed from " << options.install.pin_root
                   << " (programs detached, pins gone)";
  return rc;
}

}  // namespace sockmesh::agent
