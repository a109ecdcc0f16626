// sockmesh-cni as the runtime sees it: the binary, run with CNI_* variables and a config on
// stdin, against a stand-in agent on a Unix socket of the test's own. What it prints, its exit
// status, and whether it bothered the agent at all.
#include "cni/plugin/plugin.h"

#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "cni/event/pod_event.h"
#include "common/fifo.h"
#include "loader/agent/cni_server.h"
#include "testing/cni_runtime.h"

namespace sockmesh::cni {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::ordered_json;
using testing::PluginRun;

// The result bridge + host-local gave on this machine (Debian containernetworking-plugins 1.1.1).
constexpr char kBridgeResult[] = R"({
    "cniVersion": "1.0.0",
    "interfaces": [
        {"name": "smbr0", "mac": "02:d0:47:c9:c2:83"},
        {"name": "veth15859982", "mac": "fe:e9:69:a2:82:2c"},
        {"name": "eth0", "mac": "a6:d5:b1:79:27:60", "sandbox": "/run/netns/pod"}
    ],
    "ips": [
        {"interface": 2, "address": "10.123.0.3/24", "gateway": "10.123.0.1"},
        {"interface": 0, "address": "10.123.0.1/24"}
    ],
    "routes": [{"dst": "0.0.0.0/0"}],
    "dns": {}
})";

std::string binary() {
  const char* build = std::getenv("SOCKMESH_BUILD_DIR");
  return std::string(build ? build : ".") + "/cni/sockmesh-cni";
}

// Runs the binary as a runtime does: environment replaced, config on stdin.
PluginRun run_binary(const std::map<std::string, std::string>& env, const std::string& input) {
  return testing::run_plugin_process(binary(), env, input);
}

// A stand-in for the node agent: answers with `reply`, counts events.
class FakeAgent {
 public:
  FakeAgent(const std::string& path, AgentReply reply,
            std::chrono::milliseconds delay = std::chrono::milliseconds(0))
      : server_(
            path,
            [this, reply, delay](const PodEvent& e) {
              {
                std::lock_guard lock(mu_);
                events_.push_back(e);
              }
              std::this_thread::sleep_for(delay);
              return reply;
            },
            nullptr) {
    EXPECT_TRUE(server_.start());
  }
  std::vector<PodEvent> events() {
    std::lock_guard lock(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::vector<PodEvent> events_;
  agent::CniEventServer server_;
};

class PluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log::set_level(log::Level::kError);
    dir_ = std::filesystem::temp_directory_path() /
           ("sockmesh-plugin-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string socket() const { return (dir_ / "cni.sock").string(); }
  std::string hints() const { return (dir_ / "hints.json").string(); }

  std::map<std::string, std::string> env(const std::string& command,
                                         const std::string& ns = "shop") const {
    return {{"CNI_COMMAND", command},
            {"CNI_CONTAINERID", "0123abcd"},
            {"CNI_NETNS", "/run/netns/pod"},
            {"CNI_IFNAME", "eth0"},
            {"CNI_PATH", "/usr/lib/cni"},
            {"CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=" + ns +
                             ";K8S_POD_NAME=cart-0;K8S_POD_INFRA_CONTAINER_ID=0123abcd;"
                             "K8S_POD_UID=4a1b2c3d-0000-4e5f-8a9b-0123456789ab"}};
  }

  Json config(const std::string& version = "1.0.0", bool with_prev = true) const {
    Json c;
    c["cniVersion"] = version;
    c["name"] = "k8s-pod-network";
    c["type"] = "sockmesh-cni";
    c["agent_socket"] = socket();
    c["namespace_hints"] = hints();
    c["agent_timeout_ms"] = 1000;
    if (with_prev) c["prevResult"] = Json::parse(kBridgeResult);
    return c;
  }

  static void expect_error(const PluginRun& r, int code, const std::string& in_msg = "") {
    EXPECT_NE(r.exit_code, 0) << r.out;
    Json j = Json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "stdout must be CNI error JSON: " << r.out;
    EXPECT_EQ(j.value("code", 0), code) << r.out;
    EXPECT_TRUE(j.contains("msg"));
    EXPECT_TRUE(j.contains("cniVersion"));
    if (!in_msg.empty()) {
      EXPECT_NE(j.value("msg", "").find(in_msg), std::string::npos) << j.value("msg", "");
    }
  }

  std::filesystem::path dir_;
};

TEST_F(PluginTest, AddPrintsThePreviousResultUnchangedOnceTheAgentEnrolledThePod) {
  FakeAgent agent(socket(), AgentReply{Outcome::kEnrolled, "namespace shop is ambient"});
  PluginRun r = run_binary(env("ADD"), config().dump());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // Byte for byte as the previous plugin's result reads once parsed: values and key order.
  EXPECT_EQ(r.json().dump(), Json::parse(kBridgeResult).dump());
  auto events = agent.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].command, Command::kAdd);
  EXPECT_EQ(events[0].pod_namespace, "shop");
  EXPECT_EQ(events[0].pod_name, "cart-0");
  EXPECT_EQ(events[0].pod_uid, "4a1b2c3d-0000-4e5f-8a9b-0123456789ab");
  EXPECT_EQ(events[0].netns, "/run/netns/pod");
  EXPECT_EQ(events[0].container_id, "0123abcd");
  EXPECT_EQ(events[0].ips, std::vector<std::string>{"10.123.0.3"})
      << "only the pod's own address (its interface has a sandbox), not the bridge's";
}

TEST_F(PluginTest, SkippedPodsPassAndCheckAndDelSucceed) {
  FakeAgent agent(socket(), AgentReply{Outcome::kSkipped, "not labelled"});
  PluginRun add = run_binary(env("ADD"), config().dump());
  EXPECT_EQ(add.exit_code, 0) << add.out;
  PluginRun check = run_binary(env("CHECK"), config().dump());
  EXPECT_EQ(check.exit_code, 0) << check.out;
  EXPECT_EQ(check.out, "") << "CHECK prints nothing on success";
  auto events = agent.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].command, Command::kCheck);
}

TEST_F(PluginTest, DelSucceedsAlwaysTwiceAndWithoutTheAgent) {
  Json del = config();
  del.erase("prevResult");
  for (int i = 0; i < 2; ++i) {
    PluginRun r = run_binary(env("DEL"), del.dump());
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find("not confirmed"), std::string::npos) << r.err;
  }
  {
    FakeAgent agent(socket(), AgentReply{Outcome::kRemoved, ""});
    auto env_without_netns = env("DEL");
    env_without_netns.erase("CNI_NETNS");  // allowed on DEL
    for (int i = 0; i < 2; ++i) EXPECT_EQ(run_binary(env_without_netns, del.dump()).exit_code, 0);
    EXPECT_EQ(agent.events().size(), 2u);
    EXPECT_EQ(agent.events()[0].command, Command::kDel);
  }
  // An agent that failed to clean up does not fail DEL either.
  std::filesystem::remove(socket());
  FakeAgent failing(socket(), AgentReply{Outcome::kFailed, "map not pinned"});
  EXPECT_EQ(run_binary(env("DEL"), del.dump()).exit_code, 0);
}

TEST_F(PluginTest, AnUnreachableAgentFailsAddWithTryAgainLaterAndSaysWhatToDo) {
  PluginRun r = run_binary(env("ADD"), config().dump());
  expect_error(r, 11, "sockmesh-loader run");
  EXPECT_NE(Json::parse(r.out).value("msg", "").find("exclude_namespaces"), std::string::npos);
}

TEST_F(PluginTest, AnAgentThatDoesNotAnswerFailsAddWithinTheDeadline) {
  FakeAgent slow(socket(), AgentReply{Outcome::kEnrolled, ""}, 1500ms);
  Json c = config();
  c["agent_timeout_ms"] = 300;
  auto start = std::chrono::steady_clock::now();
  PluginRun r = run_binary(env("ADD"), c.dump());
  auto took = std::chrono::steady_clock::now() - start;
  expect_error(r, 11);
  EXPECT_LT(took, 2000ms);
  EXPECT_NE(Json::parse(r.out).value("details", "").find("within 300 ms"), std::string::npos)
      << r.out;
}

TEST_F(PluginTest, AnAgentThatFailedGivesCode100WithItsReason) {
  FakeAgent agent(socket(), AgentReply{Outcome::kFailed, "no interface eth0 in netns"});
  PluginRun r = run_binary(env("ADD"), config().dump());
  expect_error(r, 100, "could not enroll pod shop/cart-0");
  EXPECT_EQ(Json::parse(r.out).value("details", ""), "no interface eth0 in netns");
}

TEST_F(PluginTest, WithoutTheAgentPodsThatAreCertainlyNotEnrolledStillStart) {
  // Excluded in the netconf: the agent is not even asked.
  PluginRun excluded = run_binary(env("ADD", "kube-system"), config().dump());
  EXPECT_EQ(excluded.exit_code, 0) << excluded.out;
  EXPECT_EQ(excluded.json().dump(), Json::parse(kBridgeResult).dump());

  // Not a Kubernetes pod (no K8S_POD_* in CNI_ARGS).
  auto plain = env("ADD");
  plain["CNI_ARGS"] = "";
  EXPECT_EQ(run_binary(plain, config().dump()).exit_code, 0);

  // The agent's last hints: "plain" is known and not ambient, "shop" is ambient.
  NamespaceHints h;
  h.source = "kubernetes";
  h.ambient = {"shop"};
  h.other = {"plain"};
  h.excluded = {"kube-system"};
  std::ofstream(hints()) << encode(h);
  PluginRun known_plain = run_binary(env("ADD", "plain"), config().dump());
  EXPECT_EQ(known_plain.exit_code, 0) << known_plain.out;
  EXPECT_NE(known_plain.err.find("not in the mesh"), std::string::npos) << known_plain.err;
  expect_error(run_binary(env("ADD", "shop"), config().dump()), 11);
  expect_error(run_binary(env("ADD", "brand-new"), config().dump()), 11);

  // An agent that is starting answers "unavailable": the same rules.
  FakeAgent starting(socket(), AgentReply{Outcome::kUnavailable, "no labels yet"});
  EXPECT_EQ(run_binary(env("ADD", "plain"), config().dump()).exit_code, 0);
  expect_error(run_binary(env("ADD", "shop"), config().dump()), 11);
}

TEST_F(PluginTest, BadInputGivesTheSpecsCodesAndBothersNobody) {
  FakeAgent agent(socket(), AgentReply{Outcome::kEnrolled, ""});
  // No CNI_COMMAND, an unknown one.
  auto no_command = env("ADD");
  no_command.erase("CNI_COMMAND");
  expect_error(run_binary(no_command, config().dump()), 4, "CNI_COMMAND");
  expect_error(run_binary(env("FROB"), config().dump()), 4, "FROB");
  // Missing variables.
  for (const char* var : {"CNI_NETNS", "CNI_CONTAINERID", "CNI_IFNAME"}) {
    auto e = env("ADD");
    e.erase(var);
    expect_error(run_binary(e, config().dump()), 4, var);
  }
  auto e = env("DEL");
  e.erase("CNI_CONTAINERID");
  expect_error(run_binary(e, config().dump()), 4, "CNI_CONTAINERID");
  // stdin that is not JSON, or not an object, or with mistyped fields.
  expect_error(run_binary(env("ADD"), "{\"cniVersion\": \"1.0.0\", "), 6, "not valid JSON");
  expect_error(run_binary(env("ADD"), ""), 6);
  expect_error(run_binary(env("ADD"), "[1, 2]"), 6);
  // A number too large for a double is nlohmann's out_of_range, not a parse_error: it aborted
  // the plugin (found by the cni_plugin fuzz target, seed regress_number_overflow).
  expect_error(run_binary(env("ADD"), "{\"cniVersion\": \"1.0.0\", \"x\": 2E220222}"), 6,
               "not valid JSON");
  Json mistyped = config();
  mistyped["exclude_namespaces"] = "kube-system";
  expect_error(run_binary(env("ADD"), mistyped.dump()), 6, "exclude_namespaces");
  Json bad_prev = config();
  bad_prev["prevResult"]["ips"][0]["address"] = "10.123.0.300/24";
  expect_error(run_binary(env("ADD"), bad_prev.dump()), 6, "10.123.0.300");
  // Versions.
  expect_error(run_binary(env("ADD"), config("2.0.0").dump()), 1, "2.0.0");
  expect_error(run_binary(env("CHECK"), config("0.3.1").dump()), 1, "CHECK");
  // Configuration errors.
  expect_error(run_binary(env("ADD"), config("1.0.0", false).dump()), 7, "chained");
  Json timeout = config();
  timeout["agent_timeout_ms"] = -5;
  expect_error(run_binary(env("ADD"), timeout.dump()), 7, "agent_timeout_ms");
  EXPECT_TRUE(agent.events().empty()) << "bad input must not reach the agent";
}

// Found by the cni_plugin fuzz target: a message quoting bytes that are not UTF-8 (a JSON parse
// error quotes where it stopped, an unknown CNI_COMMAND is quoted) made the JSON writer throw, and
// the plugin died on SIGABRT with nothing on stdout; an event with such a CNI_CONTAINERID too.
TEST_F(PluginTest, BytesThatAreNotUtf8GetAnErrorOrPassNeverAnAbort) {
  expect_error(run_binary(env("ADD"), "{\"cniVersion\": \"1.0.0\", \"name\": \"\xff\xfe\"}"), 6,
               "not valid JSON");
  expect_error(run_binary(env("AD\xff"), config().dump()), 4, "CNI_COMMAND");
  FakeAgent agent(socket(), AgentReply{Outcome::kEnrolled, ""});
  auto e = env("ADD");
  e["CNI_CONTAINERID"] = "0123\xc3";
  PluginRun r = run_binary(e, config().dump());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_EQ(agent.events().size(), 1u);
  EXPECT_EQ(agent.events()[0].container_id, "0123\xef\xbf\xbd");  // U+FFFD
}

TEST_F(PluginTest, VersionListsTheSpecVersions) {
  PluginRun r = run_binary({{"CNI_COMMAND", "VERSION"}}, R"({"cniVersion": "1.0.0"})");
  ASSERT_EQ(r.exit_code, 0);
  Json j = r.json();
  EXPECT_EQ(j["cniVersion"], "1.0.0");
  EXPECT_EQ(j["supportedVersions"],
            Json::parse(R"(["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0"])"));
}

TEST_F(PluginTest, OlderResultFormatsAndOlderConfigVersions) {
  FakeAgent agent(socket(), AgentReply{Outcome::kEnrolled, ""});
  // 0.4.0 (interfaces with "version"), dual stack.
  Json c = config("0.4.0");
  c["prevResult"] = Json::parse(R"({"cniVersion": "0.4.0",
      "interfaces": [{"name": "eth0", "sandbox": "/run/netns/pod"}],
      "ips": [{"version": "4", "interface": 0, "address": "10.1.0.5/24"},
              {"version": "6", "interface": 0, "address": "fd00:1::5/64"}],
      "dns": {}})");
  PluginRun r = run_binary(env("ADD"), c.dump());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.json().dump(), c["prevResult"].dump());
  // 0.2.0: ip4/ip6.
  Json old = config("0.2.0");
  old["prevResult"] = Json::parse(R"({"cniVersion": "0.2.0",
      "ip4": {"ip": "10.1.0.6/24", "gateway": "10.1.0.1"}, "dns": {}})");
  ASSERT_EQ(run_binary(env("ADD"), old.dump()).exit_code, 0);
  auto events = agent.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].ips, (std::vector<std::string>{"10.1.0.5", "fd00:1::5"}));
  EXPECT_EQ(events[1].ips, std::vector<std::string>{"10.1.0.6"});
}

TEST(PluginBinary, IsStaticSmallAndQuickToStart) {
  std::string path = binary();
  // No program interpreter: nothing to find on the host but the kernel.
  std::ifstream elf(path, std::ios::binary);
  Elf64_Ehdr header{};
  elf.read(reinterpret_cast<char*>(&header), sizeof(header));
  ASSERT_TRUE(elf.good());
  bool has_interp = false;
  for (int i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr ph{};
    elf.seekg(static_cast<std::streamoff>(header.e_phoff + i * header.e_phentsize));
    elf.read(reinterpret_cast<char*>(&ph), sizeof(ph));
    has_interp |= ph.p_type == PT_INTERP;
  }
  EXPECT_FALSE(has_interp) << path << " is dynamically linked";
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_LT(st.st_size, 3 * 1024 * 1024) << "sockmesh-cni grew past 3 MiB";

  auto start = std::chrono::steady_clock::now();
  constexpr int kRuns = 50;
  for (int i = 0; i < kRuns; ++i) {
    ASSERT_EQ(run_binary({{"CNI_COMMAND", "VERSION"}}, "").exit_code, 0);
  }
  auto each = (std::chrono::steady_clock::now() - start) / kRuns;
  std::cout << "sockmesh-cni: " << st.st_size << " bytes, VERSION in "
            << std::chrono::duration_cast<std::chrono::microseconds>(each).count()
            << " us per run (fork+exec included)\n";
  EXPECT_LT(each, 20ms);
}

TEST(CniArgs, ParsesTheKubernetesKeys) {
  PodArgs pod = parse_cni_args(
      "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-0;"
      "K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1");
  EXPECT_EQ(pod.namespace_name, "shop");
  EXPECT_EQ(pod.name, "cart-0");
  EXPECT_EQ(pod.uid, "u-1");
  EXPECT_TRUE(pod.is_kubernetes_pod());
  EXPECT_FALSE(parse_cni_args("IgnoreUnknown=1").is_kubernetes_pod());
  EXPECT_TRUE(version_less("0.3.1", "0.4.0"));
  EXPECT_FALSE(version_less("1.0.0", "0.4.0"));
}

// The hints file is read when the agent cannot be asked: a FIFO in its place must not hang the
// runtime's ADD.
TEST(NamespaceHintsFile, AFifoIsRefusedAtOnce) {
  std::string dir = ::testing::TempDir() + "sockmesh-hints-fifo-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::string fifo = dir + "/cni-namespaces.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string error;
  auto r =
      ::sockmesh::testing::read_of_fifo(fifo, [&] { return read_namespace_hints(fifo, &error); });
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(r.has_value()) << "reading a FIFO as the hints file blocked for 3 s";
  EXPECT_FALSE(r->has_value());
  EXPECT_NE(error.find("not a regular file"), std::string::npos) << error;
}

// The protocol version must be exactly 1: a fraction, a string, or a number that only truncates
// to 1 is a clear error, not an exception and not a match.
TEST(PodEventVersion, NonIntegerOrOutOfRangeVersionsAreClearErrors) {
  PodEvent e;
  e.command = Command::kAdd;
  e.container_id = "c1";
  e.ifname = "eth0";
  e.pod_namespace = "ns";
  e.pod_name = "p";
  e.pod_uid = "u";
  Json good = Json::parse(encode(e));
  std::string error;
  ASSERT_TRUE(decode_pod_event(good.dump(), &error)) << error;
  struct Case {
    Json version;
    std::string says;
  };
  for (const Case& c : {Case{1.5, "non-integer"}, Case{"1", "non-integer"},
                        Case{Json(4294967297ull), "protocol version 4294967297 is not 1"},
                        Case{Json(-1), "protocol version -1 is not 1"},
                        Case{Json(18446744073709551615ull), "is not 1"}}) {
    Json j = good;
    j["version"] = c.version;
    error.clear();
    std::optional<PodEvent> got;
    ASSERT_NO_THROW(got = decode_pod_event(j.dump(), &error)) << j.dump();
    EXPECT_FALSE(got) << j.dump();
    EXPECT_NE(error.find(c.says), std::string::npos) << j.dump() << ": " << error;
  }
}

}  // namespace
}  // namespace sockmesh::cni
