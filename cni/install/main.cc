// sockmesh-install-cni: installs sockmesh-cni on the node and keeps it installed (see
// installer.h). Runs as a DaemonSet container with the host's CNI bin and conf dirs mounted.
//
// Exit status: 0 done (or stopped by SIGTERM/SIGINT), 1 a one-shot run left problems, 2 bad usage.
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "base/log.h"
#include "base/version.h"
#include "cni/install/installer.h"
#include "cni/install/watch.h"

namespace {

using sockmesh::cni::install::DirectoryWatch;
using sockmesh::cni::install::Installer;
using sockmesh::cni::install::InstallerOptions;
using sockmesh::cni::install::Report;

constexpr char kUsage[] = R"(usage: sockmesh-install-cni [OPTIONS]

Copies sockmesh-cni into the CNI bin dir, writes a kubeconfig for it from this pod's service
account, appends it to the first network config of the CNI conf dir (a .conf becomes a .conflist),
and keeps watching: a config rewritten without it is repaired. Every option can also be given as
an environment variable SOCKMESH_<OPTION> (e.g. SOCKMESH_CNI_CONF_DIR).

  --cni-bin-dir DIR          default /opt/cni/bin
  --cni-conf-dir DIR         default /etc/cni/net.d
  --plugin PATH              the sockmesh-cni to install (default: next to this program)
  --service-account-dir DIR  default /var/run/secrets/kubernetes.io/serviceaccount
  --kubeconfig-name NAME     default ZZZ-sockmesh-cni-kubeconfig (in the conf dir)
  --agent-socket PATH        the node agent's socket, for the plugin (its default otherwise)
  --namespace-hints PATH     the agent's namespace hints, for the plugin
  --exclude-namespaces LIST  comma-separated, default kube-system
  --agent-timeout-ms N       how long the plugin waits for the agent
  --poll-interval-ms N       re-check this often even without inotify events (default 5000)
  --once                     install or repair once and exit
  --uninstall                remove what an earlier run added and exit
  --uninstall-on-exit        on SIGTERM, remove it too (default: leave the plugin in place, so
                             that pods keep failing ADD rather than starting outside the mesh
                             while the agent is being upgraded)
)";

struct Flags {
  InstallerOptions installer;
  int poll_ms = 5000;
  bool once = false;
  bool uninstall = false;
  bool uninstall_on_exit = false;
};

std::string env_name(const std::string& option) {
  std::string name = "SOCKMESH_";
  for (char c : option.substr(2))
    name.push_back(c == '-' ? '_' : static_cast<char>(std::toupper(c)));
  return name;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream parts(list);
  std::string part;
  while (std::getline(parts, part, ',')) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

std::string self_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

bool parse(int argc, char** argv, Flags* f, std::string* error) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  f->installer.kubernetes_host = host ? host : "";
  f->installer.kubernetes_port = port ? port : "";
  f->installer.plugin_binary = self_dir() + "/sockmesh-cni";
  const std::vector<std::pair<std::string, std::string*>> strings = {
      {"--cni-bin-dir", &f->installer.cni_bin_dir},
      {"--cni-conf-dir", &f->installer.cni_conf_dir},
      {"--plugin", &f->installer.plugin_binary},
      {"--service-account-dir", &f->installer.service_account_dir},
      {"--kubeconfig-name", &f->installer.kubeconfig_name},
      {"--agent-socket", &f->installer.agent_socket},
      {"--namespace-hints", &f->installer.namespace_hints},
  };
  std::map<std::string, std::string> values;
  // Environment first, flags override.
  for (const auto& name : {"--cni-bin-dir", "--cni-conf-dir", "--plugin", "--service-account-dir",
                           "--kubeconfig-name", "--agent-socket", "--namespace-hints",
                           "--exclude-namespaces", "--agent-timeout-ms", "--poll-interval-ms"}) {
    if (const char* v = std::getenv(env_name(name).c_str())) values[name] = v;
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (arg == "--once") {
      f->once = true;
      continue;
    }
    if (arg == "--uninstall") {
      f->uninstall = true;
      continue;
    }
    if (arg == "--uninstall-on-exit") {
      f->uninstall_on_exit = true;
      continue;
    }
    std::string name = arg, value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      *error = name + " needs a value";
      return false;
    }
    values[name] = value;
  }
  for (const auto& [name, value] : values) {
    bool known = false;
    for (const auto& [flag, dst] : strings) {
      if (flag == name) {
        *dst = value;
        known = true;
      }
    }
    try {
      if (name == "--exclude-namespaces") {
        f->installer.exclude_namespaces = split(value);
        known = true;
      } else if (name == "--agent-timeout-ms") {
        f->installer.agent_timeout_ms = std::stoi(value);
        known = true;
      } else if (name == "--poll-interval-ms") {
        f->poll_ms = std::stoi(value);
        known = true;
      }
    } catch (const std::exception&) {
      *error = name;
      *error += " needs a number, not " + value;
      return false;
    }
    if (!known) {
      *error = "unknown option " + name;
      return false;
    }
  }
  return true;
}

bool log_report(const Report& report, bool* waiting_logged) {
  for (const auto& c : report.changes) SM_INFO("install") << c;
  for (const auto& p : report.problems) SM_WARN("install") << p;
  if (report.waiting_for_config && !*waiting_logged) {
    SM_INFO("install") << "no *.conf or *.conflist in the CNI conf dir yet: waiting for the "
                          "network plugin to write its config";
  }
  *waiting_logged = report.waiting_for_config;
  return report.problems.empty();
}

}  // namespace

int main(int argc, char** argv) {
  if (sockmesh::print_version_if_asked(argc, argv, "sockmesh-install-cni")) return 0;
  Flags flags;
  std::string error;
  if (!parse(argc, argv, &flags, &error)) {
    std::cerr << "sockmesh-install-cni: " << error << "\n\n" << kUsage;
    return 2;
  }
  Installer installer(flags.installer);
  bool waiting_logged = false;
  if (flags.uninstall) {
    Report report = installer.uninstall();
    if (report.changes.empty() && report.problems.empty()) {
      SM_INFO("install") << "nothing to remove";
    }
    return log_report(report, &waiting_logged) ? 0 : 1;
  }
  if (flags.once) {
    Report report = installer.sync();
    if (report.changes.empty() && report.problems.empty() && !report.waiting_for_config) {
      SM_INFO("install") << "sockmesh-cni is installed already; nothing changed";
    }
    return log_report(report, &waiting_logged) && !report.waiting_for_config ? 0 : 1;
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  int stop_fd = signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);

  DirectoryWatch watch({flags.installer.cni_conf_dir, flags.installer.service_account_dir,
                        flags.installer.cni_bin_dir});
  SM_INFO("install") << "installing sockmesh-cni into " << flags.installer.cni_conf_dir
                     << " and watching it";
  for (;;) {
    log_report(installer.sync(), &waiting_logged);
    watch.wait(std::chrono::milliseconds(flags.poll_ms), std::chrono::milliseconds(100), stop_fd);
    signalfd_siginfo info{};
    if (read(stop_fd, &info, sizeof(info)) == sizeof(info)) break;
  }
  if (flags.uninstall_on_exit) {
    log_report(installer.uninstall(), &waiting_logged);
  } else {
    SM_INFO("install") << "stopping; sockmesh-cni stays installed";
  }
  return 0;
}
