#include "config/watcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

namespace sockmesh::config {
namespace {

using namespace std::chrono_literals;

constexpr auto kInterval = 20ms;

std::string config_with(const std::string& ip, const std::string& uid = "w1") {
  return "workloads:\n- uid: " + uid + "\n  namespace: default\n  workloadIps: [\"" + ip + "\"]\n";
}

bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 5s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

std::string first_ip(const state::StateStore& store) {
  auto snap = store.get();
  if (snap->workloads().empty() || snap->workloads()[0].ips.empty()) return "";
  return snap->workloads()[0].ips[0].to_string();
}

class Watcher : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sm_watcher_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/config.yaml";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write_in_place(const std::string& text) {
    std::ofstream out(path_, std::ios::trunc);
    out << text;
  }
  // What editors and `kubectl cp`-style tools do: write a sibling file, rename it over.
  void write_by_rename(const std::string& text) {
    std::string tmp = path_ + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << text;
    }
    ASSERT_EQ(std::rename(tmp.c_str(), path_.c_str()), 0);
  }

  std::string dir_;
  std::string path_;
  state::StateStore store_;
};

TEST_F(Watcher, ReloadAppliesTheFileNow) {
  write_in_place(config_with("127.0.10.1"));
  ConfigWatcher w(path_, &store_, kInterval);
  EXPECT_EQ(w.reload(), std::nullopt);
  EXPECT_EQ(first_ip(store_), "127.0.10.1");
  EXPECT_EQ(w.applied_count(), 1u);
}

TEST_F(Watcher, ReloadOfABadFileKeepsTheStoreUntouched) {
  write_in_place("workloads:\n- uid: a\n  namespace: d\n  workloadIps: [nope]\n");
  ConfigWatcher w(path_, &store_, kInterval);
  state::SnapshotPtr before = store_.get();
  auto err = w.reload();
  ASSERT_TRUE(err);
  EXPECT_EQ(err->file, path_);
  EXPECT_EQ(err->line, 4);
  EXPECT_EQ(err->field, "workloads[0].workloadIps[0]");
  EXPECT_EQ(store_.get(), before);
  EXPECT_EQ(w.applied_count(), 0u);
  EXPECT_EQ(w.last_error()->field, "workloads[0].workloadIps[0]");
}

TEST_F(Watcher, ReloadOfAMissingFileIsAnError) {
  ConfigWatcher w(path_, &store_, kInterval);
  auto err = w.reload();
  ASSERT_TRUE(err);
  EXPECT_NE(err->message.find("No such file"), std::string::npos);
  EXPECT_EQ(w.applied_count(), 0u);
}

TEST_F(Watcher, PicksUpChangesWrittenInPlaceAndByRename) {
  write_in_place(config_with("127.0.10.1"));
  ConfigWatcher w(path_, &store_, kInterval);
  ASSERT_EQ(w.reload(), std::nullopt);
  std::atomic<int> notified{0};
  store_.subscribe([&](const state::SnapshotPtr& prev, const state::SnapshotPtr& cur) {
    EXPECT_NE(prev, cur);
    ++notified;
  });
  w.start();

  write_in_place(config_with("127.0.10.2"));
  ASSERT_TRUE(eventually([&] { return first_ip(store_) == "127.0.10.2"; }));
  EXPECT_EQ(w.applied_count(), 2u);

  write_by_rename(config_with("127.0.10.3"));
  ASSERT_TRUE(eventually([&] { return first_ip(store_) == "127.0.10.3"; }));
  EXPECT_EQ(w.applied_count(), 3u);
  EXPECT_EQ(notified.load(), 2);
  EXPECT_EQ(w.last_error(), std::nullopt);
}

TEST_F(Watcher, UnchangedContentIsNotReapplied) {
  write_in_place(config_with("127.0.10.1"));
  ConfigWatcher w(path_, &store_, kInterval);
  ASSERT_EQ(w.reload(), std::nullopt);
  state::SnapshotPtr applied = store_.get();
  w.start();
  // Same bytes, new inode and mtime: nothing to do.
  write_by_rename(config_with("127.0.10.1"));
  std::this_thread::sleep_for(kInterval * 10);
  EXPECT_EQ(store_.get(), applied);
  EXPECT_EQ(w.applied_count(), 1u);
}

TEST_F(Watcher, IgnoresABrokenFileAndKeepsTheOldSnapshot) {
  write_in_place(config_with("127.0.10.1"));
  ConfigWatcher w(path_, &store_, kInterval);
  ASSERT_EQ(w.reload(), std::nullopt);
  state::SnapshotPtr good = store_.get();
  w.start();

  write_by_rename(config_with("127.0.10.1") + "  protocol: QUIC\n");
  ASSERT_TRUE(eventually([&] { return w.last_error().has_value(); }));
  ConfigError e = *w.last_error();
  EXPECT_EQ(e.file, path_);
  EXPECT_EQ(e.line, 5);
  EXPECT_EQ(e.field, "workloads[0].protocol");
  // Give the poller several more rounds to do something wrong.
  std::this_thread::sleep_for(kInterval * 10);
  EXPECT_EQ(store_.get(), good);
  EXPECT_EQ(w.applied_count(), 1u);

  // Fixing the file applies it and clears the error.
  write_by_rename(config_with("127.0.10.4"));
  ASSERT_TRUE(eventually([&] { return first_ip(store_) == "127.0.10.4"; }));
  EXPECT_EQ(w.last_error(), std::nullopt);
  EXPECT_EQ(w.applied_count(), 2u);
}

TEST_F(Watcher, SurvivesTheFileVanishingAndComingBack) {
  write_in_place(config_with("127.0.10.1"));
  ConfigWatcher w(path_, &store_, kInterval);
  ASSERT_EQ(w.reload(), std::nullopt);
  state::SnapshotPtr good = store_.get();
  w.start();

  ASSERT_EQ(std::remove(path_.c_str()), 0);
  std::this_thread::sleep_for(kInterval * 10);
  EXPECT_EQ(store_.get(), good);
  EXPECT_EQ(w.applied_count(), 1u);

  // Back with the same content: still nothing to apply.
  write_in_place(config_with("127.0.10.1"));
  std::this_thread::sleep_for(kInterval * 10);
  EXPECT_EQ(store_.get(), good);

  ASSERT_EQ(std::remove(path_.c_str()), 0);
  std::this_thread::sleep_for(kInterval * 5);
  write_in_place(config_with("127.0.10.5"));
  ASSERT_TRUE(eventually([&] { return first_ip(store_) == "127.0.10.5"; }));
  EXPECT_EQ(w.applied_count(), 2u);
}

TEST_F(Watcher, StartsWithoutAnInitialReload) {
  write_in_place(config_with("127.0.10.6"));
  ConfigWatcher w(path_, &store_, kInterval);
  w.start();
  ASSERT_TRUE(eventually([&] { return first_ip(store_) == "127.0.10.6"; }));
}

TEST_F(Watcher, StopIsPromptAndIdempotent) {
  write_in_place(config_with("127.0.10.1"));
  // A long interval: stop() must not wait for it to elapse.
  ConfigWatcher w(path_, &store_, std::chrono::milliseconds(60'000));
  w.start();
  w.start();
  auto t0 = std::chrono::steady_clock::now();
  w.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  w.stop();
  // Nothing is applied after stop().
  write_in_place(config_with("127.0.10.2"));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(w.applied_count(), 0u);
}

}  // namespace
}  // namespace sockmesh::config
