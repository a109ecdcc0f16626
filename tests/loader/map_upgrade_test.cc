// An install over pins an older build made with other map sizes (loader/attach/map_upgrade.h):
// a hash or array map whose max_entries changed is replaced and keeps its entries, and the
// programs use the new map; a socket map that changed is refused with what to do, and nothing
// moves; an upgrade that stopped halfway is taken up by the next install.
#include <bpf/bpf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "loader/attach/map_upgrade.h"
#include "loader/attach/node.h"
#include "loader/attach/skeleton.h"
#include "lookup.skel.h"
#include "sockmesh/consts.h"
#include "testing/privileged.h"
#include "testing/system.h"

namespace sockmesh {
namespace {

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new testing::PrivilegedEnvironment);

bool exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

bpf_map_info info_of(int fd) {
  bpf_map_info info{};
  uint32_t len = sizeof info;
  EXPECT_EQ(bpf_obj_get_info_by_fd(fd, &info, &len), 0) << std::strerror(errno);
  return info;
}

bpf_map_info pinned_info(const std::string& path) {
  int fd = bpf_obj_get(path.c_str());
  EXPECT_GE(fd, 0) << path << ": " << std::strerror(errno);
  if (fd < 0) return {};
  auto info = info_of(fd);
  close(fd);
  return info;
}

// A key of `size` bytes that differs from the others by its first two bytes.
std::vector<uint8_t> key_of(uint32_t size, uint16_t n) {
  std::vector<uint8_t> key(size, 0);
  key[0] = static_cast<uint8_t>(n);
  key[1] = static_cast<uint8_t>(n >> 8);
  return key;
}

// Replaces the pin at `path` with a new map like the pinned one but with `max_entries`, as an
// older build would have made it; returns its descriptor.
int pin_older_map(const std::string& path, uint32_t max_entries) {
  bpf_map_info now = pinned_info(path);
  EXPECT_EQ(unlink(path.c_str()), 0) << path;
  LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = now.map_flags);
  int fd = bpf_map_create(static_cast<bpf_map_type>(now.type), "older", now.key_size,
                          now.value_size, max_entries, &opts);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  EXPECT_EQ(bpf_obj_pin(fd, path.c_str()), 0) << std::strerror(errno);
  return fd;
}

uint32_t u32_at(int fd, const std::vector<uint8_t>& key) {
  uint32_t v = 0;
  if (bpf_map_lookup_elem(fd, key.data(), &v) != 0) return UINT32_MAX;
  return v;
}

bool program_uses_map(const std::string& prog_pin, uint32_t map_id) {
  int fd = bpf_obj_get(prog_pin.c_str());
  EXPECT_GE(fd, 0) << prog_pin;
  if (fd < 0) return false;
  uint32_t ids[64] = {};
  bpf_prog_info info{};
  info.nr_map_ids = 64;
  info.map_ids = reinterpret_cast<uint64_t>(ids);
  uint32_t len = sizeof info;
  EXPECT_EQ(bpf_obj_get_info_by_fd(fd, &info, &len), 0);
  close(fd);
  return std::find(ids, ids + std::min<uint32_t>(info.nr_map_ids, 64), map_id) !=
         ids + std::min<uint32_t>(info.nr_map_ids, 64);
}

bool has_line(const std::vector<std::string>& changes, const std::string& part) {
  return std::any_of(changes.begin(), changes.end(),
                     [&](const std::string& c) { return c.find(part) != std::string::npos; });
}

// A fresh install on a pin root of its own, into which a test puts what an older build left.
class MapUpgrade : public ::testing::Test {
 protected:
  std::string pin_of(const char* map) const { return install_.root() + "/" + map; }
  const loader::InstallOptions& options() const { return install_.options(); }
  const std::string& root() const { return install_.root(); }

  testing::TestCgroup cgroup_;
  testing::TestInstall install_{cgroup_.path()};
};

TEST_F(MapUpgrade, AHashMapOfAnotherSizeIsReplacedAndKeepsItsEntries) {
  const std::string pin = pin_of("sm_stack_flows");
  const uint32_t want = pinned_info(pin).max_entries;
  ASSERT_EQ(want, static_cast<uint32_t>(SM_MAX_STACK_FLOWS));

  int old_fd = pin_older_map(pin, 1024);
  const uint32_t old_id = info_of(old_fd).id;
  const uint32_t key_size = info_of(old_fd).key_size;
  for (uint16_t n = 1; n <= 3; ++n) {
    uint32_t v = 100 + n;
    ASSERT_EQ(bpf_map_update_elem(old_fd, key_of(key_size, n).data(), &v, BPF_ANY), 0);
  }

  auto report = loader::install(options());
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(has_line(report->changes, "replaced map sm_stack_flows"));
  EXPECT_TRUE(has_line(report->changes, "3 entries copied"));

  bpf_map_info now = pinned_info(pin);
  EXPECT_EQ(now.max_entries, want);
  EXPECT_NE(now.id, old_id);
  EXPECT_FALSE(exists(loader::replaced_pin_path(pin))) << "the old pin is removed";
  int new_fd = bpf_obj_get(pin.c_str());
  ASSERT_GE(new_fd, 0);
  for (uint16_t n = 1; n <= 3; ++n) EXPECT_EQ(u32_at(new_fd, key_of(key_size, n)), 100u + n);
  close(new_fd);
  // The bypass programs were loaded against the new map, not the old one.
  const std::string sk_msg = loader::program_pin(root(), loader::kProgSkMsg);
  EXPECT_TRUE(program_uses_map(sk_msg, now.id));
  EXPECT_FALSE(program_uses_map(sk_msg, old_id));
  close(old_fd);

  auto again = loader::install(options());
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_TRUE(again->changes.empty()) << again->changes.front();
}

TEST_F(MapUpgrade, APerCpuArrayOfAnotherSizeKeepsEveryCpusValues) {
  const std::string pin = pin_of("sm_counters");
  int old_fd = pin_older_map(pin, 8);
  int cpus = libbpf_num_possible_cpus();
  ASSERT_GT(cpus, 0);
  for (uint32_t slot = 0; slot < 8; ++slot) {
    std::vector<uint64_t> per_cpu(static_cast<size_t>(cpus));
    for (int c = 0; c < cpus; ++c) per_cpu[static_cast<size_t>(c)] = 1000 * slot + c;
    ASSERT_EQ(bpf_map_update_elem(old_fd, &slot, per_cpu.data(), BPF_ANY), 0);
  }
  close(old_fd);

  auto report = loader::install(options());
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(has_line(report->changes, "replaced map sm_counters"));
  EXPECT_EQ(pinned_info(pin).max_entries, static_cast<uint32_t>(SM_CNT_SLOTS));
  int fd = bpf_obj_get(pin.c_str());
  ASSERT_GE(fd, 0);
  for (uint32_t slot = 0; slot < 8; ++slot) {
    std::vector<uint64_t> per_cpu(static_cast<size_t>(cpus));
    ASSERT_EQ(bpf_map_lookup_elem(fd, &slot, per_cpu.data()), 0);
    for (int c = 0; c < cpus; ++c) {
      EXPECT_EQ(per_cpu[static_cast<size_t>(c)], 1000u * slot + c) << "slot " << slot;
    }
  }
  close(fd);
}

TEST_F(MapUpgrade, ASocketMapOfAnotherSizeIsRefusedAndNothingMoves) {
  const std::string pin = pin_of("sm_bypass");
  const std::string stack = pin_of("sm_stack_flows");
  // sm_counters comes before sm_bypass in the object: it is moved aside before the refusal, and
  // must be put back.
  const std::string counters = pin_of("sm_counters");
  int counters_fd = pin_older_map(counters, 8);
  const uint32_t counters_id = info_of(counters_fd).id;
  close(counters_fd);
  int old_fd = pin_older_map(pin, 1024);
  const uint32_t old_id = info_of(old_fd).id;
  const uint32_t stack_id = pinned_info(stack).id;

  auto report = loader::install(options());
  ASSERT_FALSE(report) << "the capture object holds the socket maps too: the install stops";
  const std::string& said = report.error().message;
  EXPECT_NE(said.find(pin), std::string::npos) << said;
  EXPECT_NE(said.find("max_entries 1024"), std::string::npos) << said;
  EXPECT_NE(said.find("uninstall --force"), std::string::npos) << said;
  EXPECT_EQ(pinned_info(pin).id, old_id) << "the socket map stays as it was";
  EXPECT_EQ(pinned_info(stack).id, stack_id) << "no other map was replaced";
  EXPECT_FALSE(exists(loader::replaced_pin_path(pin)));
  EXPECT_FALSE(exists(loader::replaced_pin_path(stack)));
  EXPECT_EQ(pinned_info(counters).id, counters_id) << "a map moved aside before is put back";
  EXPECT_FALSE(exists(loader::replaced_pin_path(counters)));
  close(old_fd);
}

TEST_F(MapUpgrade, ALoadThatOnlyAttachesRefusesAMapOfAnotherSizeAndAsksForAnInstall) {
  const std::string pin = pin_of("sm_stack_flows");
  int old_fd = pin_older_map(pin, 1024);
  const uint32_t old_id = info_of(old_fd).id;
  close(old_fd);
  // What enroll loads for a pod's sk_lookup: the object holds every shared map.
  auto skel = loader::BpfSkeleton<lookup_bpf>::open("lookup", root());
  ASSERT_TRUE(skel) << skel.error().message;
  auto loaded = skel->load();
  ASSERT_FALSE(loaded);
  EXPECT_NE(loaded.error().message.find("run sockmesh-loader install first"), std::string::npos)
      << loaded.error().message;
  EXPECT_EQ(pinned_info(pin).id, old_id);
  EXPECT_FALSE(exists(loader::replaced_pin_path(pin)));
  // Install then replaces it, and re-pins the programs that use it.
  auto report = loader::install(options());
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(has_line(report->changes, "replaced map sm_stack_flows"));
  EXPECT_TRUE(has_line(report->changes, "pinned program sm_sk_msg"));
}

TEST_F(MapUpgrade, AnUpgradeThatStoppedBeforeItsLoadIsDoneByTheNextInstall) {
  const std::string pin = pin_of("sm_stack_flows");
  int old_fd = pin_older_map(pin, 1024);
  const uint32_t key_size = info_of(old_fd).key_size;
  uint32_t v = 7;
  ASSERT_EQ(bpf_map_update_elem(old_fd, key_of(key_size, 9).data(), &v, BPF_ANY), 0);
  // What a run that died right after moving the pin aside leaves.
  ASSERT_EQ(rename(pin.c_str(), loader::replaced_pin_path(pin).c_str()), 0);
  close(old_fd);

  auto report = loader::install(options());
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(has_line(report->changes, "1 entries copied"));
  EXPECT_EQ(pinned_info(pin).max_entries, static_cast<uint32_t>(SM_MAX_STACK_FLOWS));
  EXPECT_FALSE(exists(loader::replaced_pin_path(pin)));
  int fd = bpf_obj_get(pin.c_str());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(u32_at(fd, key_of(key_size, 9)), 7u);
  close(fd);
}

TEST_F(MapUpgrade, AnUpgradeThatStoppedAfterItsLoadCopiesWhatIsMissingAndKeepsWhatIsNewer) {
  const std::string pin = pin_of("sm_stack_flows");
  int new_fd = bpf_obj_get(pin.c_str());
  ASSERT_GE(new_fd, 0);
  const uint32_t key_size = info_of(new_fd).key_size;
  // The old map, still aside: keys 1 and 2. The new map already has key 1, written since.
  LIBBPF_OPTS(bpf_map_create_opts, opts);
  int old_fd =
      bpf_map_create(BPF_MAP_TYPE_LRU_HASH, "older", key_size, sizeof(uint32_t), 1024, &opts);
  ASSERT_GE(old_fd, 0);
  for (uint16_t n = 1; n <= 2; ++n) {
    uint32_t v = n;
    ASSERT_EQ(bpf_map_update_elem(old_fd, key_of(key_size, n).data(), &v, BPF_ANY), 0);
  }
  ASSERT_EQ(bpf_obj_pin(old_fd, loader::replaced_pin_path(pin).c_str()), 0);
  uint32_t newer = 70;
  ASSERT_EQ(bpf_map_update_elem(new_fd, key_of(key_size, 1).data(), &newer, BPF_ANY), 0);

  auto report = loader::install(options());
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(has_line(report->changes, "1 entries copied, 1 newer kept"));
  EXPECT_EQ(u32_at(new_fd, key_of(key_size, 1)), 70u);
  EXPECT_EQ(u32_at(new_fd, key_of(key_size, 2)), 2u);
  EXPECT_FALSE(exists(loader::replaced_pin_path(pin)));
  close(old_fd);
  close(new_fd);
}

TEST(MapUpgradeUninstall, RemovesAnOldMapLeftAside) {
  testing::TestCgroup cgroup;
  loader::InstallOptions options;
  {
    testing::TestInstall install(cgroup.path());
    options = install.options();
    const std::string pin = install.root() + "/sm_stack_flows";
    int fd = bpf_obj_get(pin.c_str());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(bpf_obj_pin(fd, loader::replaced_pin_path(pin).c_str()), 0);
    close(fd);
  }  // ~TestInstall uninstalls (and fails the test if it cannot)
  EXPECT_FALSE(exists(options.pin_root));
}

}  // namespace
}  // namespace sockmesh
