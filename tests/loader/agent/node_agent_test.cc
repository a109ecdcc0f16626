// The node agent's decisions and their effects, with a fake node (FakeEnroller) and a fake proxy
// (FakeHandoff): which pods are enrolled, in which order things happen, what is undone on failure,
// and what a restarted agent makes of what it finds.
#include "loader/agent/node_agent.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "base/log.h"
#include "loader/agent/files.h"
#include "loader/agent/local_config_labels.h"
#include "testing/fakes.h"

namespace sockmesh::agent {
namespace {

using cni::Outcome;
using testing::CallLog;
using testing::FakeEnroller;
using testing::FakeHandoff;

IpAddress ip(const char* text) { return *IpAddress::parse(text); }

const Labels kAmbient = {{kDataplaneModeLabel, kDataplaneModeAmbient}};
const Labels kOptOut = {{kDataplaneModeLabel, kDataplaneModeNone}};

cni::PodEvent event(cni::Command command, const std::string& ns, const std::string& name,
                    const std::string& netns, const std::string& address,
                    const std::string& container = "") {
  cni::PodEvent e;
  e.command = command;
  e.container_id = container.empty() ? "ctr-" + name : container;
  e.netns = netns;
  e.ifname = "eth0";
  e.pod_namespace = ns;
  e.pod_name = name;
  e.pod_uid = "uid-" + name;
  if (!address.empty()) e.ips = {address};
  e.deadline_ms = 10000;
  return e;
}

struct ViewBuilder {
  std::shared_ptr<LabelView> view = std::make_shared<LabelView>();
  ViewBuilder& ns(const std::string& name, Labels labels = {}) {
    view->namespaces[name] = std::move(labels);
    return *this;
  }
  ViewBuilder& pod(const std::string& ns, const std::string& name, Labels labels,
                   std::vector<IpAddress> ips = {}, bool host_network = false) {
    PodMeta m;
    m.uid = "uid-" + name;
    m.name = name;
    m.namespace_name = ns;
    m.service_account = "sa-" + name;
    m.labels = std::move(labels);
    m.ips = std::move(ips);
    m.host_network = host_network;
    view->pods[LabelView::key(ns, name)] = m;
    return *this;
  }
  // Pods the label source knows, with no labels (their service account: sa-<name>).
  ViewBuilder& known(const std::string& ns, std::initializer_list<const char*> names) {
    for (const char* n : names) pod(ns, n, {});
    return *this;
  }
  LabelViewPtr build() { return view; }
};

class NodeAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log::set_level(log::Level::kWarn);
    dir_ = std::filesystem::temp_directory_path() /
           ("sockmesh-agent-test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    for (int i = 1; i <= 4; ++i) enroller_.add_netns(netns(i), 100 + i);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string netns(int i) const { return "/var/run/netns/cni-pod" + std::to_string(i); }

  std::unique_ptr<NodeAgent> make_agent(
      std::chrono::milliseconds labels_wait = std::chrono::milliseconds(1000)) {
    auto handoff = std::make_unique<FakeHandoff>(&log_);
    handoff_ = handoff.get();
    AgentOptions options;
    options.state_file = (dir_ / "pods.json").string();
    options.hints_file = (dir_ / "hints.json").string();
    options.labels_wait = labels_wait;
    auto agent = std::make_unique<NodeAgent>(options, &enroller_, std::move(handoff));
    auto s = agent->start();
    EXPECT_TRUE(s) << s.error().message;
    return agent;
  }

  bool in_map(const char* address) { return enroller_.workload_map().count(ip(address)) != 0; }
  bool handed_over(const std::string& uid) { return handoff_->pods().count(uid) != 0; }

  std::filesystem::path dir_;
  CallLog log_;
  FakeEnroller enroller_{&log_};
  FakeHandoff* handoff_ = nullptr;
};

// --- decide(): the table -------------------------------------------------------------------------

struct Row {
  const char* name;
  std::optional<Labels> namespace_labels;  // nullopt: namespace unknown
  std::optional<Labels> pod_labels;        // nullopt: pod unknown
  const char* namespace_name;
  bool host_network;
  bool enroll;
};

class DecisionTable : public ::testing::TestWithParam<Row> {};

TEST_P(DecisionTable, Decides) {
  const Row& row = GetParam();
  PodFacts facts;
  facts.namespace_name = row.namespace_name;
  facts.namespace_labels = row.namespace_labels ? &*row.namespace_labels : nullptr;
  facts.pod_labels = row.pod_labels ? &*row.pod_labels : nullptr;
  facts.host_network = row.host_network;
  Decision d = decide(facts, {"kube-system"});
  EXPECT_EQ(d.enroll, row.enroll) << d.reason;
  EXPECT_FALSE(d.reason.empty());
}

const Labels kOther = {{"team", "a"}};
const Labels kNotAmbient = {{kDataplaneModeLabel, "sidecar"}};

INSTANTIATE_TEST_SUITE_P(
    Rows, DecisionTable,
    ::testing::Values(Row{"LabelledNamespace", kAmbient, kOther, "shop", false, true},
                      Row{"LabelledNamespaceUnknownPod", kAmbient, std::nullopt, "shop", false,
                          true},
                      Row{"UnlabelledNamespace", kOther, kOther, "shop", false, false},
                      Row{"OtherModeOnNamespace", kNotAmbient, Labels{}, "shop", false, false},
                      Row{"UnknownNamespace", std::nullopt, Labels{}, "shop", false, false},
                      Row{"PodOptsOut", kAmbient, kOptOut, "shop", false, false},
                      Row{"PodOptsIn", Labels{}, kAmbient, "shop", false, true},
                      Row{"PodOptsInUnknownNamespace", std::nullopt, kAmbient, "shop", false, true},
                      Row{"ExcludedNamespace", kAmbient, kAmbient, "kube-system", false, false},
                      Row{"HostNetwork", kAmbient, kAmbient, "shop", true, false}),
    [](const auto& info) { return std::string(info.param.name); });

// --- the agent's decisions through CNI events ---------------------------------------------------

TEST_F(NodeAgentTest, EnrollmentDecisionsThroughAddEvents) {
  auto agent = make_agent();
  agent->update_labels(ViewBuilder()
                           .ns("shop", kAmbient)
                           .ns("plain")
                           .ns("kube-system", kAmbient)
                           .pod("shop", "opted-out", kOptOut)
                           .pod("plain", "opted-in", kAmbient)
                           .known("shop", {"labelled-ns", "host-network"})
                           .build());
  struct Case {
    const char* ns;
    const char* name;
    std::string netns;
    const char* ip;
    Outcome outcome;
  };
  const Case cases[] = {
      {"shop", "labelled-ns", netns(1), "10.0.0.1", Outcome::kEnrolled},
      {"plain", "unlabelled-ns", netns(2), "10.0.0.2", Outcome::kSkipped},
      {"shop", "opted-out", netns(3), "10.0.0.3", Outcome::kSkipped},
      {"plain", "opted-in", netns(4), "10.0.0.4", Outcome::kEnrolled},
      {"kube-system", "excluded", netns(1) + "-x", "10.0.0.5", Outcome::kSkipped},
      {"shop", "host-network", enroller_.host_netns, "10.0.0.6", Outcome::kSkipped},
  };
  enroller_.add_netns(netns(1) + "-x", 201);
  for (const auto& c : cases) {
    auto reply = agent->handle(event(cni::Command::kAdd, c.ns, c.name, c.netns, c.ip));
    EXPECT_EQ(reply.outcome, c.outcome) << c.name << ": " << reply.message;
    bool enrolled = c.outcome == Outcome::kEnrolled;
    EXPECT_EQ(in_map(c.ip), enrolled) << c.name;
    EXPECT_EQ(handed_over(std::string("uid-") + c.name), enrolled) << c.name;
  }
  // The pod's service account came from the label source.
  EXPECT_EQ(handoff_->pods().at("uid-opted-in").service_account, "sa-opted-in");
  EXPECT_EQ(enroller_.workload_map().at(ip("10.0.0.1")).service_account, "sa-labelled-ns");
}

TEST_F(NodeAgentTest, HandsToTheProxyBeforeCaptureAndTakesCaptureOffFirst) {
  auto agent = make_agent();
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).known("shop", {"a", "b", "c"}).build());
  log_.clear();
  auto add = event(cni::Command::kAdd, "shop", "a", netns(1), "10.0.0.1");
  EXPECT_EQ(agent->handle(add).outcome, Outcome::kEnrolled);
  EXPECT_EQ(log_.calls(), (std::vector<std::string>{"add uid-a", "enroll uid-a"}));
  log_.clear();
  auto del = event(cni::Command::kDel, "shop", "a", "", "");
  EXPECT_EQ(agent->handle(del).outcome, Outcome::kRemoved);
  EXPECT_EQ(log_.calls(), (std::vector<std::string>{"unenroll uid-a", "remove uid-a"}));
  EXPECT_FALSE(in_map("10.0.0.1"));
  // A second DEL, and a DEL of a pod never seen, succeed and do nothing.
  log_.clear();
  EXPECT_EQ(agent->handle(del).outcome, Outcome::kRemoved);
  EXPECT_EQ(agent->handle(event(cni::Command::kDel, "shop", "never", "", "")).outcome,
            Outcome::kRemoved);
  EXPECT_TRUE(log_.calls().empty());
  EXPECT_TRUE(agent->pods().empty());
}

TEST_F(NodeAgentTest, StartSyncsTheProxyBeforeAnyAdd) {
  auto agent = make_agent();
  ASSERT_FALSE(log_.calls().empty());
  EXPECT_EQ(log_.calls().front(), "sync ");
}

TEST_F(NodeAgentTest, FailedEnrollmentLeavesNothingBehind) {
  auto agent = make_agent();
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).known("shop", {"a", "b", "c"}).build());
  enroller_.fail_enroll_of("uid-a");
  log_.clear();
  auto reply = agent->handle(event(cni::Command::kAdd, "shop", "a", netns(1), "10.0.0.1"));
  EXPECT_EQ(reply.outcome, Outcome::kFailed);
  EXPECT_NE(reply.message.find("no such device"), std::string::npos) << reply.message;
  EXPECT_FALSE(in_map("10.0.0.1"));
  EXPECT_FALSE(handed_over("uid-a"));
  EXPECT_EQ(log_.calls(), (std::vector<std::string>{"add uid-a", "enroll uid-a", "remove uid-a"}));
  EXPECT_FALSE(agent->pods().at("uid-a").enrolled);
}

TEST_F(NodeAgentTest, UnreachableProxyFailsTheAddWithoutCapture) {
  auto agent = make_agent();
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).known("shop", {"a", "b", "c"}).build());
  handoff_->fail_adds(true);
  auto reply = agent->handle(event(cni::Command::kAdd, "shop", "a", netns(1), "10.0.0.1"));
  EXPECT_EQ(reply.outcome, Outcome::kFailed);
  EXPECT_NE(reply.message.find("proxy"), std::string::npos) << reply.message;
  EXPECT_FALSE(in_map("10.0.0.1"));
}

TEST_F(NodeAgentTest, AddWithoutAddressesFailsForAPodToEnroll) {
  auto agent = make_agent();
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).ns("plain").build());
  EXPECT_EQ(agent->handle(event(cni::Command::kAdd, "shop", "a", netns(1), "")).outcome,
            Outcome::kFailed);
  EXPECT_EQ(agent->handle(event(cni::Command::kAdd, "plain", "b", netns(2), "")).outcome,
            Outcome::kSkipped);
  auto bad = event(cni::Command::kAdd, "shop", "c", netns(3), "not-an-ip");
  EXPECT_EQ(agent->handle(bad).outcome, Outcome::kFailed);
}

TEST_F(NodeAgentTest, NoLabelsYetMeansUnavailable) {
  auto agent = make_agent(std::chrono::milliseconds(50));
  auto reply = agent->handle(event(cni::Command::kAdd, "shop", "a", netns(1), "10.0.0.1"));
  EXPECT_EQ(reply.outcome, Outcome::kUnavailable);
  EXPECT_FALSE(in_map("10.0.0.1"));
  // DEL needs no labels.
  EXPECT_EQ(agent->handle(event(cni::Command::kDel, "shop", "a", "", "")).outcome,
            Outcome::kRemoved);
}

TEST_F(NodeAgentTest, StoppingAnswersEventsThatWaitForLabels) {
  auto agent = make_agent(std::chrono::milliseconds(10000));
  auto start = std::chrono::steady_clock::now();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    agent->shutdown();
  });
  auto reply = agent->handle(event(cni::Command::kAdd, "shop", "a", netns(1), "10.0.0.1"));
  stopper.join();
  EXPECT_EQ(reply.outcome, Outcome::kUnavailable);
  EXPECT_EQ(reply.message, "the agent is stopping");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(5000));
}

TEST_F(NodeAgentTest, LabellingANamespaceEnrollsItsRunningPodsAndUnlabellingUnenrollsThem) {
  auto agent = make_agent();
  ViewBuilder unlabelled;
  unlabelled.ns("shop").pod("shop", "c", kOptOut);
  agent->update_labels(unlabelled.build());
  for (auto [name, i, address] : {std::tuple{"a", 1, "10.0.0.1"}, std::tuple{"b", 2, "10.0.0.2"},
                                  std::tuple{"c", 3, "10.0.0.3"}}) {
    EXPECT_EQ(agent->handle(event(cni::Command::kAdd, "shop", name, netns(i), address)).outcome,
              Outcome::kSkipped);
  }
  EXPECT_TRUE(enroller_.workload_map().empty());

  agent->update_labels(ViewBuilder().ns("shop", kAmbient).pod("shop", "c", kOptOut).build());
  EXPECT_TRUE(in_map("10.0.0.1"));
  EXPECT_TRUE(in_map("10.0.0.2"));
  EXPECT_FALSE(in_map("10.0.0.3")) << "the pod that opted out stays out";
  EXPECT_TRUE(handed_over("uid-a"));
  EXPECT_TRUE(handed_over("uid-b"));
  EXPECT_FALSE(handed_over("uid-c"));

  // The pod changes its mind: its own label now counts.
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).pod("shop", "c", {}).build());
  EXPECT_TRUE(in_map("10.0.0.3"));

  agent->update_labels(ViewBuilder().ns("shop").build());
  EXPECT_TRUE(enroller_.workload_map().empty());
  EXPECT_TRUE(handoff_->pods().empty());
  for (const auto& [uid, record] : agent->pods()) EXPECT_FALSE(record.enrolled) << uid;
}

// ambient.istio.io/dns-capture=false, as a label or an annotation of the pod, clears
// SM_WL_CAPTURE_DNS in its workload record (enrolled all the same); any other value leaves it set;
// a change on a running pod rewrites the record; the flag survives a restart of the agent.
TEST_F(NodeAgentTest, DnsCaptureLabelOrAnnotationClearsTheFlag) {
  EXPECT_TRUE(dns_capture_wanted({}, {}));
  EXPECT_FALSE(dns_capture_wanted({{kDnsCaptureKey, "false"}}, {}));
  EXPECT_FALSE(dns_capture_wanted({}, {{kDnsCaptureKey, "false"}}));
  EXPECT_TRUE(dns_capture_wanted({{kDnsCaptureKey, "true"}}, {{kDnsCaptureKey, "no"}}));

  const Labels kNoDns = {{kDnsCaptureKey, "false"}};
  auto view = [&](bool annotate_b) {
    ViewBuilder v;
    v.ns("shop", kAmbient).known("shop", {"a"}).pod("shop", "b", kNoDns).pod("shop", "c", {});
    if (annotate_b) v.view->pods[LabelView::key("shop", "c")].annotations = kNoDns;
    return v.build();
  };
  {
    auto agent = make_agent();
    agent->update_labels(view(/*annotate_b=*/true));
    for (auto [name, i, address] : {std::tuple{"a", 1, "10.0.0.1"}, std::tuple{"b", 2, "10.0.0.2"},
                                    std::tuple{"c", 3, "10.0.0.3"}}) {
      auto reply = agent->handle(event(cni::Command::kAdd, "shop", name, netns(i), address));
      EXPECT_EQ(reply.outcome, Outcome::kEnrolled) << name << ": " << reply.message;
    }
    EXPECT_TRUE(enroller_.workload_map().at(ip("10.0.0.1")).capture_dns) << "no label: on";
    EXPECT_FALSE(enroller_.workload_map().at(ip("10.0.0.2")).capture_dns) << "label: off";
    EXPECT_FALSE(enroller_.workload_map().at(ip("10.0.0.3")).capture_dns) << "annotation: off";
    auto raw = enroller_.workload_map().at(ip("10.0.0.2")).to_kernel();
    ASSERT_TRUE(raw);
    EXPECT_EQ(raw->flags & (SM_WL_ENROLLED | SM_WL_CAPTURE_DNS), uint32_t{SM_WL_ENROLLED});
    raw = enroller_.workload_map().at(ip("10.0.0.1")).to_kernel();
    ASSERT_TRUE(raw);
    EXPECT_NE(raw->flags & SM_WL_CAPTURE_DNS, 0u);

    // The annotation is removed from the running pod c: its record follows.
    agent->update_labels(view(/*annotate_b=*/false));
    EXPECT_TRUE(enroller_.workload_map().at(ip("10.0.0.3")).capture_dns);
    EXPECT_FALSE(enroller_.workload_map().at(ip("10.0.0.2")).capture_dns);
  }
  // A restarted agent re-applies each pod's enrollment with the flag it had.
  auto agent = make_agent();
  EXPECT_FALSE(enroller_.workload_map().at(ip("10.0.0.2")).capture_dns);
  EXPECT_TRUE(enroller_.workload_map().at(ip("10.0.0.3")).capture_dns);
}

// The first view knows the namespace but not the pod (its ADD beat the view) and the source
// cannot say more: the pod must not be enrolled as service account "default" (an identity it was
// not given). The ADD fails, with nothing captured or handed to the proxy, and is counted; once
// the view has the pod, the held sandbox is enrolled with its own identity, and so is a retry.
TEST_F(NodeAgentTest, APodWhoseMetadataIsUnknownIsHeldNotEnrolledAsDefault) {
  auto agent = make_agent();
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).build());
  auto reply = agent->handle(event(cni::Command::kAdd, "shop", "web", netns(1), "10.0.0.1"));
  EXPECT_EQ(reply.outcome, Outcome::kFailed);
  EXPECT_NE(reply.message.find("metadata"), std::string::npos) << reply.message;
  EXPECT_NE(reply.message.find("held"), std::string::npos) << reply.message;
  EXPECT_FALSE(in_map("10.0.0.1")) << "enrolled under a guessed identity";
  EXPECT_FALSE(handed_over("uid-web"));
  EXPECT_EQ(agent->adds_held_for_metadata(), 1u);
  ASSERT_EQ(agent->pods().count("uid-web"), 1u);
  EXPECT_TRUE(agent->pods().at("uid-web").metadata_pending);
  // A view without the pod changes nothing.
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).known("shop", {"other"}).build());
  EXPECT_FALSE(in_map("10.0.0.1"));
  // The next view has the pod: the held sandbox is enrolled with the pod's own identity.
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).pod("shop", "web", {}).build());
  ASSERT_TRUE(in_map("10.0.0.1"));
  EXPECT_EQ(enroller_.workload_map().at(ip("10.0.0.1")).service_account, "sa-web");
  EXPECT_EQ(agent->pods().at("uid-web").service_account, "sa-web");
  EXPECT_FALSE(agent->pods().at("uid-web").metadata_pending);
  EXPECT_TRUE(handed_over("uid-web"));
  EXPECT_EQ(handoff_->pods().at("uid-web").service_account, "sa-web");
  // The runtime's retry (a new sandbox) now succeeds at once.
  reply = agent->handle(event(cni::Command::kAdd, "shop", "web", netns(2), "10.0.0.2"));
  EXPECT_EQ(reply.outcome, Outcome::kEnrolled) << reply.message;
  EXPECT_EQ(enroller_.workload_map().at(ip("10.0.0.2")).service_account, "sa-web");
  EXPECT_EQ(agent->adds_held_for_metadata(), 1u);
}

// A held pod is persisted as held: an agent restarted before the metadata arrives does not
// enroll it on a guess either.
TEST_F(NodeAgentTest, AHeldPodStaysHeldAcrossARestart) {
  {
    auto agent = make_agent();
    agent->update_labels(ViewBuilder().ns("shop", kAmbient).build());
    EXPECT_EQ(agent->handle(event(cni::Command::kAdd, "shop", "web", netns(1), "10.0.0.1")).outcome,
              Outcome::kFailed);
  }
  auto agent = make_agent();
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).build());
  EXPECT_FALSE(in_map("10.0.0.1"));
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).pod("shop", "web", {}).build());
  ASSERT_TRUE(in_map("10.0.0.1"));
  EXPECT_EQ(enroller_.workload_map().at(ip("10.0.0.1")).service_account, "sa-web");
}

TEST_F(NodeAgentTest, ANewSandboxReplacesTheOldAndAStaleDelIsIgnored) {
  auto agent = make_agent();
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).known("shop", {"a", "b", "c"}).build());
  EXPECT_EQ(
      agent->handle(event(cni::Command::kAdd, "shop", "a", netns(1), "10.0.0.1", "c1")).outcome,
      Outcome::kEnrolled);
  EXPECT_EQ(
      agent->handle(event(cni::Command::kAdd, "shop", "a", netns(2), "10.0.0.9", "c2")).outcome,
      Outcome::kEnrolled);
  EXPECT_FALSE(in_map("10.0.0.1")) << "the old sandbox was unenrolled";
  EXPECT_TRUE(in_map("10.0.0.9"));
  auto stale = agent->handle(event(cni::Command::kDel, "shop", "a", netns(1), "", "c1"));
  EXPECT_EQ(stale.outcome, Outcome::kRemoved);
  EXPECT_TRUE(in_map("10.0.0.9")) << "a DEL of the old sandbox keeps the new one";
  agent->handle(event(cni::Command::kDel, "shop", "a", netns(2), "", "c2"));
  EXPECT_FALSE(in_map("10.0.0.9"));
}

TEST_F(NodeAgentTest, CheckRepairsAPodThatLostItsEnrollment) {
  auto agent = make_agent();
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).known("shop", {"a", "b", "c"}).build());
  auto add = event(cni::Command::kAdd, "shop", "a", netns(1), "10.0.0.1");
  ASSERT_EQ(agent->handle(add).outcome, Outcome::kEnrolled);
  auto check = add;
  check.command = cni::Command::kCheck;
  EXPECT_EQ(agent->handle(check).outcome, Outcome::kEnrolled);
  EXPECT_TRUE(in_map("10.0.0.1"));
}

TEST_F(NodeAgentTest, AReplyThePluginNeverReadIsUndone) {
  auto agent = make_agent();
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).known("shop", {"a", "b", "c"}).build());
  auto add = event(cni::Command::kAdd, "shop", "a", netns(1), "10.0.0.1");
  ASSERT_EQ(agent->handle(add).outcome, Outcome::kEnrolled);
  agent->reply_lost(add);
  EXPECT_FALSE(in_map("10.0.0.1"));
  EXPECT_FALSE(handed_over("uid-a"));
  EXPECT_TRUE(agent->pods().empty());
}

TEST_F(NodeAgentTest, SweepForgetsPodsWhoseNetnsVanished) {
  auto agent = make_agent();
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).known("shop", {"a", "b", "c"}).build());
  agent->handle(event(cni::Command::kAdd, "shop", "a", netns(1), "10.0.0.1"));
  agent->handle(event(cni::Command::kAdd, "shop", "b", netns(2), "10.0.0.2"));
  enroller_.remove_netns(netns(1));
  agent->sweep();
  EXPECT_FALSE(in_map("10.0.0.1"));
  EXPECT_FALSE(handed_over("uid-a"));
  EXPECT_TRUE(in_map("10.0.0.2"));
  EXPECT_EQ(agent->pods().count("uid-a"), 0u);
}

TEST_F(NodeAgentTest, ARestartedAgentAdoptsWhatLivesAndCleansUpWhatDoesNot) {
  {
    auto agent = make_agent();
    agent->update_labels(ViewBuilder().ns("shop", kAmbient).known("shop", {"a", "b", "c"}).build());
    agent->handle(event(cni::Command::kAdd, "shop", "a", netns(1), "10.0.0.1"));
    agent->handle(event(cni::Command::kAdd, "shop", "b", netns(2), "10.0.0.2"));
  }
  // While the agent was away: pod b was deleted; someone enrolled u3 (netns 3 exists) and u4
  // (its netns is gone) by hand, so the agent has no record of either.
  enroller_.remove_netns(netns(2));
  maps::WorkloadRecord r3;
  r3.uid = "u3";
  r3.namespace_name = "shop";
  r3.service_account = "sa3";
  r3.netns_cookie = 103;
  enroller_.put_record(ip("10.0.0.3"), r3);
  maps::WorkloadRecord r4 = r3;
  r4.uid = "u4";
  r4.netns_cookie = 999;
  enroller_.put_record(ip("10.0.0.4"), r4);

  log_.clear();
  auto agent = make_agent();
  auto pods = agent->pods();
  ASSERT_EQ(pods.count("uid-a"), 1u);
  EXPECT_TRUE(pods.at("uid-a").enrolled);
  EXPECT_EQ(pods.at("uid-a").netns_path, netns(1));
  EXPECT_EQ(pods.count("uid-b"), 0u);
  ASSERT_EQ(pods.count("u3"), 1u);
  EXPECT_EQ(pods.at("u3").netns_path, netns(3));
  EXPECT_EQ(pods.at("u3").origin, PodOrigin::kAdopted);
  EXPECT_EQ(pods.count("u4"), 0u);
  EXPECT_TRUE(in_map("10.0.0.1"));
  EXPECT_FALSE(in_map("10.0.0.2"));
  EXPECT_TRUE(in_map("10.0.0.3"));
  EXPECT_FALSE(in_map("10.0.0.4"));
  // The proxy got exactly the pods that are enrolled.
  EXPECT_EQ(log_.calls().back(), "sync u3,uid-a");

  // Labels arrive: the adopted pod is decided like the others (its namespace is ambient).
  agent->update_labels(ViewBuilder().ns("shop", kAmbient).known("shop", {"a", "b", "c"}).build());
  EXPECT_TRUE(in_map("10.0.0.3"));
  agent->update_labels(ViewBuilder().ns("shop").build());
  EXPECT_TRUE(enroller_.workload_map().empty());
}

// An agent killed with kill -9 while it wrote its records or hints leaves the temporary file of
// that write behind (bench/faults.py's kill loop found one after 20 rounds). Nobody reads it,
// but each such kill would leave another: the next agent, which owns the run dir, removes them,
// and nothing else.
TEST_F(NodeAgentTest, AStartRemovesTheTemporaryFilesOfAKilledAgentsWrites) {
  {
    auto agent = make_agent();
    agent->update_labels(ViewBuilder().ns("shop", kAmbient).known("shop", {"a"}).build());
    agent->handle(event(cni::Command::kAdd, "shop", "a", netns(1), "10.0.0.1"));
  }
  namespace fs = std::filesystem;
  const fs::path stale_records = dir_ / "pods.json.tmp.4242.0123456789abcdef";
  const fs::path stale_hints = dir_ / "hints.json.tmp.4242.fedcba9876543210";
  const fs::path other = dir_ / "pods.json.bak";
  std::ofstream(stale_records) << "{\"version\": 1, \"pods\": [";  // cut mid-write
  std::ofstream(stale_hints) << "";
  std::ofstream(other) << "not ours to remove";

  auto agent = make_agent();
  EXPECT_FALSE(fs::exists(stale_records));
  EXPECT_FALSE(fs::exists(stale_hints));
  EXPECT_TRUE(fs::exists(other));
  ASSERT_EQ(agent->pods().count("uid-a"), 1u);  // the whole records were read, not the stale ones
  EXPECT_TRUE(agent->pods().at("uid-a").enrolled);
}

TEST_F(NodeAgentTest, PublishesNamespaceHintsForThePlugin) {
  auto agent = make_agent();
  agent->update_labels(
      ViewBuilder().ns("shop", kAmbient).ns("plain").ns("kube-system", kAmbient).build());
  auto text = read_file((dir_ / "hints.json").string());
  ASSERT_TRUE(text) << text.error().message;
  std::string error;
  auto hints = cni::decode_namespace_hints(*text, &error);
  ASSERT_TRUE(hints) << error;
  EXPECT_EQ(hints->ambient, std::vector<std::string>{"shop"});
  EXPECT_EQ(hints->other, std::vector<std::string>{"plain"});
  EXPECT_EQ(hints->excluded, std::vector<std::string>{"kube-system"});
}

// A label source whose pods are this node's, and a finder that knows where one of them lives.
class NodePodsSource : public LabelSource {
 public:
  std::string name() const override { return "test"; }
  void start(Listener) override {}
  void stop() override {}
  bool lists_node_pods() const override { return true; }
  std::optional<PodMeta> fetch_pod(const std::string& ns, const std::string& name) override {
    if (name != "fetched") return std::nullopt;
    PodMeta m;
    m.uid = "uid-fetched";
    m.name = name;
    m.namespace_name = ns;
    m.service_account = "fetched-sa";
    m.labels = kAmbient;
    return m;
  }
};

class MapFinder : public PodNetnsFinder {
 public:
  std::map<std::string, std::string> where;
  std::string find(const std::string& uid) override {
    auto it = where.find(uid);
    return it == where.end() ? "" : it->second;
  }
};

TEST_F(NodeAgentTest, RunningPodsListedByTheApiAreFoundByTheirCgroupAndEnrolled) {
  NodePodsSource source;
  MapFinder finder;
  finder.where["uid-old"] = netns(3);
  auto handoff = std::make_unique<FakeHandoff>(&log_);
  handoff_ = handoff.get();
  NodeAgent agent(AgentOptions{}, &enroller_, std::move(handoff), &finder);
  agent.set_label_source(&source);
  ASSERT_TRUE(agent.start());
  agent.update_labels(ViewBuilder()
                          .ns("shop", kAmbient)
                          .pod("shop", "old", {}, {ip("10.0.0.3")})
                          .pod("shop", "elsewhere", {}, {ip("10.0.0.8")})
                          .build());
  EXPECT_TRUE(in_map("10.0.0.3"));
  EXPECT_FALSE(in_map("10.0.0.8")) << "no process of that pod on this node";
  EXPECT_EQ(agent.pods().at("uid-old").origin, PodOrigin::kDiscovered);

  // A pod whose ADD comes before the watch reports it: asked for directly.
  auto reply = agent.handle(event(cni::Command::kAdd, "plain", "fetched", netns(4), "10.0.0.4"));
  EXPECT_EQ(reply.outcome, Outcome::kEnrolled) << reply.message;
  EXPECT_EQ(handoff_->pods().at("uid-fetched").service_account, "fetched-sa");
}

// The config file has labels only: ambient.istio.io/dns-capture=false there reaches the agent's
// decision as it does from the API.
TEST(LocalConfigLabels, TheDnsCaptureLabelOfAWorkloadInTheFileCounts) {
  auto dir = std::filesystem::temp_directory_path() /
             ("sockmesh-labels-dns-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto path = (dir / "mesh.yaml").string();
  std::ofstream(path) << "namespaces:\n- name: shop\nworkloads:\n- uid: u1\n  name: web\n"
                         "  namespace: shop\n  serviceAccount: web-sa\n  workloadIps: [10.0.0.9]\n"
                         "  labels: {ambient.istio.io/dns-capture: \"false\"}\n"
                         "- uid: u2\n  name: api\n  namespace: shop\n  workloadIps: [10.0.0.10]\n";
  LocalConfigLabels labels(path, std::chrono::hours(1));
  ASSERT_TRUE(labels.load());
  auto web = labels.fetch_pod("shop", "web");
  ASSERT_TRUE(web);
  EXPECT_FALSE(dns_capture_wanted(web->labels, web->annotations));
  auto api = labels.fetch_pod("shop", "api");
  ASSERT_TRUE(api);
  EXPECT_TRUE(dns_capture_wanted(api->labels, api->annotations));
  std::filesystem::remove_all(dir);
}

TEST(LocalConfigLabels, APodMissingFromTheViewIsLookedUpInTheFileAsItIsNow) {
  auto dir = std::filesystem::temp_directory_path() /
             ("sockmesh-labels-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto path = (dir / "mesh.yaml").string();
  std::ofstream(path) << "namespaces:\n- name: shop\n";
  LocalConfigLabels labels(path, std::chrono::hours(1));  // no poll during the test
  ASSERT_TRUE(labels.load());
  EXPECT_FALSE(labels.fetch_pod("shop", "web"));
  std::ofstream(path) << "namespaces:\n- name: shop\nworkloads:\n- uid: u1\n  name: web\n"
                         "  namespace: shop\n  serviceAccount: web-sa\n"
                         "  workloadIps: [10.0.0.9]\n  labels: {app: web}\n";
  auto meta = labels.fetch_pod("shop", "web");
  ASSERT_TRUE(meta) << "the file was not read again";
  EXPECT_EQ(meta->service_account, "web-sa");
  EXPECT_EQ(meta->labels.at("app"), "web");
  EXPECT_EQ(meta->ips, std::vector<IpAddress>{ip("10.0.0.9")});
  EXPECT_FALSE(labels.fetch_pod("shop", "nobody"));
  std::filesystem::remove_all(dir);
}

// An edit that leaves the namespaces, pods and labels as they were (here: a policy) is not a new
// view for the agent; one that changes a label is.
TEST(LocalConfigLabels, AnEditThatLeavesTheLabelsAloneIsNotPublished) {
  auto dir = std::filesystem::temp_directory_path() /
             ("sockmesh-labels-edit-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto path = (dir / "mesh.yaml").string();
  const std::string workloads =
      "namespaces:\n- name: shop\n  labels: {istio.io/dataplane-mode: ambient}\n"
      "workloads:\n- uid: u1\n  name: web\n  namespace: shop\n  workloadIps: [10.0.0.9]\n";
  std::ofstream(path) << workloads;
  LocalConfigLabels labels(path, std::chrono::hours(1));  // read only by fetch_pod below
  ASSERT_TRUE(labels.load());
  std::vector<LabelViewPtr> views;
  labels.start([&](LabelViewPtr v) { views.push_back(std::move(v)); });
  ASSERT_EQ(views.size(), 1u);

  const std::string with_policy =
      workloads +
      "policies:\n- {name: deny-all, namespace: shop, scope: Namespace, action: Deny, "
      "rules: []}\n";
  auto parsed = config::parse_local_config(with_policy, path);
  const auto* error = config::error_of(parsed);
  ASSERT_EQ(error, nullptr) << error->to_string();  // a real edit, not one the watcher rejects
  ASSERT_EQ(config::snapshot_of(parsed)->policies().size(), 1u);
  std::ofstream(path) << with_policy;
  ASSERT_TRUE(labels.fetch_pod("shop", "web"));  // reads the file again
  EXPECT_EQ(views.size(), 1u) << "a policy edit was published as new labels";

  std::ofstream(path) << workloads << "  labels: {app: web}\n";
  ASSERT_TRUE(labels.fetch_pod("shop", "web"));
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[1]->pod("shop", "web")->labels.at("app"), "web");
  labels.stop();
  std::filesystem::remove_all(dir);
}

TEST(PodRecords, SurviveAFileRoundTrip) {
  std::string path = std::filesystem::temp_directory_path() /
                     ("sockmesh-pods-" + std::to_string(getpid()) + ".json");
  PodRecords pods;
  PodRecord r;
  r.uid = "u1";
  r.name = "a";
  r.namespace_name = "shop";
  r.service_account = "sa";
  r.container_id = "c1";
  r.netns_path = "/var/run/netns/x";
  r.ips = {ip("10.0.0.1"), ip("fd00::1")};
  r.enrolled = true;
  r.origin = PodOrigin::kDiscovered;
  pods[r.uid] = r;
  ASSERT_TRUE(save_pod_records(path, pods));
  auto loaded = load_pod_records(path);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(*loaded, pods);
  std::filesystem::remove(path);
  auto missing = load_pod_records(path);
  ASSERT_TRUE(missing);
  EXPECT_TRUE(missing->empty());
}

}  // namespace
}  // namespace sockmesh::agent
