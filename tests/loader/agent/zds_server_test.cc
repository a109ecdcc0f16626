// ZdsServer (the node agent's side) against fake proxies that connect to it as ztunnel does:
// nothing is sent before the first sync(), each call waits for its ack, nacks come back as errors,
// a restarted proxy gets the whole snapshot, adds go to the newest proxy and dels to all, and a
// socket another agent serves is not taken over. Unprivileged: the "pods" all live in the test's
// own netns.
#include "loader/agent/zds_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "common/scratch_dir.h"

namespace sockmesh::agent {
namespace {

using namespace std::chrono_literals;

// What the fake proxy received: each request in order, and whether a netns came with it.
struct Seen {
  std::string what;  // zds::describe()
  bool had_netns = false;
};

// A proxy as Istio's ztunnel behaves: it connects to the agent's socket, says hello, acks each
// request, and connects again whenever the agent ends the connection.
class FakeProxy {
 public:
  explicit FakeProxy(std::string path) : path_(std::move(path)) {
    wake_.reset(eventfd(0, EFD_CLOEXEC));
    auto conn = connect_once(2s);
    EXPECT_TRUE(conn.valid()) << "cannot connect to " << path_;
    thread_ = std::thread([this, c = std::move(conn)]() mutable { run(std::move(c)); });
  }
  // Like a proxy that exits: its connection goes.
  ~FakeProxy() {
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof one);
    thread_.join();
  }

  std::vector<Seen> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }
  void clear() {
    std::lock_guard lock(mu_);
    seen_.clear();
  }
  void refuse(const std::string& uid) {
    std::lock_guard lock(mu_);
    refused_.insert(uid);
  }
  int connections() const { return connections_.load(); }

 private:
  maps::UniqueFd connect_once(std::chrono::milliseconds patience) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    auto deadline = std::chrono::steady_clock::now() + patience;
    do {
      maps::UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
      if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
        EXPECT_FALSE(zds::send_packet(fd.get(), zds::encode(zds::Hello{})));
        ++connections_;
        return fd;
      }
      std::this_thread::sleep_for(10ms);
    } while (std::chrono::steady_clock::now() < deadline);
    return {};
  }

  void run(maps::UniqueFd conn) {
    while (true) {
      if (!conn) {
        conn = connect_once(20ms);
        pollfd w{wake_.get(), POLLIN, 0};
        if (poll(&w, 1, 0) > 0) return;
        continue;
      }
      pollfd p[2] = {{wake_.get(), POLLIN, 0}, {conn.get(), POLLIN, 0}};
      if (poll(p, 2, -1) < 0) return;
      if (p[0].revents) return;
      auto got = zds::receive_packet(conn.get(), 0);
      if (got.status == zds::ReceiveStatus::kClosed) {
        conn.reset();  // the agent ended it: connect again, as ztunnel does
        continue;
      }
      if (got.status != zds::ReceiveStatus::kOk) continue;
      std::string err;
      auto req = zds::decode_request(got.packet.bytes, &err);
      EXPECT_TRUE(req) << err;
      std::string reply;
      {
        std::lock_guard lock(mu_);
        seen_.push_back({req ? zds::describe(*req) : err, got.packet.fd.valid()});
        if (req && std::holds_alternative<zds::AddWorkload>(*req) &&
            refused_.count(std::get<zds::AddWorkload>(*req).uid) != 0) {
          reply = "refused by the test";
        }
      }
      zds::send_packet(conn.get(), zds::encode(zds::Ack{reply}));
    }
  }

  std::string path_;
  maps::UniqueFd wake_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Seen> seen_;
  std::set<std::string> refused_;
  std::atomic<int> connections_{0};
};

std::string temp_socket_path() {
  static std::atomic<int> n{0};
  return testing::scratch_dir("sm-zds-server-test") + "/" + std::to_string(n++) + ".sock";
}

PodWorkload pod(const std::string& uid, const std::string& ip) {
  return PodWorkload{uid, uid + "-name", "ns", "sa", {*IpAddress::parse(ip)}, "/proc/self/ns/net"};
}

std::vector<std::string> whats(const std::vector<Seen>& seen) {
  std::vector<std::string> out;
  for (const auto& s : seen) out.push_back(s.what);
  return out;
}

std::unique_ptr<ZdsServer> serve(const std::string& path) {
  ZdsServerOptions o;
  o.socket_path = path;
  o.ack_timeout = 2000ms;
  o.connect_wait = 300ms;
  auto server = ZdsServer::listen(o);
  EXPECT_TRUE(server) << server.error().message;
  return server ? std::move(server).value() : nullptr;
}

TEST(ZdsServer, SendsNothingBeforeTheFirstSync) {
  auto path = temp_socket_path();
  auto agent = serve(path);
  ASSERT_TRUE(agent);
  FakeProxy proxy(path);
  auto s = agent->add(pod("a", "10.0.0.1"));
  EXPECT_FALSE(s);
  EXPECT_NE(s.error().message.find("sync() has not been called"), std::string::npos);
  std::this_thread::sleep_for(150ms);
  EXPECT_TRUE(proxy.seen().empty()) << "a partial snapshot would close other pods' listeners";
  EXPECT_FALSE(agent->connected());
  ASSERT_TRUE(agent->sync({pod("a", "10.0.0.1")})) << "the waiting proxy gets the snapshot";
  EXPECT_EQ(whats(proxy.seen()), (std::vector<std::string>{
                                     "add uid=a name=ns/a-name sa=sa ips=10.0.0.1",
                                     "snapshot_sent"}));
}

TEST(ZdsServer, SyncAddRemoveEachWaitForTheirAck) {
  auto path = temp_socket_path();
  auto agent = serve(path);
  ASSERT_TRUE(agent);
  FakeProxy proxy(path);
  ASSERT_TRUE(agent->sync({pod("a", "10.0.0.1")}));
  ASSERT_TRUE(agent->add(pod("b", "fd00::2")));
  ASSERT_TRUE(agent->remove("a"));
  auto seen = proxy.seen();
  EXPECT_EQ(whats(seen), (std::vector<std::string>{
                             "add uid=a name=ns/a-name sa=sa ips=10.0.0.1", "snapshot_sent",
                             "add uid=b name=ns/b-name sa=sa ips=fd00::2", "del uid=a"}));
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_TRUE(seen[0].had_netns);
  EXPECT_FALSE(seen[1].had_netns);
  EXPECT_TRUE(seen[2].had_netns);
  EXPECT_FALSE(seen[3].had_netns);
  EXPECT_EQ(agent->sessions(), 1u);
}

TEST(ZdsServer, ReportsNacksAndUnopenableNetns) {
  auto path = temp_socket_path();
  auto agent = serve(path);
  ASSERT_TRUE(agent);
  FakeProxy proxy(path);
  proxy.refuse("bad");
  ASSERT_TRUE(agent->sync({}));
  auto s = agent->add(pod("bad", "10.0.0.9"));
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("refused by the test"), std::string::npos) << s.error().message;
  PodWorkload gone = pod("gone", "10.0.0.8");
  gone.netns_path = "/proc/self/ns/does-not-exist";
  s = agent->add(gone);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("does-not-exist"), std::string::npos) << s.error().message;
  EXPECT_TRUE(agent->connected()) << "a nack does not end the session";

  // A new snapshot ends the connection; the proxy connects again and gets it. In it, a pod whose
  // netns cannot be opened is kept rather than dropped.
  proxy.clear();
  EXPECT_FALSE(agent->sync({pod("a", "10.0.0.1"), gone}));
  ASSERT_TRUE(agent->wait_connected(5s, 2));
  EXPECT_EQ(whats(proxy.seen()),
            (std::vector<std::string>{"add uid=a name=ns/a-name sa=sa ips=10.0.0.1",
                                      "keep uid=gone", "snapshot_sent"}));
  EXPECT_EQ(proxy.connections(), 2);
}

TEST(ZdsServer, ARestartedProxyGetsTheWholeSnapshot) {
  auto path = temp_socket_path();
  auto agent = serve(path);
  ASSERT_TRUE(agent);
  auto proxy = std::make_unique<FakeProxy>(path);
  ASSERT_TRUE(agent->sync({pod("a", "10.0.0.1")}));
  ASSERT_TRUE(agent->add(pod("b", "10.0.0.2")));

  proxy.reset();  // the proxy exits
  auto s = agent->add(pod("c", "10.0.0.3"));
  ASSERT_FALSE(s);
  // Whether the agent noticed the exit first or found out by sending, the add fails.
  EXPECT_TRUE(s.error().message.find("no proxy is connected on " + path) != std::string::npos ||
              s.error().message.find("the proxy's connection ended") != std::string::npos)
      << s.error().message;
  ASSERT_TRUE(agent->remove("b")) << "removing while the proxy is away only forgets";
  EXPECT_FALSE(agent->connected());

  proxy = std::make_unique<FakeProxy>(path);  // and comes back
  ASSERT_TRUE(agent->wait_connected(5s, 2)) << "the agent serves a proxy that connects";
  EXPECT_EQ(
      whats(proxy->seen()),
      (std::vector<std::string>{"add uid=a name=ns/a-name sa=sa ips=10.0.0.1",
                                "add uid=c name=ns/c-name sa=sa ips=10.0.0.3", "snapshot_sent"}));

  // A restart between two calls: the next call serves the new connection first, then adds.
  proxy.reset();
  proxy = std::make_unique<FakeProxy>(path);
  ASSERT_TRUE(agent->add(pod("d", "10.0.0.4")));
  EXPECT_EQ(whats(proxy->seen()),
            (std::vector<std::string>{"add uid=a name=ns/a-name sa=sa ips=10.0.0.1",
                                      "add uid=c name=ns/c-name sa=sa ips=10.0.0.3",
                                      "snapshot_sent",
                                      "add uid=d name=ns/d-name sa=sa ips=10.0.0.4"}));
}

TEST(ZdsServer, AddsGoToTheNewestProxyAndDelsToEvery) {
  auto path = temp_socket_path();
  auto agent = serve(path);
  ASSERT_TRUE(agent);
  FakeProxy old_proxy(path);
  ASSERT_TRUE(agent->sync({pod("a", "10.0.0.1")}));
  FakeProxy new_proxy(path);  // an upgrade: the new proxy connects while the old one runs
  ASSERT_TRUE(agent->wait_connected(5s, 2));
  ASSERT_TRUE(agent->add(pod("b", "10.0.0.2")));
  ASSERT_TRUE(agent->remove("a"));
  EXPECT_EQ(whats(old_proxy.seen()),
            (std::vector<std::string>{"add uid=a name=ns/a-name sa=sa ips=10.0.0.1",
                                      "snapshot_sent", "del uid=a"}));
  EXPECT_EQ(whats(new_proxy.seen()),
            (std::vector<std::string>{"add uid=a name=ns/a-name sa=sa ips=10.0.0.1",
                                      "snapshot_sent", "add uid=b name=ns/b-name sa=sa ips=10.0.0.2",
                                      "del uid=a"}));
  EXPECT_EQ(old_proxy.connections(), 1) << "the older proxy is not pushed off (no flapping)";
}

// Istio's proxy reads a message into 1 KiB: an add that would be larger goes without the IPs (the
// proxy reads them in the pod's netns), and still carries the netns and the names.
TEST(ZdsServer, AnAddThatWouldPassOneKibGoesWithoutItsIps) {
  auto path = temp_socket_path();
  auto agent = serve(path);
  ASSERT_TRUE(agent);
  FakeProxy proxy(path);
  ASSERT_TRUE(agent->sync({}));
  PodWorkload big = pod("big", "10.0.0.1");
  big.name = std::string(990, 'n');  // 1036 bytes encoded with both IPs, 1012 without
  big.ips.push_back(*IpAddress::parse("fd00::1"));
  ASSERT_TRUE(agent->add(big));
  ASSERT_TRUE(agent->add(pod("small", "10.0.0.2")));
  auto seen = proxy.seen();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].what, "add uid=big name=ns/" + big.name + " sa=sa ips=");
  EXPECT_TRUE(seen[1].had_netns);
  EXPECT_EQ(seen[2].what, "add uid=small name=ns/small-name sa=sa ips=10.0.0.2")
      << "a pod that fits keeps its IPs";
  EXPECT_LE(zds::encode(zds::Request{zds::AddWorkload{big.uid, {big.name, "ns", "sa"}, {}}}).size(),
            zds::kMaxSentBytes);
}

// An agent that starts while its proxy is still in its reconnect back-off: sync() waits for it a
// little (connect_wait), so the pods the agent enrolls at start are not refused.
TEST(ZdsServer, SyncWaitsForAProxyThatIsReconnecting) {
  auto path = temp_socket_path();
  auto agent = serve(path);
  ASSERT_TRUE(agent);
  std::unique_ptr<FakeProxy> proxy;
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    proxy = std::make_unique<FakeProxy>(path);
  });
  auto s = agent->sync({pod("a", "10.0.0.1")});
  later.join();
  ASSERT_TRUE(s) << s.error().message;
  ASSERT_TRUE(agent->add(pod("b", "10.0.0.2")));
  EXPECT_EQ(whats(proxy->seen()),
            (std::vector<std::string>{"add uid=a name=ns/a-name sa=sa ips=10.0.0.1",
                                      "snapshot_sent",
                                      "add uid=b name=ns/b-name sa=sa ips=10.0.0.2"}));
}

// A local process that connects and says nothing costs the agent one hello timeout, not more,
// and the proxy behind it is still served.
TEST(ZdsServer, AClientThatNeverSaysHelloIsDroppedAfterTheHelloTimeout) {
  auto path = temp_socket_path();
  ZdsServerOptions o;
  o.socket_path = path;
  o.hello_timeout = 300ms;
  auto server = ZdsServer::listen(o);
  ASSERT_TRUE(server) << server.error().message;
  auto agent = std::move(server).value();
  maps::UniqueFd mute(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(connect(mute.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  FakeProxy proxy(path);
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(agent->sync({pod("a", "10.0.0.1")}));
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 2s) << "one hello timeout (300 ms) for the mute client, then the proxy";
  EXPECT_EQ(agent->sessions(), 1u);
  EXPECT_EQ(whats(proxy.seen()), (std::vector<std::string>{
                                     "add uid=a name=ns/a-name sa=sa ips=10.0.0.1",
                                     "snapshot_sent"}));
}

TEST(ZdsServer, DoesNotTakeOverASocketAnotherAgentServes) {
  auto path = temp_socket_path();
  auto first = serve(path);
  ASSERT_TRUE(first);
  ZdsServerOptions o;
  o.socket_path = path;
  auto second = ZdsServer::listen(o);
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().message.find("another process serves ZDS"), std::string::npos)
      << second.error().message;
  FakeProxy proxy(path);
  ASSERT_TRUE(first->sync({}));
  EXPECT_TRUE(first->connected()) << "the first agent still has its socket";

  // A socket file whose owner is gone (a crashed agent) is replaced.
  auto stale = temp_socket_path();
  {
    maps::UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, stale.c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  o.socket_path = stale;
  auto replaced = ZdsServer::listen(o);
  EXPECT_TRUE(replaced) << replaced.error().message;
}

}  // namespace
}  // namespace sockmesh::agent
