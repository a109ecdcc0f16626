// In-pod mode end to end, on one simulated node: two pods (network namespaces with a veth each
// to a "node" namespace), sockmesh installed and the pods enrolled with the real sockmesh-loader
// CLI, the real sockmesh-proxy running in the node namespace with --zds-socket, connecting to a
// ZdsServer (the node agent's side) that hands the pods over. Every connection below is made by an "app" in a pod or by a client in the
// node namespace, and is captured by tc into the proxy's listeners inside the pods.
//
//   pod A 10.201.1.2 (ns-a/sa-a) --veth-- node 10.201.1.1 | 10.201.2.1 --veth-- pod B 10.201.2.2
//         fd00:201:1::2                        fd00:201:1::1 | fd00:201:2::1         fd00:201:2::2
//                                server outside: 10.201.9.9, fd00:201:9::9 (on the node's lo)
//
// Everything (namespaces, cgroup, pin root, proxy process, temporary files) is made with unique
// names and removed by destructors, also when an assertion fails.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "base/log.h"
#include "loader/agent/zds_server.h"
#include "loader/maps/counters.h"
#include "loader/maps/listener_map.h"
#include "sockmesh/consts.h"
#include "testing/privileged.h"
#include "testing/sockets.h"
#include "testing/system.h"

namespace sockmesh {
namespace {

using namespace std::chrono_literals;
using maps::ListenerKind;
using testing::EchoServer;
using testing::must_run;
using testing::run_command;
using testing::ScopedNetns;
using testing::unique_name;

constexpr int kTimeoutMs = 10000;
constexpr uint16_t kAppPort = 8080;
constexpr uint16_t kServerPort = 9000;

const IpAddress kPodA = *IpAddress::parse("10.201.1.2");
const IpAddress kPodB = *IpAddress::parse("10.201.2.2");
const IpAddress kNodeToA = *IpAddress::parse("10.201.1.1");
const IpAddress kNodeToB = *IpAddress::parse("10.201.2.1");
const IpAddress kServer = *IpAddress::parse("10.201.9.9");
const IpAddress kPodA6 = *IpAddress::parse("fd00:201:1::2");
const IpAddress kPodB6 = *IpAddress::parse("fd00:201:2::2");
const IpAddress kNodeToA6 = *IpAddress::parse("fd00:201:1::1");
const IpAddress kNodeToB6 = *IpAddress::parse("fd00:201:2::1");
const IpAddress kServer6 = *IpAddress::parse("fd00:201:9::9");
constexpr char kIdentityA[] = "spiffe://cluster.local/ns/ns-a/sa/sa-a";
constexpr char kIdentityB[] = "spiffe://cluster.local/ns/ns-b/sa/sa-b";

std::string build_dir() {
  if (const char* d = std::getenv("SOCKMESH_BUILD_DIR")) return d;
  // Run by hand: <build>/tests/e2e/<this test>.
  return std::filesystem::canonical("/proc/self/exe").parent_path().parent_path().parent_path();
}
std::string proxy_binary() { return build_dir() + "/userspace/sockmesh-proxy"; }
std::string loader_binary() { return build_dir() + "/loader/sockmesh-loader"; }

class Privileged : public testing::PrivilegedEnvironment {
 public:
  void SetUp() override {
    PrivilegedEnvironment::SetUp();
    for (const auto& bin : {proxy_binary(), loader_binary()}) {
      if (access(bin.c_str(), X_OK) != 0) {
        testing::skip_privileged(bin + " is not built (build sockmesh-proxy and sockmesh-loader)");
      }
    }
    if (access("/proc/thread-self/ns/net", R_OK) != 0) testing::skip_privileged("no netns support");
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Privileged);

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A directory of the test's own under /tmp, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/sm-zds-e2e-" + std::to_string(getpid()) + "-XXXXXX";
    path_ = mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
    EXPECT_FALSE(path_.empty()) << strerror(errno);
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One node: its namespace with forwarding on, and pods joined to it by veth pairs.
class Node {
 public:
  Node() : ns_(unique_name("sm-t") + "-node") {
    must_run({"ip", "netns", "exec", ns_.name(), "sysctl", "-qw", "net.ipv4.ip_forward=1",
              "net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.default.accept_dad=0"});
    ns_.ip({"addr", "add", kServer.to_string() + "/32", "dev", "lo"});
    ns_.ip({"addr", "add", kServer6.to_string() + "/128", "dev", "lo"});
  }
  const ScopedNetns& ns() const { return ns_; }

  // A pod namespace with eth0 <ip>/24 and <ip6>/64, the node's side being the gateways on
  // `host_if`.
  std::unique_ptr<ScopedNetns> add_pod(const std::string& tag, const IpAddress& ip,
                                       const IpAddress& gateway, const IpAddress& ip6,
                                       const IpAddress& gateway6, const std::string& host_if) {
    auto pod = std::make_unique<ScopedNetns>(unique_name("sm-t") + "-" + tag);
    // No duplicate address detection: link-local addresses usable at once, no 1 s stalls.
    must_run({"ip", "netns", "exec", pod->name(), "sysctl", "-qw",
              "net.ipv6.conf.default.accept_dad=0"});
    must_run({"ip", "link", "add", "eth0", "netns", pod->name(), "type", "veth", "peer", "name",
              host_if, "netns", ns_.name()});
    pod->ip({"addr", "add", ip.to_string() + "/24", "dev", "eth0"});
    pod->ip({"addr", "add", ip6.to_string() + "/64", "dev", "eth0", "nodad"});
    pod->ip({"link", "set", "eth0", "up"});
    pod->ip({"route", "add", "default", "via", gateway.to_string()});
    pod->ip({"-6", "route", "add", "default", "via", gateway6.to_string()});
    ns_.ip({"addr", "add", gateway.to_string() + "/24", "dev", host_if});
    ns_.ip({"addr", "add", gateway6.to_string() + "/64", "dev", host_if, "nodad"});
    ns_.ip({"link", "set", host_if, "up"});
    return pod;
  }

 private:
  ScopedNetns ns_;
};

// sockmesh installed with the CLI under a pin root of the test's own, sockops on `cgroup`.
class CliInstall {
 public:
  explicit CliInstall(const std::string& cgroup)
      : root_("/sys/fs/bpf/" + unique_name("sockmesh-test")) {
    must_run({loader_binary(), "--pin-root", root_, "install", "--cgroup", cgroup});
  }
  ~CliInstall() { run_command({loader_binary(), "--pin-root", root_, "uninstall", "--force"}); }
  const std::string& root() const { return root_; }

  void enroll(const ScopedNetns& pod, const std::vector<IpAddress>& ips, const std::string& uid,
              const std::string& ns, const std::string& sa) const {
    std::vector<std::string> argv = {loader_binary(),
                                     "--pin-root",
                                     root_,
                                     "enroll",
                                     "--netns",
                                     pod.path(),
                                     "--ifname",
                                     "eth0",
                                     "--uid",
                                     uid,
                                     "--namespace",
                                     ns,
                                     "--service-account",
                                     sa};
    for (const auto& ip : ips) {
      argv.push_back("--ip");
      argv.push_back(ip.to_string());
    }
    must_run(argv);
  }

 private:
  std::string root_;
};

// The real sockmesh-proxy, started inside the node's namespace (setns, then exec: no new mount
// namespace, so bpffs and cgroupfs stay visible), logging to a file.
class ProxyProcess {
 public:
  ProxyProcess(const ScopedNetns& node, std::vector<std::string> args, std::string log)
      : log_(std::move(log)) {
    maps::UniqueFd netns(open(node.path().c_str(), O_RDONLY | O_CLOEXEC));
    EXPECT_TRUE(netns.valid());
    std::vector<std::string> argv = {proxy_binary()};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
      int out = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (out < 0 || setns(netns.get(), CLONE_NEWNET) != 0) _exit(126);
      dup2(out, 1);
      dup2(out, 2);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    EXPECT_GT(pid_, 0) << strerror(errno);
  }
  ~ProxyProcess() { stop(); }

  // SIGTERM (drain), then SIGKILL if it lingers. Returns the exit status.
  int stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(100ms);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  bool running() const { return pid_ > 0 && kill(pid_, 0) == 0; }
  std::string log() const { return read_file(log_); }

 private:
  std::string log_;
  pid_t pid_ = -1;
};

// GET over plain HTTP/1.0 from inside a namespace; the body.
std::string http_get(const std::string& netns, const Endpoint& at, const std::string& path) {
  auto fd = testing::connect_in(netns, at);
  if (!fd) return "";
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: x\r\n\r\n";
  testing::send_all(fd.get(), reinterpret_cast<const uint8_t*>(req.data()), req.size());
  std::string out;
  char buf[16384];
  ssize_t n;
  while ((n = recv(fd.get(), buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? out : out.substr(body + 4);
}

// Lines of `text` containing every one of `needles`.
std::vector<std::string> lines_with(const std::string& text,
                                    const std::vector<std::string>& needles) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    bool all = true;
    for (const auto& n : needles) all = all && line.find(n) != std::string::npos;
    if (all) out.push_back(line);
  }
  return out;
}

template <typename F>
bool eventually(F f, std::chrono::milliseconds within = std::chrono::milliseconds(kTimeoutMs)) {
  auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return f();
}

// The SPIFFE ID in the certificate that the TLS server at `at` presents (no client certificate
// is offered; TLS 1.3 servers send theirs first).
std::string presented_identity(const ScopedNetns& from, const Endpoint& at) {
  auto r = run_command(
      {"sh", "-c",
       "ip netns exec " + from.name() + " openssl s_client -connect " + at.to_string() +
           " -alpn h2 </dev/null 2>/dev/null | openssl x509 -noout -ext subjectAltName"});
  auto pos = r.output.find("URI:");
  if (pos == std::string::npos) return "(none: " + r.output + ")";
  auto end = r.output.find_first_of(",\n", pos);
  return r.output.substr(pos + 4, end == std::string::npos ? std::string::npos : end - pos - 4);
}

class ZdsEndToEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    cgroup_.enter();  // the apps' sockets and the proxy (forked below) join the sockops cgroup
    install_.emplace(cgroup_.path());
    pod_a_ = node_.add_pod("pa", kPodA, kNodeToA, kPodA6, kNodeToA6, "va");
    pod_b_ = node_.add_pod("pb", kPodB, kNodeToB, kPodB6, kNodeToB6, "vb");
    install_->enroll(*pod_a_, {kPodA, kPodA6}, "uid-a", "ns-a", "sa-a");
    install_->enroll(*pod_b_, {kPodB, kPodB6}, "uid-b", "ns-b", "sa-b");

    // Both pods speak HBONE, but the config places them on another node: only the workload map
    // makes them local to this proxy (and gives the identity whose certificate it presents).
    std::ofstream(tmp_.path() + "/mesh.yaml") << R"(workloads:
- uid: cluster1//v1/Pod/ns-a/a
  name: a
  namespace: ns-a
  serviceAccount: sa-a
  workloadIps: [10.201.1.2, "fd00:201:1::2"]
  protocol: HBONE
  node: some-other-node
- uid: cluster1//v1/Pod/ns-b/b
  name: b
  namespace: ns-b
  serviceAccount: sa-b
  workloadIps: [10.201.2.2, "fd00:201:2::2"]
  protocol: HBONE
  node: some-other-node
)";
    zds_socket_ = tmp_.path() + "/zds.sock";
    agent::ZdsServerOptions o;
    o.socket_path = zds_socket_;
    auto server = agent::ZdsServer::listen(o);
    ASSERT_TRUE(server) << server.error().message;
    agent_ = std::move(server).value();
    start_proxy();
    ASSERT_TRUE(eventually([&] {
      return !lines_with(proxy_->log(), {"connected to the node agent's socket", zds_socket_}).empty();
    })) << "the proxy did not connect to " << zds_socket_ << "\n"
        << proxy_->log();
    const Endpoint readiness{*IpAddress::parse("127.0.0.1"), 15021};
    // Until the node agent's first snapshot the proxy does not know its pods: not ready.
    ASSERT_TRUE(eventually([&] {
      return http_get(node_.ns().path(), readiness, "/healthz/ready").find("first snapshot") !=
             std::string::npos;
    })) << http_get(node_.ns().path(), readiness, "/healthz/ready");
    auto s = agent_->sync({pod_workload(*pod_a_, {kPodA, kPodA6}, "uid-a", "a", "ns-a", "sa-a"),
                           pod_workload(*pod_b_, {kPodB, kPodB6}, "uid-b", "b", "ns-b", "sa-b")});
    ASSERT_TRUE(s) << s.error().message << "\n" << proxy_->log();
    ASSERT_EQ(agent_->sessions(), 1u);
    EXPECT_TRUE(eventually([&] {
      return http_get(node_.ns().path(), readiness, "/healthz/ready") == "ready\n";
    })) << http_get(node_.ns().path(), readiness, "/healthz/ready");
  }

  void TearDown() override {
    // On failure, or on request (SOCKMESH_E2E_SHOW_LOG=1), the current proxy's log.
    if (proxy_ && (HasFailure() || std::getenv("SOCKMESH_E2E_SHOW_LOG") != nullptr)) {
      std::fprintf(stderr, "---- proxy log (run %d) ----\n%s\n", proxy_runs_,
                   proxy_->log().c_str());
    }
  }

  static agent::PodWorkload pod_workload(const ScopedNetns& ns, std::vector<IpAddress> ips,
                                         const std::string& uid, const std::string& name,
                                         const std::string& namespace_name, const std::string& sa) {
    return agent::PodWorkload{uid, name, namespace_name, sa, std::move(ips), ns.path()};
  }

  // A proxy on this node; `ports_from` picks its admin, metrics and readiness ports (15000, 15020,
  // 15021 for the first), so that a second one can run beside it.
  ProxyProcess* start_proxy(std::optional<ProxyProcess>* into = nullptr, int ports_from = 15000) {
    ++proxy_runs_;
    if (into == nullptr) into = &proxy_;
    auto port = [&](int offset) { return "127.0.0.1:" + std::to_string(ports_from + offset); };
    into->emplace(node_.ns(),
                  std::vector<std::string>{"--node",
                                           "zds-node",
                                           "--config",
                                           tmp_.path() + "/mesh.yaml",
                                           "--state-dir",
                                           tmp_.path() + "/state",
                                           "--zds-socket",
                                           zds_socket_,
                                           "--bpf-pin-root",
                                           install_->root(),
                                           "--admin",
                                           port(0),
                                           "--metrics",
                                           port(20),
                                           "--readiness",
                                           port(21),
                                           "--workers",
                                           "2",
                                           "--drain-timeout-ms",
                                           "500",
                                           "--log-level",
                                           "info",
                                           // Both pods are this proxy's: most tests here prove
                                           // the in-pod HBONE path, which the same-node fast
                                           // path would skip (test_cluster_same_node.py).
                                           "--same-node-fast-path",
                                           fast_path_ ? "true" : "false"},
                  tmp_.path() + "/proxy-" + std::to_string(proxy_runs_) + ".log");
    return &**into;
  }

  uint64_t counter(sm_counter c) const {
    auto reader = maps::CounterReader::open(install_->root());
    EXPECT_TRUE(reader);
    if (!reader) return 0;
    auto values = reader->read();
    return values ? (*values)[c] : 0;
  }

  std::optional<uint64_t> slot(const IpAddress& ip, ListenerKind kind) const {
    auto m = maps::ListenerMap::open(install_->root());
    EXPECT_TRUE(m);
    return m ? m->socket_cookie(ip, kind) : std::nullopt;
  }

  std::string metrics() const {
    return http_get(node_.ns().path(), Endpoint{*IpAddress::parse("127.0.0.1"), 15020}, "/metrics");
  }

  // An app in pod A talks to `to` and gets its bytes echoed, intact.
  void app_in_a_talks_to(const Endpoint& to, size_t bytes, uint32_t seed) {
    auto app = testing::connect_in(pod_a_->path(), to);
    ASSERT_TRUE(app.valid()) << "connect " << to.to_string() << ": " << strerror(errno);
    EXPECT_TRUE(testing::echo_round_trip(app.get(), testing::pattern(bytes, seed), kTimeoutMs))
        << "bytes to " << to.to_string() << " came back damaged or not at all";
  }

  // Declaration order is teardown order reversed: client, proxy, pods, node, install, cgroup.
  TempDir tmp_;
  testing::TestCgroup cgroup_;
  std::optional<CliInstall> install_;
  Node node_;
  std::unique_ptr<ScopedNetns> pod_a_, pod_b_;
  std::string zds_socket_;
  int proxy_runs_ = 0;
  bool fast_path_ = false;  // --same-node-fast-path of the next start_proxy()
  std::optional<ProxyProcess> proxy_;
  std::unique_ptr<agent::ZdsServer> agent_;
};

TEST_F(ZdsEndToEnd, PodsHandedOverByZdsGetListenersInTheirOwnNetns) {
  for (const auto& ip : {kPodA, kPodB, kPodA6, kPodB6}) {
    for (auto kind : {ListenerKind::kOutbound, ListenerKind::kInboundPlain, ListenerKind::kHbone}) {
      EXPECT_TRUE(slot(ip, kind)) << ip.to_string() << " " << maps::to_string(kind)
                                  << " is not registered";
    }
  }
  // The listeners live in the pods' namespaces, not in the node's.
  for (const auto* pod : {pod_a_.get(), pod_b_.get()}) {
    auto ss = must_run({"ip", "netns", "exec", pod->name(), "ss", "-Hltn"});
    for (const char* port : {":15001", ":15006", ":15008"}) {
      EXPECT_NE(ss.find(port), std::string::npos)
          << pod->name() << " has no listener on " << port << ":\n"
          << ss;
    }
  }
  auto node_ss = must_run({"ip", "netns", "exec", node_.ns().name(), "ss", "-Hltn"});
  EXPECT_EQ(node_ss.find(":15008"), std::string::npos) << node_ss;
  EXPECT_NE(metrics().find("sockmesh_zds_pods 2"), std::string::npos) << metrics();
}

TEST_F(ZdsEndToEnd, OutboundToAServerOutsideIsCapturedAndPassedThrough) {
  EchoServer server(node_.ns().path(), Endpoint{kServer, kServerPort});
  uint64_t captured = counter(SM_CNT_CAPTURED_OUTBOUND);
  app_in_a_talks_to(Endpoint{kServer, kServerPort}, size_t{1} << 20, 1);
  EXPECT_EQ(counter(SM_CNT_CAPTURED_OUTBOUND), captured + 1) << "tc gave the SYN to 15001 in pod A";
  // The proxy exports the datapath's counters with its own metrics.
  std::string exported =
      "sockmesh_datapath_captured_outbound_total " + std::to_string(captured + 1) + "\n";
  EXPECT_NE(metrics().find(exported), std::string::npos) << metrics();
  auto served = server.connections();
  ASSERT_EQ(served.size(), 1u);
  EXPECT_EQ(served[0].first.ip, kPodA) << "the proxy dialled from pod A, keeping its address";
  ASSERT_TRUE(eventually([&] {
    return !lines_with(proxy_->log(), {"access", "src.addr=10.201.1.2", "dst.addr=10.201.9.9:9000",
                                       "direction=outbound", "bytes_sent=1048576"})
                .empty();
  })) << "no access-log line for the passthrough connection";
  auto line = lines_with(proxy_->log(), {"access", "dst.addr=10.201.9.9:9000"}).front();
  EXPECT_NE(line.find(std::string("src.identity=") + kIdentityA), std::string::npos) << line;
}

TEST_F(ZdsEndToEnd, PodToPodGoesThroughHboneWithEachPodsOwnCertificate) {
  EchoServer app_b(pod_b_->path(), Endpoint{kPodB, kAppPort});
  uint64_t bypassed = counter(SM_CNT_BYPASS_SENDS);
  app_in_a_talks_to(Endpoint{kPodB, kAppPort}, size_t{1} << 20, 2);
  // The app <-> proxy hops in both pods (A's app to 15001, B's proxy to B's app) skip the stack.
  EXPECT_GT(counter(SM_CNT_BYPASS_SENDS), bypassed) << "the sockmap bypass was not taken";

  auto served = app_b.connections();
  ASSERT_EQ(served.size(), 1u);
  EXPECT_EQ(served[0].first.ip, kPodA) << "B's app sees A's address through the tunnel";
  // Outbound in A: tunnelled to B's 15008; inbound in B: the client presented A's certificate.
  ASSERT_TRUE(eventually([&] {
    return !lines_with(proxy_->log(), {"access", "direction=inbound", "dst.addr=10.201.2.2:8080"})
                .empty() &&
           !lines_with(proxy_->log(), {"access", "direction=outbound", "dst.addr=10.201.2.2:8080"})
                .empty();
  })) << "expected an outbound and an inbound access-log line";
  auto out =
      lines_with(proxy_->log(), {"access", "direction=outbound", "dst.addr=10.201.2.2:8080"});
  EXPECT_NE(out[0].find("dst.hbone_addr=10.201.2.2:15008"), std::string::npos) << out[0];
  EXPECT_NE(out[0].find(std::string("src.identity=") + kIdentityA), std::string::npos) << out[0];
  EXPECT_NE(out[0].find(std::string("dst.identity=") + kIdentityB), std::string::npos) << out[0];
  auto in = lines_with(proxy_->log(), {"access", "direction=inbound", "dst.addr=10.201.2.2:8080"});
  EXPECT_NE(in[0].find(std::string("src.identity=") + kIdentityA), std::string::npos)
      << "B's proxy saw A's certificate: " << in[0];
  EXPECT_NE(in[0].find(std::string("dst.identity=") + kIdentityB), std::string::npos) << in[0];
  EXPECT_NE(in[0].find("bytes_recv=1048576"), std::string::npos) << in[0];
  std::string m = metrics();
  EXPECT_FALSE(lines_with(m, {"istio_tcp_connections_opened_total", "reporter=\"destination\"",
                              std::string("source_principal=\"") + kIdentityA,
                              std::string("destination_principal=\"") + kIdentityB})
                   .empty())
      << m;

  // Each pod's 15008 presents the certificate of the workload whose IP was dialled.
  EXPECT_EQ(presented_identity(node_.ns(), Endpoint{kPodA, SM_PORT_HBONE}), kIdentityA);
  EXPECT_EQ(presented_identity(node_.ns(), Endpoint{kPodB, SM_PORT_HBONE}), kIdentityB);
}

TEST_F(ZdsEndToEnd, InboundFromOutsideIsCapturedTo15006AndRelayedIntact) {
  EchoServer app_b(pod_b_->path(), Endpoint{kPodB, kAppPort});
  uint64_t captured = counter(SM_CNT_CAPTURED_INBOUND);
  auto client = testing::connect_in(node_.ns().path(), Endpoint{kPodB, kAppPort});
  ASSERT_TRUE(client.valid()) << strerror(errno);
  EXPECT_TRUE(
      testing::echo_round_trip(client.get(), testing::pattern(size_t{4} << 20, 3), kTimeoutMs));
  client.reset();
  EXPECT_EQ(counter(SM_CNT_CAPTURED_INBOUND), captured + 1) << "tc gave the SYN to 15006 in pod B";
  auto served = app_b.connections();
  ASSERT_EQ(served.size(), 1u);
  EXPECT_EQ(served[0].first.ip, kNodeToB) << "the app sees the client's address";
  EXPECT_TRUE(eventually([&] {
    return !lines_with(proxy_->log(), {"access", "direction=inbound", "src.addr=10.201.2.1",
                                       "dst.addr=10.201.2.2:8080", "bytes_sent=4194304"})
                .empty();
  })) << "no access-log line for the captured inbound connection";
}

// (The first IPv6 connection out of a fresh pod takes about a second: the kernel does the same
// between two plain namespaces and a router, without sockmesh.)
TEST_F(ZdsEndToEnd, Ipv6OutboundAndPodToPodUseThePodsIpv6Listeners) {
  EchoServer server(node_.ns().path(), Endpoint{kServer6, kServerPort});
  EchoServer app_b(pod_b_->path(), Endpoint{kPodB6, kAppPort});
  uint64_t captured = counter(SM_CNT_CAPTURED_OUTBOUND);
  app_in_a_talks_to(Endpoint{kServer6, kServerPort}, 256 * 1024, 9);
  app_in_a_talks_to(Endpoint{kPodB6, kAppPort}, 256 * 1024, 10);
  EXPECT_EQ(counter(SM_CNT_CAPTURED_OUTBOUND), captured + 2);
  ASSERT_EQ(server.connections().size(), 1u);
  EXPECT_EQ(server.connections()[0].first.ip, kPodA6);
  ASSERT_EQ(app_b.connections().size(), 1u);
  EXPECT_EQ(app_b.connections()[0].first.ip, kPodA6);
  EXPECT_TRUE(eventually([&] {
    return !lines_with(
                proxy_->log(),
                {"access", "direction=inbound", "dst.addr=[fd00:201:2::2]:8080",
                 "dst.hbone_addr=[fd00:201:2::2]:15008", std::string("src.identity=") + kIdentityA})
                .empty();
  })) << "no inbound HBONE access-log line for the IPv6 connection";
  EXPECT_EQ(presented_identity(node_.ns(), Endpoint{kPodB6, SM_PORT_HBONE}), kIdentityB);
}

TEST_F(ZdsEndToEnd, IdentityComesFromTheWorkloadMapWhenTheConfigDoesNotListThePod) {
  // Pod B leaves the config file; it stays enrolled (workload map) and handed over (ZDS).
  std::ofstream(tmp_.path() + "/mesh.yaml") << R"(workloads:
- uid: cluster1//v1/Pod/ns-a/a
  name: a
  namespace: ns-a
  serviceAccount: sa-a
  workloadIps: [10.201.1.2]
  protocol: HBONE
  node: some-other-node
)";
  ASSERT_TRUE(eventually([&] {
    return !lines_with(proxy_->log(), {"config", "workloads=1"}).empty();
  })) << "the proxy did not reload its config";
  // Its 15008 still presents B's certificate: the identity in the map record of 10.201.2.2.
  EXPECT_EQ(presented_identity(node_.ns(), Endpoint{kPodB, SM_PORT_HBONE}), kIdentityB);
  // And a captured connection to it is served as B's (the workload is named by its map uid).
  EchoServer app_b(pod_b_->path(), Endpoint{kPodB, kAppPort});
  auto client = testing::connect_in(node_.ns().path(), Endpoint{kPodB, kAppPort});
  ASSERT_TRUE(client.valid()) << strerror(errno);
  EXPECT_TRUE(testing::echo_round_trip(client.get(), testing::pattern(64 * 1024, 8), kTimeoutMs));
  client.reset();
  EXPECT_TRUE(eventually([&] {
    return !lines_with(proxy_->log(), {"access", "direction=inbound", "dst.workload=uid-b",
                                       std::string("dst.identity=") + kIdentityB})
                .empty();
  })) << "the inbound connection was not attributed to the map's workload";
}

TEST_F(ZdsEndToEnd, DelClosesThePodsListenersAndAddBringsThemBack) {
  auto hbone_b = Endpoint{kPodB, SM_PORT_HBONE};
  ASSERT_TRUE(slot(kPodB, ListenerKind::kOutbound));
  ASSERT_TRUE(agent_->remove("uid-b"));
  EXPECT_FALSE(slot(kPodB, ListenerKind::kOutbound));
  EXPECT_FALSE(slot(kPodB, ListenerKind::kInboundPlain));
  EXPECT_FALSE(slot(kPodB, ListenerKind::kHbone));
  EXPECT_FALSE(slot(kPodB6, ListenerKind::kOutbound));
  EXPECT_TRUE(slot(kPodA, ListenerKind::kOutbound)) << "pod A is untouched";
  auto refused = testing::connect_in(node_.ns().path(), hbone_b, {}, 2000);
  EXPECT_FALSE(refused.valid()) << "15008 in pod B must be closed";
  EXPECT_EQ(errno, ECONNREFUSED);
  auto ss = must_run({"ip", "netns", "exec", pod_b_->name(), "ss", "-Hltn"});
  EXPECT_EQ(ss.find(":15001"), std::string::npos) << ss;
  EXPECT_NE(metrics().find("sockmesh_zds_pods 1"), std::string::npos);

  ASSERT_TRUE(agent_->add(pod_workload(*pod_b_, {kPodB, kPodB6}, "uid-b", "b", "ns-b", "sa-b")));
  EXPECT_TRUE(slot(kPodB, ListenerKind::kOutbound));
  EchoServer app_b(pod_b_->path(), Endpoint{kPodB, kAppPort});
  app_in_a_talks_to(Endpoint{kPodB, kAppPort}, 64 * 1024, 4);
}

// Istio's node agent sends no IPs (they are sockmesh's field 1000): the proxy reads the pod's
// addresses inside its netns, registers its listeners under both families, and serves the pod.
TEST_F(ZdsEndToEnd, AnAddWithoutIpsIsServedUnderThePodsOwnAddresses) {
  ASSERT_TRUE(agent_->remove("uid-b"));
  ASSERT_FALSE(slot(kPodB, ListenerKind::kOutbound));
  ASSERT_TRUE(agent_->add(pod_workload(*pod_b_, {}, "uid-b", "b", "ns-b", "sa-b")));
  for (const auto& ip : {kPodB, kPodB6}) {
    EXPECT_TRUE(slot(ip, ListenerKind::kOutbound)) << ip.to_string();
    EXPECT_TRUE(slot(ip, ListenerKind::kInboundPlain)) << ip.to_string();
    EXPECT_TRUE(slot(ip, ListenerKind::kHbone)) << ip.to_string();
  }
  EXPECT_FALSE(lines_with(proxy_->log(), {"pod uid-b", "addresses read from the pod's interfaces"})
                   .empty())
      << proxy_->log();
  EchoServer app_b(pod_b_->path(), Endpoint{kPodB, kAppPort});
  EchoServer app_b6(pod_b_->path(), Endpoint{kPodB6, kAppPort});
  app_in_a_talks_to(Endpoint{kPodB, kAppPort}, 64 * 1024, 9);
  app_in_a_talks_to(Endpoint{kPodB6, kAppPort}, 64 * 1024, 10);
  EXPECT_EQ(app_b.accepted(), 1);
  EXPECT_EQ(app_b6.accepted(), 1);
}

TEST_F(ZdsEndToEnd, AfterAProxyRestartItReconnectsGetsTheSnapshotAndTrafficFlowsAgain) {
  EchoServer server(node_.ns().path(), Endpoint{kServer, kServerPort});
  EchoServer app_b(pod_b_->path(), Endpoint{kPodB, kAppPort});
  app_in_a_talks_to(Endpoint{kPodB, kAppPort}, 64 * 1024, 5);
  uint64_t sessions = agent_->sessions();

  ASSERT_EQ(proxy_->stop(), 0) << "the proxy drains and exits cleanly on SIGTERM";
  EXPECT_FALSE(slot(kPodA, ListenerKind::kOutbound)) << "its sockets left the map with it";
  start_proxy();
  ASSERT_TRUE(agent_->wait_connected(20s, sessions + 1))
      << "the new proxy did not connect and get the snapshot\n"
      << proxy_->log();
  EXPECT_TRUE(slot(kPodA, ListenerKind::kOutbound));
  EXPECT_TRUE(slot(kPodB, ListenerKind::kInboundPlain));

  app_in_a_talks_to(Endpoint{kPodB, kAppPort}, 256 * 1024, 6);
  app_in_a_talks_to(Endpoint{kServer, kServerPort}, 256 * 1024, 7);
  EXPECT_EQ(app_b.accepted(), 2);
  EXPECT_EQ(server.accepted(), 1);
  EXPECT_FALSE(lines_with(proxy_->log(), {"snapshot received: 2 pod(s)"}).empty()) << proxy_->log();
}

// The same-node fast path in in-pod mode, IPv4 and IPv6: pods known as local only from the
// workload map, so the fast path's identities come from there too; no HBONE stream is opened.
TEST_F(ZdsEndToEnd, WithTheFastPathPodToPodSkipsHboneOverIpv4AndIpv6) {
  uint64_t sessions = agent_->sessions();
  ASSERT_EQ(proxy_->stop(), 0);
  fast_path_ = true;
  start_proxy();
  ASSERT_TRUE(agent_->wait_connected(20s, sessions + 1)) << proxy_->log();
  EchoServer app_b(pod_b_->path(), Endpoint{kPodB, kAppPort});
  EchoServer app_b6(pod_b_->path(), Endpoint{kPodB6, kAppPort});
  app_in_a_talks_to(Endpoint{kPodB, kAppPort}, size_t{1} << 20, 14);
  app_in_a_talks_to(Endpoint{kPodB6, kAppPort}, 256 * 1024, 15);
  ASSERT_EQ(app_b.connections().size(), 1u);
  EXPECT_EQ(app_b.connections()[0].first.ip, kPodA) << "B's app sees A's address";
  ASSERT_EQ(app_b6.connections().size(), 1u);
  EXPECT_EQ(app_b6.connections()[0].first.ip, kPodA6);
  for (std::string dst : {"dst.addr=10.201.2.2:8080", "dst.addr=[fd00:201:2::2]:8080"}) {
    for (std::string dir : {"direction=outbound", "direction=inbound"}) {
      ASSERT_TRUE(eventually([&] {
        return !lines_with(proxy_->log(), {"access", dir, dst, "path=same-node"}).empty();
      })) << "no " << dir << " fast-path line for " << dst << "\n"
          << proxy_->log();
      auto line = lines_with(proxy_->log(), {"access", dir, dst}).front();
      EXPECT_NE(line.find(std::string("src.identity=") + kIdentityA), std::string::npos) << line;
      EXPECT_NE(line.find(std::string("dst.identity=") + kIdentityB), std::string::npos) << line;
      EXPECT_EQ(line.find("dst.hbone_addr"), std::string::npos) << line;
    }
  }
  std::string m = metrics();
  EXPECT_FALSE(lines_with(m, {"sockmesh_same_node_fast_path_total 2"}).empty()) << m;
}

// An upgrade: a new proxy connects while the old one still runs. The agent gives it the snapshot,
// it opens the same ports in the pods beside the old listeners (SO_REUSEPORT) and takes the map's
// slots; the old proxy then drains and exits without taking the new slots with it.
TEST_F(ZdsEndToEnd, AnUpgradedProxyTakesThePodsOverWhileTheOldOneStillRuns) {
  EchoServer app_b(pod_b_->path(), Endpoint{kPodB, kAppPort});
  app_in_a_talks_to(Endpoint{kPodB, kAppPort}, 64 * 1024, 11);
  auto old_slot = slot(kPodA, ListenerKind::kOutbound);
  ASSERT_TRUE(old_slot);
  uint64_t sessions = agent_->sessions();

  std::optional<ProxyProcess> upgraded;
  ProxyProcess* next = start_proxy(&upgraded, 16000);
  ASSERT_TRUE(agent_->wait_connected(20s, sessions + 1)) << next->log();
  ASSERT_TRUE(eventually([&] {
    return !lines_with(next->log(), {"snapshot received: 2 pod(s)"}).empty();
  })) << next->log();
  EXPECT_TRUE(lines_with(next->log(), {"nack"}).empty()) << "the old proxy's ports were in the way\n"
                                                         << next->log();
  auto new_slot = slot(kPodA, ListenerKind::kOutbound);
  ASSERT_TRUE(new_slot);
  EXPECT_NE(*new_slot, *old_slot) << "the map names the new proxy's listener";
  app_in_a_talks_to(Endpoint{kPodB, kAppPort}, 64 * 1024, 12);

  ASSERT_EQ(proxy_->stop(), 0) << "the old proxy drains and exits cleanly";
  EXPECT_EQ(slot(kPodA, ListenerKind::kOutbound), new_slot) << "its exit left the new slots alone";
  EXPECT_TRUE(slot(kPodB, ListenerKind::kHbone));
  app_in_a_talks_to(Endpoint{kPodB, kAppPort}, 256 * 1024, 13);
  EXPECT_EQ(app_b.accepted(), 3);
  EXPECT_TRUE(eventually([&] {
    return !lines_with(next->log(), {"access", "direction=inbound", "dst.addr=10.201.2.2:8080"})
                .empty();
  })) << "the new proxy carried the traffic\n"
      << next->log();
}

// An add that fails is nacked and tried again, as ztunnel retries its pending pods: here
// something else holds port 15008 in pod B (no SO_REUSEPORT) until the test lets it go.
TEST_F(ZdsEndToEnd, AFailedAddIsTriedAgainUntilThePodIsServed) {
  ASSERT_TRUE(agent_->remove("uid-b"));
  ASSERT_FALSE(slot(kPodB, ListenerKind::kHbone));
  std::optional<EchoServer> squatter;
  squatter.emplace(pod_b_->path(), Endpoint{kPodB, SM_PORT_HBONE});
  auto s = agent_->add(pod_workload(*pod_b_, {kPodB, kPodB6}, "uid-b", "b", "ns-b", "sa-b"));
  ASSERT_FALSE(s) << "15008 is taken in the pod: the proxy must refuse";
  EXPECT_NE(s.error().message.find("15008"), std::string::npos) << s.error().message;
  EXPECT_FALSE(slot(kPodB, ListenerKind::kOutbound));
  EXPECT_FALSE(lines_with(proxy_->log(), {"pod uid-b not served yet; trying again"}).empty())
      << proxy_->log();

  squatter.reset();  // the port is free again
  ASSERT_TRUE(eventually([&] { return slot(kPodB, ListenerKind::kHbone).has_value(); }, 12s))
      << "the proxy did not try the add again\n"
      << proxy_->log();
  EXPECT_TRUE(slot(kPodB6, ListenerKind::kOutbound));
  EXPECT_FALSE(lines_with(proxy_->log(), {"pod uid-b served after"}).empty()) << proxy_->log();
  EchoServer app_b(pod_b_->path(), Endpoint{kPodB, kAppPort});
  app_in_a_talks_to(Endpoint{kPodB, kAppPort}, 64 * 1024, 14);
  EXPECT_EQ(app_b.accepted(), 1);
}

}  // namespace
}  // namespace sockmesh
