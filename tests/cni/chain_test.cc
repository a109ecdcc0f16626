// The enrollment path end to end on the real kernel: the Debian reference plugins (bridge +
// host-local) chained with sockmesh-cni, run by the test acting as the container runtime inside a
// "node" network namespace of its own, against the node agent (NodeAgent with the real loader and
// a fake proxy handoff, labels from a local config file), and then the agent binary itself.
// Everything is made under unique names and removed by destructors, also when a test fails.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "base/log.h"
#include "loader/agent/cni_server.h"
#include "loader/agent/enroller.h"
#include "loader/agent/local_config_labels.h"
#include "loader/agent/node_agent.h"
#include "loader/maps/listener_map.h"
#include "loader/maps/workload_map.h"
#include "sockmesh/consts.h"
#include "testing/cni_runtime.h"
#include "testing/fakes.h"
#include "testing/privileged.h"
#include "testing/system.h"

namespace sockmesh {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using cni::testing::ChainRun;
using cni::testing::CniRuntime;
using cni::testing::PodRef;
using Json = nlohmann::ordered_json;

class Privileged : public testing::PrivilegedEnvironment {
 public:
  void SetUp() override {
    PrivilegedEnvironment::SetUp();
    struct stat st {};
    if (stat("/usr/lib/cni/bridge", &st) != 0 || stat("/usr/lib/cni/host-local", &st) != 0) {
      testing::skip_privileged(
          "the CNI reference plugins are missing: apt-get install containernetworking-plugins");
    }
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Privileged);

std::string build_dir() {
  const char* dir = std::getenv("SOCKMESH_BUILD_DIR");
  return dir ? dir : ".";
}

template <typename F>
bool eventually(F condition, std::chrono::milliseconds timeout = 10000ms) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return condition();
}

// A temporary directory removed on destruction.
struct TempDir {
  fs::path path = fs::temp_directory_path() / testing::unique_name("sockmesh-chain");
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

// A pod: a netns of its own (lo up, as the runtime's loopback plugin leaves it).
struct Pod {
  Pod(const std::string& ns, const std::string& name)
      : netns(testing::unique_name("sm-t") + "-" + name) {
    ref.container_id = "ctr-" + netns.name();
    ref.netns = netns.path();
    ref.pod_namespace = ns;
    ref.pod_name = name;
    ref.pod_uid = "uid-" + netns.name();
  }
  testing::ScopedNetns netns;
  PodRef ref;
};

std::string ip_of(const ChainRun& run) {
  Json result = run.result();
  std::string cidr = result["ips"][0]["address"];
  return cidr.substr(0, cidr.find('/'));
}

// The shop pods the cases start: the agent enrolls a pod only with the identity its label source
// gives it (never a guessed "default"), so each is listed, with its service account.
std::string shop_pods() {
  std::string out;
  for (const char* name : {"a", "b", "broken", "c", "cart-0", "slow", "web"}) {
    out += std::string("- uid: Kubernetes//v1/Pod/shop/") + name + "\n  name: " + name +
           "\n  namespace: shop\n  serviceAccount: default\n  workloadIps: []\n";
  }
  return out;
}

std::string config_yaml(bool shop_ambient, const std::string& extra_workloads = "") {
  std::string out = "namespaces:\n- name: shop\n";
  if (shop_ambient) out += "  labels:\n    istio.io/dataplane-mode: ambient\n";
  out += "- name: plain\n- name: kube-system\n  labels:\n    istio.io/dataplane-mode: ambient\n";
  out += "workloads:\n" + shop_pods() + extra_workloads;
  return out;
}

// A pod of the config whose own label opts it out.
const char kOptedOut[] = R"(- uid: Kubernetes//v1/Pod/shop/legacy
  name: legacy
  namespace: shop
  workloadIps: ["192.0.2.10"]
  labels:
    istio.io/dataplane-mode: none
)";

void write_config(const fs::path& path, const std::string& text) {
  fs::path tmp = path.string() + ".tmp";
  std::ofstream(tmp) << text;
  fs::rename(tmp, path);
}

// The agent as `sockmesh-loader run` assembles it, in process, with a fake proxy.
class ChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(install_.first_report().changes.size() > 0) << "datapath not installed";
    write_config(config_path(), config_yaml(true, kOptedOut));
  }

  void TearDown() override { stop_agent(); }

  fs::path config_path() const { return dir_.path / "mesh.yaml"; }
  std::string socket_path() const { return (dir_.path / "cni.sock").string(); }

  void start_agent() {
    labels_ = std::make_unique<agent::LocalConfigLabels>(config_path().string(), 50ms);
    ASSERT_TRUE(labels_->load());
    enroller_ =
        std::make_unique<agent::LoaderEnroller>(agent::LoaderEnrollerOptions{install_.root()});
    auto handoff = std::make_unique<agent::testing::FakeHandoff>(&calls_);
    handoff_ = handoff.get();
    agent::AgentOptions options;
    options.state_file = (dir_.path / "pods.json").string();
    options.hints_file = (dir_.path / "hints.json").string();
    agent_ = std::make_unique<agent::NodeAgent>(options, enroller_.get(), std::move(handoff));
    agent_->set_label_source(labels_.get());
    ASSERT_TRUE(agent_->start());
    server_ = std::make_unique<agent::CniEventServer>(
        socket_path(),
        [this](const cni::PodEvent& e) {
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_.load()));
          return agent_->handle(e);
        },
        [this](const cni::PodEvent& e) { agent_->reply_lost(e); });
    ASSERT_TRUE(server_->start());
    labels_->start([this](agent::LabelViewPtr v) { agent_->update_labels(std::move(v)); });
  }

  void stop_agent() {
    if (server_) server_->stop();
    if (labels_) labels_->stop();
    server_.reset();
    agent_.reset();
    labels_.reset();
  }

  Json conflist(int agent_timeout_ms = 5000) const {
    return Json{{"cniVersion", "1.0.0"},
                {"name", "sockmesh-test"},
                {"plugins",
                 {{{"type", "bridge"},
                   {"bridge", "smbr0"},
                   {"isGateway", true},
                   {"ipam",
                    {{"type", "host-local"},
                     {"dataDir", (dir_.path / "ipam").string()},
                     {"ranges", {{{{"subnet", "10.77.0.0/24"}}}}},
                     {"routes", {{{"dst", "0.0.0.0/0"}}}}}}},
                  {{"type", "sockmesh-cni"},
                   {"agent_socket", socket_path()},
                   {"namespace_hints", (dir_.path / "hints.json").string()},
                   {"exclude_namespaces", {"kube-system"}},
                   {"agent_timeout_ms", agent_timeout_ms}}}}};
  }

  CniRuntime runtime(int agent_timeout_ms = 5000) const {
    return CniRuntime(conflist(agent_timeout_ms), node_.path(),
                      {"/usr/lib/cni", build_dir() + "/cni"});
  }

  std::optional<maps::WorkloadRecord> record_of(const std::string& address) const {
    auto map = maps::WorkloadMapReader::open(install_.root());
    EXPECT_TRUE(map) << map.error().message;
    return map ? map->lookup(*IpAddress::parse(address)) : std::nullopt;
  }
  size_t map_size() const {
    auto map = maps::WorkloadMapReader::open(install_.root());
    return map ? map->list()->size() : 0;
  }
  bool handed_over(const std::string& uid) const { return handoff_->pods().count(uid) != 0; }

  // Whether sockmesh's tc programs are on the pod's eth0 (false once the device is gone).
  static bool tc_attached(const Pod& pod) {
    auto out = testing::run_command(
        {"tc", "-n", pod.netns.name(), "filter", "show", "dev", "eth0", "ingress"});
    return out.exit_code == 0 && out.output.find("bpf") != std::string::npos;
  }

  // Declaration order is teardown order reversed: pods (in the tests) go first, then the agent
  // (TearDown), the node with its bridge, the install, the cgroup.
  testing::TestCgroup cgroup_;
  testing::TestInstall install_{cgroup_.path()};
  testing::ScopedNetns node_{testing::unique_name("sm-t") + "-node"};
  TempDir dir_;
  agent::testing::CallLog calls_;
  std::unique_ptr<agent::LocalConfigLabels> labels_;
  std::unique_ptr<agent::LoaderEnroller> enroller_;
  agent::testing::FakeHandoff* handoff_ = nullptr;
  std::unique_ptr<agent::NodeAgent> agent_;
  std::unique_ptr<agent::CniEventServer> server_;
  std::atomic<int> delay_ms_{0};
};

TEST_F(ChainTest, AddEnrollsCheckPassesDelRemovesAndASecondDelSucceeds) {
  start_agent();
  Pod pod("shop", "cart-0");
  CniRuntime cni = runtime();
  ChainRun add = cni.add(pod.ref);
  ASSERT_TRUE(add.ok()) << add.describe();
  ASSERT_EQ(add.plugins.size(), 2u);

  // The chain's result is bridge's, unchanged.
  Json from_bridge = Json::parse(add.plugins[0].out);
  EXPECT_EQ(add.result(), from_bridge);
  EXPECT_EQ(add.result().dump(), from_bridge.dump()) << "same keys in the same order";
  const std::string address = ip_of(add);
  EXPECT_EQ(address.rfind("10.77.0.", 0), 0u) << address;
  EXPECT_NE(pod.netns.ip({"-4", "addr", "show", "dev", "eth0"}).find(address), std::string::npos);

  // Enrolled: the workload map, tc in the pod, the proxy has it.
  auto record = record_of(address);
  ASSERT_TRUE(record) << "no workload record for " << address;
  EXPECT_EQ(record->uid, pod.ref.pod_uid);
  EXPECT_EQ(record->namespace_name, "shop");
  EXPECT_EQ(record->spiffe_id(), "spiffe://cluster.local/ns/shop/sa/default");
  EXPECT_TRUE(tc_attached(pod));
  ASSERT_TRUE(handed_over(pod.ref.pod_uid));
  EXPECT_EQ(handoff_->pods().at(pod.ref.pod_uid).netns_path, pod.ref.netns);
  EXPECT_EQ(handoff_->pods().at(pod.ref.pod_uid).ips,
            std::vector<IpAddress>{*IpAddress::parse(address)});

  ChainRun check = cni.check(pod.ref);
  EXPECT_TRUE(check.ok()) << check.describe();

  // DEL runs the chain backwards, sockmesh-cni first: look at the pod between the two steps.
  Json own = conflist()["plugins"][1];
  own["cniVersion"] = "1.0.0";
  own["name"] = "sockmesh-test";
  own["prevResult"] = add.result();
  auto del_ours = cni.exec("sockmesh-cni", "DEL", pod.ref, own.dump());
  EXPECT_EQ(del_ours.exit_code, 0) << del_ours.out << del_ours.err;
  EXPECT_FALSE(record_of(address));
  EXPECT_FALSE(handed_over(pod.ref.pod_uid));
  EXPECT_FALSE(tc_attached(pod)) << "tc detached while eth0 is still there";
  EXPECT_NE(pod.netns.ip({"-4", "addr", "show", "dev", "eth0"}).find(address), std::string::npos)
      << "the network itself is bridge's to remove";
  EXPECT_TRUE(agent_->pods().empty());

  // The whole chain's DEL (a second DEL for sockmesh-cni), then the whole chain again.
  ChainRun del = cni.del(pod.ref);
  ASSERT_TRUE(del.ok()) << del.describe();
  EXPECT_EQ(del.plugins[0].type, "sockmesh-cni");
  EXPECT_EQ(del.plugins[1].type, "bridge");
  ChainRun again = cni.del(pod.ref);
  EXPECT_TRUE(again.ok()) << again.describe();
  EXPECT_EQ(map_size(), 0u);
}

TEST_F(ChainTest, EnrollmentDecisions) {
  start_agent();
  CniRuntime cni = runtime();
  Pod labelled("shop", "web"), unlabelled("plain", "batch"), opted_out("shop", "legacy"),
      excluded("kube-system", "coredns");
  struct Case {
    Pod* pod;
    bool enrolled;
  };
  for (auto [pod, enrolled] : {Case{&labelled, true}, Case{&unlabelled, false},
                               Case{&opted_out, false}, Case{&excluded, false}}) {
    ChainRun add = cni.add(pod->ref);
    ASSERT_TRUE(add.ok()) << pod->ref.pod_name << "\n" << add.describe();
    EXPECT_EQ(add.result(), Json::parse(add.plugins[0].out));
    EXPECT_EQ(record_of(ip_of(add)).has_value(), enrolled) << pod->ref.pod_name;
    EXPECT_EQ(handed_over(pod->ref.pod_uid), enrolled) << pod->ref.pod_name;
    EXPECT_EQ(tc_attached(*pod), enrolled) << pod->ref.pod_name;
  }
  // A host-network pod (its "netns" is the node's own): sockmesh-cni alone, as the chain's
  // result would reach it, in a namespace labelled for the mesh.
  PodRef host;
  host.container_id = "ctr-host";
  host.netns = "/proc/" + std::to_string(getpid()) + "/ns/net";  // the node's own netns
  host.pod_namespace = "shop";
  host.pod_name = "node-exporter";
  host.pod_uid = "uid-host";
  Json conf = conflist()["plugins"][1];
  conf["cniVersion"] = "1.0.0";
  conf["name"] = "sockmesh-test";
  conf["prevResult"] = Json::parse(R"({"cniVersion": "1.0.0",
      "interfaces": [{"name": "eth0", "sandbox": "/proc/self/ns/net"}],
      "ips": [{"interface": 0, "address": "10.77.0.250/24"}]})");
  auto run = cni.exec("sockmesh-cni", "ADD", host, conf.dump());
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.err.find("host-network"), std::string::npos) << run.err;
  EXPECT_FALSE(record_of("10.77.0.250"));
  EXPECT_EQ(map_size(), 1u) << "only the pod of the labelled namespace";
  for (Pod* pod : {&labelled, &unlabelled, &opted_out, &excluded}) {
    EXPECT_TRUE(cni.del(pod->ref).ok());
  }
  EXPECT_EQ(map_size(), 0u);
}

TEST_F(ChainTest, LabellingANamespaceEnrollsItsRunningPodsAndUnlabellingUnenrollsThem) {
  write_config(config_path(), config_yaml(false));
  start_agent();
  CniRuntime cni = runtime();
  Pod a("shop", "a"), b("shop", "b");
  std::string ip_a, ip_b;
  for (auto [pod, ip] : {std::pair{&a, &ip_a}, std::pair{&b, &ip_b}}) {
    ChainRun add = cni.add(pod->ref);
    ASSERT_TRUE(add.ok()) << add.describe();
    *ip = ip_of(add);
  }
  EXPECT_EQ(map_size(), 0u);
  const std::string before = testing::must_run({"ip", "-n", a.netns.name(), "rule", "show"});

  write_config(config_path(), config_yaml(true));
  EXPECT_TRUE(eventually([&] { return record_of(ip_a) && record_of(ip_b); }))
      << "labelling shop must enroll its running pods";
  EXPECT_TRUE(handed_over(a.ref.pod_uid));
  EXPECT_TRUE(handed_over(b.ref.pod_uid));
  EXPECT_TRUE(tc_attached(a));

  write_config(config_path(), config_yaml(false));
  EXPECT_TRUE(eventually([&] { return map_size() == 0; }))
      << "removing the label must unenroll them";
  EXPECT_FALSE(handed_over(a.ref.pod_uid));
  EXPECT_FALSE(tc_attached(a));
  EXPECT_FALSE(tc_attached(b));
  EXPECT_EQ(testing::must_run({"ip", "-n", a.netns.name(), "rule", "show"}), before)
      << "routing back as it was";
  for (Pod* pod : {&a, &b}) EXPECT_TRUE(cni.del(pod->ref).ok());
}

TEST_F(ChainTest, AFailedEnrollmentFailsAddAndLeavesNothingHalfDone) {
  start_agent();
  CniRuntime cni = runtime();
  Pod pod("shop", "broken");
  // Its loopback is down: the capture route cannot be added, after the IPv4 half went in.
  pod.netns.ip({"link", "set", "lo", "down"});
  const std::string rules_before = pod.netns.ip({"rule", "show"});
  ChainRun add = cni.add(pod.ref);
  ASSERT_FALSE(add.ok());
  ASSERT_EQ(add.plugins.size(), 2u) << add.describe();
  Json error = Json::parse(add.last().out);
  EXPECT_EQ(error["code"], 100) << add.describe();
  EXPECT_NE(error.value("details", "").find("loopback"), std::string::npos) << add.describe();
  const std::string address = ip_of(ChainRun{{add.plugins[0]}});
  EXPECT_FALSE(record_of(address));
  EXPECT_FALSE(handed_over(pod.ref.pod_uid));
  EXPECT_FALSE(tc_attached(pod));
  EXPECT_EQ(pod.netns.ip({"rule", "show"}), rules_before);
  EXPECT_EQ(testing::must_run({"ip", "netns", "exec", pod.netns.name(), "cat",
                               "/proc/sys/net/ipv4/conf/eth0/accept_local"}),
            "0\n");
  // The runtime cleans up a failed ADD with DEL.
  EXPECT_TRUE(cni.del(pod.ref).ok());
}

TEST_F(ChainTest, AnAgentThatDoesNotAnswerInTimeFailsAddAndItsLateWorkIsUndone) {
  start_agent();
  delay_ms_ = 1500;
  CniRuntime cni = runtime(/*agent_timeout_ms=*/400);
  Pod pod("shop", "slow");
  auto start = std::chrono::steady_clock::now();
  ChainRun add = cni.add(pod.ref);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1400ms);
  ASSERT_FALSE(add.ok());
  EXPECT_EQ(Json::parse(add.last().out)["code"], 11) << add.describe();
  const std::string address = ip_of(ChainRun{{add.plugins[0]}});
  // The agent finishes the enrollment after the plugin left; the lost reply undoes it.
  std::this_thread::sleep_for(1500ms);
  EXPECT_TRUE(eventually([&] { return !record_of(address) && !handed_over(pod.ref.pod_uid); }));
  EXPECT_TRUE(eventually([&] { return agent_->pods().empty(); }));
  EXPECT_FALSE(tc_attached(pod));
  delay_ms_ = 0;
  EXPECT_TRUE(cni.del(pod.ref).ok());
}

// `sockmesh-loader run` itself: a child process, killed on the way out whatever happens.
class AgentProcess {
 public:
  AgentProcess(const std::string& pin_root, const fs::path& run_dir, const fs::path& config,
               const std::vector<std::string>& extra = {}) {
    std::string log_path = (run_dir / "agent.log").string();
    std::vector<std::string> argv = {build_dir() + "/loader/sockmesh-loader",
                                     "--pin-root",
                                     pin_root,
                                     "run",
                                     "--no-install",
                                     "--run-dir",
                                     run_dir.string(),
                                     "--labels-from",
                                     "config",
                                     "--config",
                                     config.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
      int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    socket_ = (run_dir / "cni.sock").string();
    log_ = log_path;
  }
  ~AgentProcess() { stop(); }
  bool ready() const {
    return eventually([&] {
      struct stat st {};
      return stat(socket_.c_str(), &st) == 0;
    });
  }
  int stop() {
    if (pid_ <= 0) return exit_code_;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return exit_code_;
  }
  std::string log() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  std::string socket_;
  std::string log_;
};

TEST_F(ChainTest, TheAgentBinaryAdoptsItsPodsAfterARestartAndCleansUpThoseDeletedMeanwhile) {
  fs::path run_dir = dir_.path / "run";
  fs::create_directories(run_dir);
  Json list = conflist();
  list["plugins"][1]["agent_socket"] = (run_dir / "cni.sock").string();
  list["plugins"][1]["namespace_hints"] = (run_dir / "cni-namespaces.json").string();
  CniRuntime cni(list, node_.path(), {"/usr/lib/cni", build_dir() + "/cni"});
  auto a = std::make_unique<Pod>("shop", "a");
  auto b = std::make_unique<Pod>("shop", "b");
  std::string ip_a, ip_b;
  {
    AgentProcess agent(install_.root(), run_dir, config_path());
    ASSERT_TRUE(agent.ready()) << agent.log();
    ChainRun add_a = cni.add(a->ref);
    ChainRun add_b = cni.add(b->ref);
    ASSERT_TRUE(add_a.ok() && add_b.ok()) << add_a.describe() << add_b.describe() << agent.log();
    ip_a = ip_of(add_a);
    ip_b = ip_of(add_b);
    EXPECT_TRUE(record_of(ip_a) && record_of(ip_b));
    EXPECT_EQ(agent.stop(), 0) << agent.log();
  }
  EXPECT_TRUE(record_of(ip_a)) << "stopping the agent leaves pods enrolled";
  // While the agent is down, pod b is deleted without a CNI DEL reaching the agent.
  cni.exec("bridge", "DEL", b->ref, [&] {
    Json conf = list["plugins"][0];
    conf["cniVersion"] = "1.0.0";
    conf["name"] = "sockmesh-test";
    return conf.dump();
  }());
  b.reset();
  // A pod that belongs to the mesh cannot start while the agent is down: the runtime retries.
  Pod c("shop", "c");
  ChainRun refused = cni.add(c.ref);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(Json::parse(refused.last().out)["code"], 11);
  EXPECT_TRUE(cni.del(c.ref).ok());

  AgentProcess agent(install_.root(), run_dir, config_path());
  ASSERT_TRUE(agent.ready()) << agent.log();
  EXPECT_TRUE(eventually([&] { return !record_of(ip_b); })) << agent.log();
  EXPECT_TRUE(record_of(ip_a)) << "the live pod is adopted, not unenrolled";
  // The record goes before the agent logs why (unenrolling also rewrites the probe rules).
  EXPECT_TRUE(eventually([&] {
    return agent.log().find("deleted while the agent was away") != std::string::npos;
  })) << agent.log();
  std::string log = agent.log();
  EXPECT_NE(log.find("adopted enrolled pod shop/a"), std::string::npos) << log;
  ChainRun del = cni.del(a->ref);
  EXPECT_TRUE(del.ok()) << del.describe();
  EXPECT_FALSE(record_of(ip_a));
  EXPECT_EQ(agent.stop(), 0);
}

// The real proxy in the node's netns (setns, then exec), taking pods over ZDS.
class ProxyProcess {
 public:
  ProxyProcess(const testing::ScopedNetns& node, const std::vector<std::string>& args,
               const std::string& log)
      : log_(log) {
    std::string binary = build_dir() + "/userspace/sockmesh-proxy";
    std::string netns = node.path();
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      int ns = open(netns.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ns < 0 || setns(ns, CLONE_NEWNET) != 0) _exit(126);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<std::string> argv = {binary};
      argv.insert(argv.end(), args.begin(), args.end());
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
  }
  ~ProxyProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::string log() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
};

bool proxy_speaks_zds() {
  auto help = testing::run_command({build_dir() + "/userspace/sockmesh-proxy", "--help"});
  return help.output.find("--zds-socket") != std::string::npos;
}

TEST_F(ChainTest, WithTheRealProxyTheEnrolledPodGetsItsListenersAndLosesThemOnDel) {
  if (!proxy_speaks_zds()) GTEST_SKIP() << "sockmesh-proxy with --zds-socket is not built";
  fs::path run_dir = dir_.path / "run";
  fs::create_directories(run_dir);
  const std::string zds = (dir_.path / "zds.sock").string();
  ProxyProcess proxy(node_,
                     {"--node", "node-a", "--config", config_path().string(), "--state-dir",
                      (dir_.path / "state").string(), "--zds-socket", zds, "--bpf-pin-root",
                      install_.root(), "--workers", "1", "--log-level", "info"},
                     (dir_.path / "proxy.log").string());
  // As with Istio, the agent serves ZDS and the proxy connects (retrying until the agent is up).
  AgentProcess agent(install_.root(), run_dir, config_path(), {"--zds-socket", zds});
  ASSERT_TRUE(agent.ready()) << agent.log();
  ASSERT_TRUE(eventually([&] {
    return proxy.log().find("connected to the node agent's socket " + zds) != std::string::npos;
  })) << proxy.log();
  Json list = conflist();
  list["plugins"][1]["agent_socket"] = (run_dir / "cni.sock").string();
  list["plugins"][1]["namespace_hints"] = (run_dir / "cni-namespaces.json").string();
  CniRuntime cni(list, node_.path(), {"/usr/lib/cni", build_dir() + "/cni"});

  Pod pod("shop", "cart-0");
  ChainRun add = cni.add(pod.ref);
  ASSERT_TRUE(add.ok()) << add.describe() << agent.log() << proxy.log();
  const IpAddress address = *IpAddress::parse(ip_of(add));
  auto listeners = maps::ListenerMap::open(install_.root());
  ASSERT_TRUE(listeners) << listeners.error().message;
  // The agent answered only once the proxy had acknowledged: the slots are there already.
  for (auto kind : {maps::ListenerKind::kOutbound, maps::ListenerKind::kInboundPlain,
                    maps::ListenerKind::kHbone}) {
    EXPECT_TRUE(listeners->socket_cookie(address, kind))
        << "no " << maps::to_string(kind) << " listener for " << address.to_string() << "\n"
        << proxy.log();
  }
  EXPECT_TRUE(record_of(address.to_string()));
  std::string status = testing::must_run(
      {build_dir() + "/loader/sockmesh-loader", "--pin-root", install_.root(), "status"});
  EXPECT_NE(status.find(address.to_string() + "  outbound"), std::string::npos) << status;
  std::cout << status.substr(status.find("workloads (")).substr(0, 600) << "\n";

  ChainRun del = cni.del(pod.ref);
  ASSERT_TRUE(del.ok()) << del.describe();
  EXPECT_FALSE(record_of(address.to_string()));
  EXPECT_TRUE(eventually([&] {
    return !listeners->socket_cookie(address, maps::ListenerKind::kOutbound) &&
           !listeners->socket_cookie(address, maps::ListenerKind::kInboundPlain);
  })) << proxy.log();
  EXPECT_EQ(agent.stop(), 0) << agent.log();
}

}  // namespace
}  // namespace sockmesh
