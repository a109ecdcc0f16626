// sockmesh-loader: loads, attaches and pins the sockmesh datapath and enrolls pods into it.
//
//   sockmesh-loader [--pin-root DIR] [--log-level LEVEL] COMMAND [OPTIONS]
//
// Exit status: 0 done, 1 failed (the message says what is missing), 2 bad usage.
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "base/log.h"
#include "base/version.h"
#include "loader/agent/kube/owner_daemonset.h"
#include "loader/agent/run.h"
#include "loader/agent/zds_server.h"
#include "loader/attach/node.h"
#include "loader/attach/pod.h"
#include "loader/attach/probe_snat.h"
#include "loader/maps/counters.h"
#include "loader/maps/listener_map.h"
#include "loader/maps/workload_map.h"

namespace sockmesh::loader {
namespace {

constexpr char kUsage[] =
    R"(usage: sockmesh-loader [--pin-root DIR] [--log-level LEVEL] COMMAND [OPTIONS]

commands:
  install     [--cgroup DIR] [--no-bypass] [--fail-open] [--no-app-route]
              load the programs, pin maps and programs under the pin root (default
              /sys/fs/bpf/sockmesh; bpffs is mounted if needed), attach sockops to the cgroup v2
              DIR (default: the cgroup2 mount's root) and sk_msg to the bypass map. Idempotent.
              --no-app-route: enrolled apps' sockets keep the pod's routes, whose MTU (eth0's)
              then caps the segments they send to the proxy, and tc bounces each of them to it
              (with the app route, an established socket to the proxy is routed over lo).
  uninstall   [--force]
              detach and unpin everything; refuses while pods are enrolled unless --force.
  status      what is loaded, attached and enrolled, and the counters.
  enroll      --netns PATH --ifname IF --ip IP [--ip IP ...] --uid UID --namespace NS
              --service-account SA [--trust-domain TD] [--no-capture-inbound]
              [--no-capture-dns]
              attach tc capture in the pod's netns, set its routing, record its identity
              (--no-capture-dns: its queries to port 53 are not given to the proxy's 15053).
  unenroll    --netns PATH --ifname IF [--ip IP ...]
              undo enroll: records, tc, routing and accept_local as they were.
  run         [--run-dir DIR] [--labels-from kubernetes|config|auto] [--config FILE]
              [--kubeconfig FILE] [--node NAME] [--exclude-namespaces NS,...]
              [--trust-domain TD] [--zds-socket PATH] [--no-install] [--cgroup DIR]
              [--no-bypass] [--fail-open] [--no-app-route] [--capture-node-traffic]
              [--probe-cgroup PATH]
              [--uninstall-when-removed NAMESPACE/DAEMONSET]
              the node agent: installs the datapath (unless --no-install), then enrolls pods as
              the sockmesh-cni plugin reports them (socket <run dir, default /var/run/sockmesh>/
              cni.sock) and as namespace labels change (istio.io/dataplane-mode=ambient), from the
              Kubernetes API (in-cluster, or --kubeconfig) or the local config file (--config; the
              embedded default without it). Serves ZDS on --zds-socket (Istio's path is
              /var/run/ztunnel/ztunnel.sock): the proxy connects there and is handed the pods.
              Runs until SIGTERM/SIGINT; a restarted agent adopts what it enrolled.
              The kubelet's probes reach pods uncaptured: connections from the cgroup v2
              --probe-cgroup (relative to its mount; default system.slice/kubelet.service) to
              enrolled pods are SNATed (iptables) to 169.254.7.127 / fd16:9254:7127:1337:ffff:
              ffff:ffff:ffff, which capture exempts; any other process on the node is captured.
              --capture-node-traffic exempts nothing: probes are captured like any other.
              --uninstall-when-removed: at SIGTERM the agent asks the API (in-cluster, or
              --kubeconfig) for that DaemonSet; gone or being deleted means an uninstall, and the
              agent unenrolls every pod and removes the datapath. Present, or no answer: the
              datapath stays for the next agent (an upgrade or a restart).
)";

struct Args {
  std::string command;
  std::map<std::string, std::vector<std::string>> values;
  std::vector<std::string> flags;

  bool flag(const std::string& name) const {
    for (const auto& f : flags) {
      if (f == name) return true;
    }
    return false;
  }
  std::string value(const std::string& name, const std::string& fallback = "") const {
    auto it = values.find(name);
    return it == values.end() || it->second.empty() ? fallback : it->second.back();
  }
  std::vector<std::string> all(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? std::vector<std::string>{} : it->second;
  }
};

const std::vector<std::string> kFlagOptions = {"--no-bypass",
                                               "--fail-open",
                                               "--no-app-route",
                                               "--force",
                                               "--no-capture-inbound",
                                               "--no-install",
                                               "--help",
                                               "--capture-node-traffic",
                                               "--no-capture-dns"};

bool parse_args(int argc, char** argv, Args* out, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      if (!out->command.empty()) {
        *error = "unexpected argument " + arg;
        return false;
      }
      out->command = arg;
      continue;
    }
    std::string name = arg;
    std::string value;
    bool has_value = false;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    bool is_flag = false;
    for (const auto& f : kFlagOptions) is_flag |= (f == name);
    if (is_flag) {
      out->flags.push_back(name);
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        *error = name + " needs a value";
        return false;
      }
      value = argv[++i];
    }
    // --ip a,b is the same as --ip a --ip b.
    std::stringstream parts(value);
    std::string part;
    while (std::getline(parts, part, ',')) out->values[name].push_back(part);
  }
  return true;
}

int fail(const maps::Error& e) {
  std::cerr << "sockmesh-loader: " << e.message << "\n";
  return 1;
}

int usage_error(const std::string& message) {
  std::cerr << "sockmesh-loader: " << message << "\n\n" << kUsage;
  return 2;
}

bool parse_ips(const Args& args, std::vector<IpAddress>* ips, std::string* error) {
  for (const auto& text : args.all("--ip")) {
    auto ip = IpAddress::parse(text);
    if (!ip) {
      *error = "not an IP address: " + text;
      return false;
    }
    ips->push_back(*ip);
  }
  return true;
}

int run_install(const std::string& root, const Args& args) {
  InstallOptions options;
  options.pin_root = root;
  options.cgroup = args.value("--cgroup");
  options.bypass = !args.flag("--no-bypass");
  options.fail_open = args.flag("--fail-open");
  options.app_route = !args.flag("--no-app-route");
  auto report = install(options);
  if (!report) return fail(report.error());
  if (report->changes.empty()) {
    std::cout << "sockmesh is installed at " << root << " already; nothing changed\n";
  }
  for (const auto& c : report->changes) std::cout << c << "\n";
  return 0;
}

int run_uninstall(const std::string& root, const Args& args) {
  if (auto s = uninstall(root, args.flag("--force")); !s) return fail(s.error());
  std::cout << "sockmesh removed from " << root << "\n";
  return 0;
}

int run_enroll(const std::string& root, const Args& args) {
  PodSpec pod;
  pod.netns_path = args.value("--netns");
  pod.ifname = args.value("--ifname", "eth0");
  std::string error;
  if (!parse_ips(args, &pod.ips, &error)) return usage_error(error);
  pod.identity.uid = args.value("--uid");
  pod.identity.namespace_name = args.value("--namespace");
  pod.identity.service_account = args.value("--service-account");
  pod.identity.trust_domain = args.value("--trust-domain", "cluster.local");
  pod.identity.capture_inbound = !args.flag("--no-capture-inbound");
  pod.identity.capture_dns = !args.flag("--no-capture-dns");
  for (const char* required : {"--netns", "--uid", "--namespace", "--service-account", "--ip"}) {
    if (args.value(required).empty()) return usage_error(std::string("enroll needs ") + required);
  }
  auto report = enroll(root, pod);
  if (!report) return fail(report.error());
  std::cout << "enrolled " << pod.netns_path << " (" << pod.ifname << " #" << report->ifindex
            << ", netns cookie " << report->netns_cookie << ")";
  std::cout << (report->changes.empty() ? ": already enrolled, nothing changed\n" : "\n");
  for (const auto& c : report->changes) std::cout << "  " << c << "\n";
  return 0;
}

int run_unenroll(const std::string& root, const Args& args) {
  std::string netns = args.value("--netns");
  if (netns.empty()) return usage_error("unenroll needs --netns");
  std::vector<IpAddress> ips;
  std::string error;
  if (!parse_ips(args, &ips, &error)) return usage_error(error);
  auto report = unenroll(root, netns, args.value("--ifname", "eth0"), ips);
  if (!report) return fail(report.error());
  std::cout << "unenrolled " << netns;
  if (report->netns_gone) std::cout << " (netns gone: removed map entries only)";
  std::cout << (report->changes.empty() ? ": was not enrolled, nothing changed\n" : "\n");
  for (const auto& c : report->changes) std::cout << "  " << c << "\n";
  return 0;
}

int run_agent(const std::string& root, const Args& args) {
  // First, while this is the only thread: every thread and child started later inherits it.
  if (auto moved = loader::join_host_cgroup_namespace(); !moved) {
    SM_WARN("agent") << moved.error().message
                     << " (kubelet probes are captured unless --probe-cgroup resolves)";
  } else if (*moved) {
    SM_INFO("agent") << "entered the host's cgroup namespace (/proc/1/ns/cgroup), where "
                        "--probe-cgroup is resolved";
  }
  agent::RunOptions options;
  options.install.pin_root = root;
  options.install.cgroup = args.value("--cgroup");
  options.install.bypass = !args.flag("--no-bypass");
  options.install.fail_open = args.flag("--fail-open");
  options.install.app_route = !args.flag("--no-app-route");
  options.skip_install = args.flag("--no-install");
  options.exempt_probes = !args.flag("--capture-node-traffic");
  options.probe_cgroup = args.value("--probe-cgroup", options.probe_cgroup);
  options.run_dir = args.value("--run-dir", options.run_dir);
  options.labels_from = args.value("--labels-from", options.labels_from);
  options.config_path = args.value("--config");
  options.kubeconfig = args.value("--kubeconfig");
  options.uninstall_when_removed = args.value("--uninstall-when-removed");
  if (!options.uninstall_when_removed.empty()) {
    std::string ns, name, error;
    if (!agent::kube::parse_owner(options.uninstall_when_removed, &ns, &name, &error)) {
      return usage_error("--uninstall-when-removed: " + error);
    }
  }
  options.node_name = args.value("--node");
  options.trust_domain = args.value("--trust-domain", options.trust_domain);
  if (args.values.count("--exclude-namespaces") != 0) {
    options.excluded_namespaces = args.all("--exclude-namespaces");
  }
  std::unique_ptr<agent::WorkloadHandoff> handoff;
  if (auto zds = args.value("--zds-socket"); !zds.empty()) {
    agent::ZdsServerOptions zds_options;
    zds_options.socket_path = zds;
    auto server = agent::ZdsServer::listen(zds_options);
    if (!server)
      return fail(maps::Error{server.error().code, "--zds-socket: " + server.error().message});
    handoff = std::move(server).value();
  }
  return agent::run_agent(options, std::move(handoff));
}

std::string describe_flags(const maps::WorkloadRecord& r) {
  std::string out = r.enrolled ? "enrolled" : "not-enrolled";
  if (r.capture_inbound) out += ",capture-inbound";
  if (r.capture_dns) out += ",capture-dns";
  if (r.loader_flags & SM_WL_SET_ACCEPT_LOCAL) out += ",set-accept-local";
  if (r.loader_flags & SM_WL_MADE_CLSACT) out += ",made-clsact";
  return out;
}

int run_status(const std::string& root) {
  auto node = node_status(root);
  if (!node) return fail(node.error());
  if (!node->installed) {
    std::cout << "sockmesh is not installed at " << root << "\n";
    return 0;
  }
  std::cout << "sockmesh at " << root << ": installed\n";
  std::cout << "  maps:";
  for (const auto& m : node->map_names) std::cout << " " << m;
  std::cout << "\n";
  for (const auto& p : node->programs) {
    std::cout << "  program " << p.name << ": id " << p.id << ", tag " << p.tag << "\n";
  }
  if (node->sockops_cgroup_id) {
    std::cout << "  sockops: attached to cgroup id " << *node->sockops_cgroup_id << " (link id "
              << node->sockops_link_id << ")\n";
  } else {
    std::cout << "  sockops: NOT attached: no sockmap bypass, app <-> proxy bytes take the TCP/IP "
                 "stack (install says why)\n";
  }
  std::cout << "  sk_msg: "
            << (node->sk_msg_attached ? "attached to " SM_MAP_BYPASS : "NOT attached (run install)")
            << "\n";

  if (auto workloads = maps::WorkloadMapReader::open(root)) {
    auto list = workloads->list();
    if (!list) return fail(list.error());
    std::cout << "workloads (" << list->size() << "):\n";
    for (const auto& [ip, r] : *list) {
      std::cout << "  " << ip.to_string() << "  " << r.spiffe_id() << "  uid=" << r.uid << "  "
                << describe_flags(r) << "  ifindex=" << r.ifindex
                << "  netns-cookie=" << r.netns_cookie << "\n";
    }
  }
  if (auto listeners = maps::ListenerMap::open(root)) {
    auto list = listeners->list();
    if (!list) return fail(list.error());
    std::cout << "proxy listeners (" << list->size() << "):\n";
    for (const auto& slot : *list) {
      std::cout << "  " << slot.pod_ip.to_string() << "  " << maps::to_string(slot.kind) << " ("
                << maps::port_of(slot.kind) << ")  socket cookie " << slot.socket_cookie << "\n";
    }
  }
  if (auto counters = maps::CounterReader::open(root)) {
    auto values = counters->read();
    if (!values) return fail(values.error());
    std::cout << "counters:\n";
    for (int i = 0; i < SM_CNT_COUNT; ++i) {
      auto c = static_cast<sm_counter>(i);
      char line[160];
      snprintf(line, sizeof(line), "  %-22s %12llu  ", std::string(maps::counter_name(c)).c_str(),
               static_cast<unsigned long long>((*values)[i]));
      std::cout << line << maps::counter_help(c) << "\n";
    }
  }
  return 0;
}

int run(int argc, char** argv) {
  Args args;
  std::string error;
  if (!parse_args(argc, argv, &args, &error)) return usage_error(error);
  if (args.flag("--help") || args.command.empty() || args.command == "help") {
    std::cout << kUsage;
    return args.command.empty() && !args.flag("--help") ? 2 : 0;
  }
  // The CLI prints what it changed; logs are for problems unless asked for. The agent is a
  // daemon: its log is what it did.
  log::Level level = args.command == "run" ? log::Level::kInfo : log::Level::kWarn;
  if (auto text = args.value("--log-level"); !text.empty() && !log::parse_level(text, &level)) {
    return usage_error("unknown log level " + text);
  }
  log::set_level(level);
  std::string root = args.value("--pin-root", SM_PIN_ROOT_DEFAULT);
  while (root.size() > 1 && root.back() == '/') root.pop_back();

  if (args.command == "install") return run_install(root, args);
  if (args.command == "uninstall") return run_uninstall(root, args);
  if (args.command == "status") return run_status(root);
  if (args.command == "enroll") return run_enroll(root, args);
  if (args.command == "unenroll") return run_unenroll(root, args);
  if (args.command == "run") return run_agent(root, args);
  return usage_error("unknown command " + args.command);
}

}  // namespace
}  // namespace sockmesh::loader

int main(int argc, char** argv) {
  if (sockmesh::print_version_if_asked(argc, argv, "sockmesh-loader")) return 0;
  try {
    return sockmesh::loader::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "sockmesh-loader: " << e.what() << "\n";
    return 1;
  }
}
