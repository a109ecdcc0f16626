// ZdsClient against a fake proxy speaking ZDS on a SOCK_SEQPACKET socket: nothing is sent before
// the first sync(), each call waits for its ack, nacks come back as errors, and a restarted proxy
// gets the whole snapshot replayed. Unprivileged: the "pods" all live in the test's own netns.
#include "loader/agent/zds_client.h"

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

namespace sockmesh::agent {
namespace {

using namespace std::chrono_literals;

// What the fake proxy received: each request in order, and whether a netns came with it.
struct Seen {
  std::string what;  // zds::describe()
  bool had_netns = false;
};

class FakeProxy {
 public:
  explicit FakeProxy(std::string path) : path_(std::move(path)) { start(); }
  ~FakeProxy() { stop(); }

  void start() {
    unlink(path_.c_str());
    listener_.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(listen(listener_.get(), 4), 0);
    wake_.reset(eventfd(0, EFD_CLOEXEC));
    thread_ = std::thread([this] { run(); });
  }

  // Like a proxy that exits: the listening socket and the connection go.
  void stop() {
    if (!thread_.joinable()) return;
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof one);
    thread_.join();
    listener_.reset();
    unlink(path_.c_str());
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
  void run() {
    maps::UniqueFd conn;
    while (true) {
      pollfd p[3] = {
          {wake_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}, {conn.get(), POLLIN, 0}};
      if (poll(p, conn ? 3 : 2, -1) < 0) return;
      if (p[0].revents) return;
      if (p[1].revents) {
        conn.reset(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        ++connections_;
        EXPECT_FALSE(zds::send_packet(conn.get(), zds::encode(zds::Hello{})));
        continue;
      }
      if (conn && p[2].revents) {
        auto got = zds::receive_packet(conn.get(), 0);
        if (got.status == zds::ReceiveStatus::kClosed) {
          conn.reset();
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
  }

  std::string path_;
  maps::UniqueFd listener_;
  maps::UniqueFd wake_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Seen> seen_;
  std::set<std::string> refused_;
  std::atomic<int> connections_{0};
};

std::string temp_socket_path() {
  static std::atomic<int> n{0};
  return "/tmp/sm-zds-client-test-" + std::to_string(getpid()) + "-" + std::to_string(n++) +
         ".sock";
}

PodWorkload pod(const std::string& uid, const std::string& ip) {
  return PodWorkload{uid, uid + "-name", "ns", "sa", {*IpAddress::parse(ip)}, "/proc/self/ns/net"};
}

std::vector<std::string> whats(const std::vector<Seen>& seen) {
  std::vector<std::string> out;
  for (const auto& s : seen) out.push_back(s.what);
  return out;
}

ZdsClientOptions options(const std::string& path) {
  ZdsClientOptions o;
  o.socket_path = path;
  o.ack_timeout = 2000ms;
  o.retry_min = 10ms;
  o.retry_max = 50ms;
  return o;
}

TEST(ZdsClient, SendsNothingBeforeTheFirstSync) {
  auto path = temp_socket_path();
  FakeProxy proxy(path);
  ZdsClient client(options(path));
  auto s = client.add(pod("a", "10.0.0.1"));
  EXPECT_FALSE(s);
  EXPECT_NE(s.error().message.find("sync() has not been called"), std::string::npos);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(proxy.connections(), 0) << "a partial snapshot would close other pods' listeners";
  EXPECT_FALSE(client.connected());
}

TEST(ZdsClient, SyncAddRemoveEachWaitForTheirAck) {
  auto path = temp_socket_path();
  FakeProxy proxy(path);
  ZdsClient client(options(path));
  ASSERT_TRUE(client.sync({pod("a", "10.0.0.1")}));
  ASSERT_TRUE(client.add(pod("b", "fd00::2")));
  ASSERT_TRUE(client.remove("a"));
  auto seen = proxy.seen();
  EXPECT_EQ(whats(seen), (std::vector<std::string>{
                             "add uid=a name=ns/a-name sa=sa ips=10.0.0.1", "snapshot_sent",
                             "add uid=b name=ns/b-name sa=sa ips=fd00::2", "del uid=a"}));
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_TRUE(seen[0].had_netns);
  EXPECT_FALSE(seen[1].had_netns);
  EXPECT_TRUE(seen[2].had_netns);
  EXPECT_FALSE(seen[3].had_netns);
  EXPECT_EQ(client.sessions(), 1u);
}

TEST(ZdsClient, ReportsNacksAndUnopenableNetns) {
  auto path = temp_socket_path();
  FakeProxy proxy(path);
  proxy.refuse("bad");
  ZdsClient client(options(path));
  ASSERT_TRUE(client.sync({}));
  auto s = client.add(pod("bad", "10.0.0.9"));
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("refused by the test"), std::string::npos) << s.error().message;
  PodWorkload gone = pod("gone", "10.0.0.8");
  gone.netns_path = "/proc/self/ns/does-not-exist";
  s = client.add(gone);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("does-not-exist"), std::string::npos) << s.error().message;
  EXPECT_TRUE(client.connected()) << "a nack does not end the session";

  // In a snapshot, a pod whose netns cannot be opened is kept rather than dropped.
  proxy.clear();
  s = client.sync({pod("a", "10.0.0.1"), gone});
  EXPECT_FALSE(s);
  EXPECT_EQ(whats(proxy.seen()),
            (std::vector<std::string>{"add uid=a name=ns/a-name sa=sa ips=10.0.0.1",
                                      "keep uid=gone", "snapshot_sent"}));
}

TEST(ZdsClient, ReplaysTheSnapshotWhenTheProxyRestarts) {
  auto path = temp_socket_path();
  auto proxy = std::make_unique<FakeProxy>(path);
  ZdsClient client(options(path));
  ASSERT_TRUE(client.sync({pod("a", "10.0.0.1")}));
  ASSERT_TRUE(client.add(pod("b", "10.0.0.2")));

  proxy.reset();  // the proxy exits
  ASSERT_TRUE(client.add(pod("c", "10.0.0.3")).error().message.find("remembered") !=
              std::string::npos);
  ASSERT_TRUE(client.remove("b")) << "removing while the proxy is away only forgets";

  proxy = std::make_unique<FakeProxy>(path);  // and comes back
  ASSERT_TRUE(client.wait_connected(5s, 2)) << "the client reconnects on its own";
  EXPECT_EQ(
      whats(proxy->seen()),
      (std::vector<std::string>{"add uid=a name=ns/a-name sa=sa ips=10.0.0.1",
                                "add uid=c name=ns/c-name sa=sa ips=10.0.0.3", "snapshot_sent"}));

  // A proxy restart between two calls is noticed by the next call (or the background thread),
  // which replays; the call succeeds either way.
  proxy.reset();
  proxy = std::make_unique<FakeProxy>(path);
  ASSERT_TRUE(client.add(pod("d", "10.0.0.4")));
  auto seen = whats(proxy->seen());
  EXPECT_EQ(seen.back(), "snapshot_sent") << "d arrived in the replay (or before it)";
  EXPECT_NE(std::find(seen.begin(), seen.end(), "add uid=d name=ns/d-name sa=sa ips=10.0.0.4"),
            seen.end());
}

}  // namespace
}  // namespace sockmesh::agent
