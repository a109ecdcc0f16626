// The Kubernetes client against recorded API answers replayed by a local HTTP server: list, watch
// with events and bookmarks, relist after 410 Gone (as a watch ERROR event and as an HTTP status),
// a direct GET, kubeconfig and in-cluster access, and the labels the agent gets out of it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "base/log.h"
#include "loader/agent/kube/cluster_access.h"
#include "loader/agent/kube/kubernetes_labels.h"
#include "loader/agent/kube/owner_daemonset.h"
#include "loader/agent/kube/reflector.h"
#include "loader/agent/node_agent.h"
#include "testing/fakes.h"
#include "testing/replay_server.h"

namespace sockmesh::agent {
namespace {

using namespace std::chrono_literals;
using testing::Exchange;
using testing::recorded;
using testing::ReplayServer;

// The lines of a recorded watch stream, one chunk each.
std::vector<std::string> lines(const std::string& name) {
  std::vector<std::string> out;
  std::istringstream in(recorded(name));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(line + "\n");
  }
  return out;
}

kube::ClusterAccess access_for(const ReplayServer& server) {
  kube::ClusterAccess a;
  a.server = server.url();
  a.token = "replay-token";
  return a;
}

kube::ReflectorOptions fast() {
  kube::ReflectorOptions o;
  o.watch_timeout = 30s;
  o.backoff_min = 10ms;
  o.backoff_max = 100ms;
  return o;
}

template <typename F>
bool eventually(F condition, std::chrono::milliseconds timeout = 5000ms) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

class KubeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(recorded("namespaces-list.json").empty())
        << "recorded answers not found: SOCKMESH_SOURCE_DIR must point at the source tree";
    log::set_level(log::Level::kWarn);
  }
};

TEST_F(KubeTest, ReflectorListsWatchesFollowsBookmarksAndRelistsAfter410) {
  ReplayServer server({
      {"/api/v1/namespaces", false, {}, 200, {recorded("namespaces-list.json")}},
      {"/api/v1/namespaces?",
       true,
       {"resourceVersion=1000", "allowWatchBookmarks=true"},
       200,
       lines("namespaces-watch-1.jsonl")},
      {"/api/v1/namespaces?",
       true,
       {"resourceVersion=1050"},
       200,
       lines("namespaces-watch-2-expired.jsonl")},
      {"/api/v1/namespaces", false, {}, 200, {recorded("namespaces-relist.json")}},
  });
  kube::ApiClient client(access_for(server));
  std::mutex mu;
  std::vector<std::set<std::string>> seen;  // the collection after each change
  std::map<std::string, std::string> shop_mode;
  kube::Reflector reflector(
      &client, "/api/v1/namespaces", "",
      [&](const kube::Reflector::Objects& objects) {
        std::lock_guard lock(mu);
        std::set<std::string> names;
        for (const auto& [key, object] : objects) names.insert(key);
        seen.push_back(names);
        auto shop = objects.find("shop");
        shop_mode["shop"] = shop == objects.end() ? "absent"
                                                  : shop->second["metadata"]["labels"].value(
                                                        "istio.io/dataplane-mode", "unset");
      },
      fast());
  std::thread runner([&] { reflector.run(); });
  // list, watch@1000, watch@1050 (410), list, watch@1300 (idle).
  ASSERT_TRUE(server.wait_requests(5, 5000ms));
  ASSERT_TRUE(eventually([&] { return reflector.resource_version() == "1300"; }));
  reflector.stop();
  runner.join();

  auto requests = server.requests();
  EXPECT_EQ(requests[0].target, "/api/v1/namespaces");
  EXPECT_EQ(requests[1].target,
            "/api/v1/namespaces?watch=1&allowWatchBookmarks=true&resourceVersion=1000"
            "&timeoutSeconds=30");
  EXPECT_NE(requests[2].target.find("resourceVersion=1050"), std::string::npos)
      << "the bookmark moved the resourceVersion the next watch starts from";
  EXPECT_EQ(requests[3].target, "/api/v1/namespaces") << "410 Gone: list again";
  EXPECT_NE(requests[4].target.find("resourceVersion=1300"), std::string::npos);
  for (const auto& r : requests) EXPECT_EQ(r.authorization, "Bearer replay-token");
  EXPECT_TRUE(server.all_used());
  EXPECT_EQ(reflector.lists(), 2u);

  std::lock_guard lock(mu);
  // list, MODIFIED, ADDED (the bookmark is no change), relist.
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0], (std::set<std::string>{"default", "kube-system", "shop"}));
  EXPECT_EQ(seen[2], (std::set<std::string>{"batch", "default", "kube-system", "shop"}));
  EXPECT_EQ(seen[3], (std::set<std::string>{"default", "kube-system", "shop"}))
      << "the relist dropped the namespace deleted while the watch was gone";
  EXPECT_EQ(shop_mode["shop"], "ambient");
}

TEST_F(KubeTest, NodePodsAndNamespacesBecomeTheAgentsLabels) {
  ReplayServer server({
      {"/api/v1/namespaces", false, {}, 200, {recorded("namespaces-list.json")}},
      {"/api/v1/namespaces?",
       true,
       {"resourceVersion=1000"},
       200,
       lines("namespaces-watch-1.jsonl")},
      {"/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a",
       false,
       {},
       200,
       {recorded("pods-list.json")}},
      {"/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&watch=1",
       true,
       {"resourceVersion=2000"},
       200,
       lines("pods-watch-1.jsonl")},
      // An older API server answers a watch from a compacted resourceVersion with HTTP 410.
      {"/api/v1/pods?", true, {"resourceVersion=2100"}, 410, {recorded("pods-watch-gone.json")}},
      {"/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a",
       false,
       {},
       200,
       {recorded("pods-relist.json")}},
      {"/api/v1/namespaces/shop/pods/cart-1", false, {}, 200, {recorded("pod-cart-1.json")}},
  });
  kube::KubernetesLabels source(access_for(server), "node-a", fast());
  std::mutex mu;
  std::vector<LabelViewPtr> views;
  source.start([&](LabelViewPtr v) {
    std::lock_guard lock(mu);
    views.push_back(std::move(v));
  });
  ASSERT_TRUE(eventually([&] { return source.pods().resource_version() == "2300"; }));
  ASSERT_TRUE(eventually([&] { return source.namespaces().resource_version() == "1050"; }));

  auto fetched = source.fetch_pod("shop", "cart-1");
  ASSERT_TRUE(fetched);
  EXPECT_EQ(fetched->uid, "5b2c3d4e-1111-4f60-9bac-123456789abc");
  EXPECT_EQ(fetched->service_account, "cart");
  EXPECT_FALSE(source.fetch_pod("shop", "nope")) << "404: no such pod";
  source.stop();

  std::lock_guard lock(mu);
  ASSERT_FALSE(views.empty());
  const LabelView& first = *views.front();
  EXPECT_EQ(first.namespaces.size(), 3u) << "no view before both collections are listed";
  EXPECT_EQ(first.pods.size(), 4u);
  const LabelView& last = *views.back();
  EXPECT_TRUE(is_ambient(*last.namespace_labels("shop")));
  EXPECT_NE(last.namespace_labels("batch"), nullptr);
  const PodMeta* cart0 = last.pod("shop", "cart-0");
  ASSERT_NE(cart0, nullptr);
  EXPECT_EQ(cart0->uid, "4a1b2c3d-0000-4e5f-8a9b-0123456789ab");
  EXPECT_EQ(cart0->service_account, "cart");
  EXPECT_EQ(cart0->ips, std::vector<IpAddress>{*IpAddress::parse("10.244.1.5")});
  EXPECT_TRUE(cart0->running);
  EXPECT_TRUE(last.pod("kube-system", "kube-proxy-7xk2p")->host_network);
  EXPECT_EQ(last.pod("shop", "legacy-0")->labels.at("istio.io/dataplane-mode"), "none");
  EXPECT_EQ(last.pod("default", "web-5f6d7c8b9-x2k4m"), nullptr) << "deleted, then relisted";
  ASSERT_NE(last.pod("shop", "cart-1"), nullptr);
  // Pending (no IP yet) in the watch, then running with its IP.
  bool saw_pending = false;
  for (const auto& v : views) {
    const PodMeta* p = v->pod("shop", "cart-1");
    if (p != nullptr && p->ips.empty()) saw_pending = true;
  }
  EXPECT_TRUE(saw_pending);
  EXPECT_EQ(last.pod("shop", "cart-1")->ips.size(), 1u);
}

TEST_F(KubeTest, ANamespaceLabelledThroughTheWatchEnrollsItsPods) {
  Exchange watch{"/api/v1/namespaces?",
                 true,
                 {"resourceVersion=1000"},
                 200,
                 lines("namespaces-watch-1.jsonl")};
  watch.gap = 800ms;  // the label arrives after the pods' ADDs
  ReplayServer server({
      {"/api/v1/namespaces", false, {}, 200, {recorded("namespaces-list.json")}},
      watch,
      {"/api/v1/pods?", false, {}, 200, {recorded("pods-list.json")}},
  });
  testing::CallLog log;
  testing::FakeEnroller enroller(&log);
  enroller.add_netns("/var/run/netns/cni-cart-0", 11);
  enroller.add_netns("/var/run/netns/cni-legacy-0", 12);
  NodeAgent agent(AgentOptions{}, &enroller, std::make_unique<testing::FakeHandoff>(&log));
  ASSERT_TRUE(agent.start());
  kube::KubernetesLabels source(access_for(server), "node-a", fast());
  agent.set_label_source(&source);
  source.start([&](LabelViewPtr v) { agent.update_labels(std::move(v)); });

  cni::PodEvent e;
  e.command = cni::Command::kAdd;
  e.ifname = "eth0";
  e.pod_namespace = "shop";
  e.deadline_ms = 5000;
  for (auto [name, uid, address] :
       {std::tuple{"cart-0", "4a1b2c3d-0000-4e5f-8a9b-0123456789ab", "10.244.1.5"},
        std::tuple{"legacy-0", "77777777-1111-4222-8333-444444444444", "10.244.1.7"}}) {
    e.pod_name = name;
    e.pod_uid = uid;
    e.container_id = std::string("ctr-") + name;
    e.netns = std::string("/var/run/netns/cni-") + name;
    e.ips = {address};
    EXPECT_EQ(agent.handle(e).outcome, cni::Outcome::kSkipped) << name;
  }
  EXPECT_TRUE(eventually([&] {
    return enroller.workload_map().count(*IpAddress::parse("10.244.1.5")) == 1;
  })) << "the watch labelled shop ambient: its running pod is enrolled";
  EXPECT_EQ(enroller.workload_map().count(*IpAddress::parse("10.244.1.7")), 0u)
      << "legacy-0 is labelled istio.io/dataplane-mode=none";
  EXPECT_EQ(agent.pods().at("4a1b2c3d-0000-4e5f-8a9b-0123456789ab").service_account, "cart")
      << "the pod's service account comes from the API";
  source.stop();
}

// The pod's annotations reach the agent with its labels: ambient.istio.io/dns-capture=false as
// an annotation turns the capture of its DNS off like the label does.
TEST(KubePodMeta, AnnotationsAreReadAndTheDnsCaptureAnnotationCounts) {
  auto pod = nlohmann::json::parse(R"({
    "metadata": {"uid": "u-1", "name": "web-0", "namespace": "shop",
                 "labels": {"app": "web"},
                 "annotations": {"ambient.istio.io/dns-capture": "false", "other": "x"}},
    "spec": {"serviceAccountName": "web"},
    "status": {"phase": "Running", "podIPs": [{"ip": "10.1.0.5"}]}})");
  auto meta = kube::pod_meta_of(pod);
  ASSERT_TRUE(meta);
  EXPECT_EQ(meta->annotations.at(kDnsCaptureKey), "false");
  EXPECT_EQ(meta->labels.count(kDnsCaptureKey), 0u);
  EXPECT_FALSE(dns_capture_wanted(meta->labels, meta->annotations));
  pod["metadata"].erase("annotations");
  meta = kube::pod_meta_of(pod);
  ASSERT_TRUE(meta);
  EXPECT_TRUE(meta->annotations.empty());
  EXPECT_TRUE(dns_capture_wanted(meta->labels, meta->annotations));
}

TEST(ClusterAccess, ReadsAKubeconfigAndTheInClusterServiceAccount) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("sockmesh-kubeconfig-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "token") << "file-token\n";
  std::ofstream(dir / "config") << R"(apiVersion: v1
kind: Config
clusters:
- name: other
  cluster:
    server: https://10.0.0.9:6443
- name: kind
  cluster:
    server: https://127.0.0.1:41234/
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
users:
- name: admin
  user:
    tokenFile: token
contexts:
- name: kind-kind
  context:
    cluster: kind
    user: admin
current-context: kind-kind
)";
  auto a = kube::load_kubeconfig((dir / "config").string());
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ(a->server, "https://127.0.0.1:41234");
  EXPECT_EQ(a->ca_data, "-----BEGIN CERTIFICATE-----\n");
  EXPECT_EQ(a->token_file, (dir / "token").string()) << "relative to the kubeconfig";
  EXPECT_EQ(a->bearer_token(), "file-token");

  std::ofstream(dir / "ca.crt") << "pem";
  auto in = kube::in_cluster(
      {{"KUBERNETES_SERVICE_HOST", "fd00::1"}, {"KUBERNETES_SERVICE_PORT", "443"}}, dir.string());
  ASSERT_TRUE(in) << in.error().message;
  EXPECT_EQ(in->server, "https://[fd00::1]:443");
  EXPECT_EQ(in->ca_file, (dir / "ca.crt").string());
  EXPECT_EQ(in->bearer_token(), "file-token");
  EXPECT_FALSE(kube::in_cluster({}, dir.string()));
  EXPECT_FALSE(kube::load_kubeconfig((dir / "missing").string()));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sockmesh::agent

namespace sockmesh::agent {
namespace {

// At SIGTERM the agent asks for its own DaemonSet to tell an uninstall from an upgrade.
TEST_F(KubeTest, OwnerDaemonSetPresentDeletingGoneOrUnknown) {
  const std::string path = "/apis/apps/v1/namespaces/istio-system/daemonsets/sockmesh-node";
  ReplayServer server({
      {path, false, {}, 200, {recorded("daemonset-node.json")}},
      {path, false, {}, 200, {recorded("daemonset-node-deleting.json")}},
      {path, false, {}, 404, {recorded("daemonset-node-not-found.json")}},
      {path, false, {}, 500, {"{}"}},
      {path, false, {}, 200, {recorded("pod-cart-1.json")}},  // not a DaemonSet
  });
  kube::ApiClient client(access_for(server));
  const std::string owner = "istio-system/sockmesh-node";

  auto present = kube::owner_daemonset_state(client, owner);
  EXPECT_EQ(present.state, kube::OwnerState::kPresent) << present.detail;
  EXPECT_NE(present.detail.find("5b0d5e4e"), std::string::npos) << present.detail;

  auto deleting = kube::owner_daemonset_state(client, owner);
  EXPECT_EQ(deleting.state, kube::OwnerState::kDeleting) << deleting.detail;
  EXPECT_NE(deleting.detail.find("2026-12-01T10:02:17Z"), std::string::npos) << deleting.detail;

  auto gone = kube::owner_daemonset_state(client, owner);
  EXPECT_EQ(gone.state, kube::OwnerState::kGone) << gone.detail;

  auto error = kube::owner_daemonset_state(client, owner);
  EXPECT_EQ(error.state, kube::OwnerState::kUnknown);
  EXPECT_NE(error.detail.find("500"), std::string::npos) << error.detail;

  auto wrong_kind = kube::owner_daemonset_state(client, owner);
  EXPECT_EQ(wrong_kind.state, kube::OwnerState::kUnknown) << wrong_kind.detail;

  EXPECT_TRUE(server.all_used());
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 5u);
  EXPECT_EQ(requests[0].target, path);
  EXPECT_EQ(requests[0].authorization, "Bearer replay-token");
}

TEST_F(KubeTest, OwnerDaemonSetUnreachableApiAndMalformedOwnerAreUnknown) {
  kube::ClusterAccess nowhere;
  nowhere.server = "http://127.0.0.1:1";  // nothing listens on port 1
  kube::ApiClient client(nowhere, 2s);
  auto answer = kube::owner_daemonset_state(client, "istio-system/sockmesh-node");
  EXPECT_EQ(answer.state, kube::OwnerState::kUnknown);
  EXPECT_FALSE(answer.detail.empty());

  std::string ns, name, error;
  for (const char* bad : {"", "sockmesh-node", "/x", "x/", "a/b/c"}) {
    EXPECT_FALSE(kube::parse_owner(bad, &ns, &name, &error)) << bad;
    EXPECT_NE(error.find("<namespace>/<daemonset>"), std::string::npos) << error;
    EXPECT_EQ(kube::owner_daemonset_state(client, bad).state, kube::OwnerState::kUnknown) << bad;
  }
  ASSERT_TRUE(kube::parse_owner("istio-system/sockmesh-node", &ns, &name, &error));
  EXPECT_EQ(ns, "istio-system");
  EXPECT_EQ(name, "sockmesh-node");
}

}  // namespace
}  // namespace sockmesh::agent
