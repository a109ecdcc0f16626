// The event socket between sockmesh-cni and the agent: the plugin's client against the agent's
// server, over a real Unix socket.
#include "loader/agent/cni_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "base/log.h"
#include "cni/plugin/agent_client.h"
#include "common/scratch_dir.h"

namespace sockmesh::agent {
namespace {

using namespace std::chrono_literals;

std::string socket_path(const char* tag) {
  return testing::scratch_dir("sockmesh-cni-server-test") + "/" + tag + ".sock";
}

cni::PodEvent sample() {
  cni::PodEvent e;
  e.command = cni::Command::kAdd;
  e.container_id = "c1";
  e.netns = "/var/run/netns/cni-1";
  e.ifname = "eth0";
  e.pod_namespace = "shop";
  e.pod_name = "cart-0";
  e.pod_uid = "u1";
  e.ips = {"10.244.1.5", "fd00::5"};
  e.deadline_ms = 2000;
  return e;
}

TEST(CniEventServer, AnswersTheEventThePluginSends) {
  log::set_level(log::Level::kWarn);
  std::string path = socket_path("answer");
  cni::PodEvent received;
  CniEventServer server(
      path,
      [&](const cni::PodEvent& e) {
        received = e;
        return cni::AgentReply{cni::Outcome::kEnrolled, "namespace shop is ambient"};
      },
      nullptr);
  ASSERT_TRUE(server.start());
  using std::filesystem::perms;
  EXPECT_EQ(std::filesystem::status(path).permissions() & (perms::group_all | perms::others_all),
            perms::none)
      << "only root may send pod events";
  EXPECT_EQ(std::filesystem::status(path).permissions() & (perms::owner_read | perms::owner_write),
            perms::owner_read | perms::owner_write);
  auto call = cni::call_agent(path, sample(), 2000);
  ASSERT_EQ(call.status, cni::CallStatus::kAnswered) << call.error;
  EXPECT_EQ(call.reply.outcome, cni::Outcome::kEnrolled);
  EXPECT_EQ(call.reply.message, "namespace shop is ambient");
  EXPECT_EQ(received, sample());
  server.stop();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(CniEventServer, ReplacesAStaleSocketAndServesEventsConcurrently) {
  std::string path = socket_path("stale");
  {
    // A socket file left by a dead agent.
    int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
  }
  std::atomic<int> inside{0}, most{0};
  CniEventServer server(
      path,
      [&](const cni::PodEvent&) {
        int now = ++inside;
        most = std::max(most.load(), now);
        std::this_thread::sleep_for(200ms);
        --inside;
        return cni::AgentReply{cni::Outcome::kSkipped, ""};
      },
      nullptr);
  ASSERT_TRUE(server.start());
  std::vector<std::thread> plugins;
  for (int i = 0; i < 4; ++i) {
    plugins.emplace_back([&] {
      auto call = cni::call_agent(path, sample(), 3000);
      EXPECT_EQ(call.status, cni::CallStatus::kAnswered) << call.error;
    });
  }
  for (auto& t : plugins) t.join();
  EXPECT_GT(most.load(), 1) << "a slow event must not hold up the others";
  EXPECT_EQ(server.served(), 4u);
}

TEST(CniEventServer, APluginThatGaveUpIsReportedSoTheAgentCanUndo) {
  std::string path = socket_path("lost");
  std::atomic<bool> lost{false};
  CniEventServer server(
      path,
      [&](const cni::PodEvent&) {
        std::this_thread::sleep_for(600ms);
        return cni::AgentReply{cni::Outcome::kEnrolled, ""};
      },
      [&](const cni::PodEvent& e) { lost = e.pod_uid == "u1"; });
  ASSERT_TRUE(server.start());
  auto start = std::chrono::steady_clock::now();
  auto call = cni::call_agent(path, sample(), 200);
  EXPECT_EQ(call.status, cni::CallStatus::kTimedOut);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms) << "the deadline holds";
  for (int i = 0; i < 50 && !lost; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(lost.load());
}

TEST(CniEventServer, AMalformedEventGetsAnAnswerNotACrash) {
  std::string path = socket_path("malformed");
  CniEventServer server(
      path,
      [&](const cni::PodEvent&) {
        return cni::AgentReply{cni::Outcome::kEnrolled, ""};
      },
      nullptr);
  ASSERT_TRUE(server.start());
  int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string junk = R"({"version": 1, "command": "ADD"})";
  ASSERT_EQ(send(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  char buf[4096];
  ssize_t n = recv(fd, buf, sizeof(buf), 0);
  close(fd);
  ASSERT_GT(n, 0);
  std::string error;
  auto reply = cni::decode_agent_reply(std::string_view(buf, static_cast<size_t>(n)), &error);
  ASSERT_TRUE(reply) << error;
  EXPECT_EQ(reply->outcome, cni::Outcome::kFailed);
  EXPECT_NE(reply->message.find("containerId"), std::string::npos) << reply->message;
}

TEST(CniEventServer, ASecondAgentDoesNotTakeTheSocketOver) {
  std::string path = socket_path("second");
  auto answer = [](const char* who) {
    return [who](const cni::PodEvent&) { return cni::AgentReply{cni::Outcome::kSkipped, who}; };
  };
  CniEventServer first(path, answer("first"), nullptr);
  ASSERT_TRUE(first.start());
  CniEventServer second(path, answer("second"), nullptr);
  auto started = second.start();
  ASSERT_FALSE(started) << "a second agent must not steal the plugin's socket";
  EXPECT_EQ(started.error().code, EADDRINUSE);
  EXPECT_NE(started.error().message.find("another process serves CNI events"), std::string::npos)
      << started.error().message;
  auto call = cni::call_agent(path, sample(), 2000);
  ASSERT_EQ(call.status, cni::CallStatus::kAnswered) << call.error;
  EXPECT_EQ(call.reply.message, "first") << "the plugin still reaches the agent that was there";

  first.stop();
  EXPECT_FALSE(std::filesystem::exists(path)) << "a stopping agent removes its own socket";

  // The lock file, not only the socket file, keeps a second agent out: with the socket file
  // removed under a running agent, a newer one still does not start.
  CniEventServer old(path, answer("old"), nullptr);
  ASSERT_TRUE(old.start());
  std::filesystem::remove(path);
  CniEventServer newest(path, answer("newest"), nullptr);
  auto refused = newest.start();
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find(path + ".lock"), std::string::npos)
      << refused.error().message;
  // A socket file the agent did not bind (here one bound by someone else after the removal) is
  // left alone when the agent stops.
  int other = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(other, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  old.stop();
  EXPECT_TRUE(std::filesystem::exists(path)) << "the agent removed a socket file it did not bind";
  close(other);
  std::filesystem::remove(path);
  // Once the old agent is gone, its lock is free and the stale file is replaced.
  CniEventServer next(path, answer("next"), nullptr);
  ASSERT_TRUE(next.start());
  auto call_next = cni::call_agent(path, sample(), 2000);
  ASSERT_EQ(call_next.status, cni::CallStatus::kAnswered) << call_next.error;
  EXPECT_EQ(call_next.reply.message, "next");
}

TEST(PodEvent, RoundTripsAndRefusesOtherVersions) {
  std::string error;
  auto back = cni::decode_pod_event(cni::encode(sample()), &error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(*back, sample());
  EXPECT_FALSE(cni::decode_pod_event(R"({"version": 2, "command": "ADD"})", &error));
  EXPECT_NE(error.find("different releases"), std::string::npos) << error;
  EXPECT_FALSE(cni::decode_agent_reply("not json", &error));
  cni::AgentReply reply{cni::Outcome::kUnavailable, "starting"};
  auto reply_back = cni::decode_agent_reply(cni::encode(reply), &error);
  ASSERT_TRUE(reply_back) << error;
  EXPECT_EQ(*reply_back, reply);
}

}  // namespace
}  // namespace sockmesh::agent
