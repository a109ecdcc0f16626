// cgroup v2 discovery from /proc/mounts on unified and hybrid layouts (no root needed).
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "loader/attach/bpffs.h"

namespace sockmesh::loader {
namespace {

class MountsFile {
 public:
  explicit MountsFile(const std::string& text) {
    char name[] = "/tmp/sockmesh-mounts-XXXXXX";
    int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    close(fd);
    path_ = name;
    std::ofstream(path_) << text;
  }
  ~MountsFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Cgroup2, FoundOnAUnifiedLayout) {
  MountsFile mounts(
      "sysfs /sys sysfs rw,nosuid 0 0\n"
      "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec 0 0\n"
      "bpf /sys/fs/bpf bpf rw 0 0\n");
  auto found = find_cgroup2_mount(mounts.path());
  ASSERT_TRUE(found) << found.error().message;
  EXPECT_EQ(*found, "/sys/fs/cgroup");
}

TEST(Cgroup2, FoundOnAHybridLayout) {
  MountsFile mounts(
      "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
      "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
      "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
      "cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n");
  auto found = find_cgroup2_mount(mounts.path());
  ASSERT_TRUE(found) << found.error().message;
  EXPECT_EQ(*found, "/sys/fs/cgroup/unified");
}

TEST(Cgroup2, MissingIsAClearError) {
  MountsFile mounts("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n");
  auto found = find_cgroup2_mount(mounts.path());
  ASSERT_FALSE(found);
  EXPECT_NE(found.error().message.find("no cgroup2 mount"), std::string::npos);
  EXPECT_FALSE(find_cgroup2_mount("/nonexistent/mounts"));
}

TEST(Mounts, OctalEscapesAreUndone) {
  auto entries = parse_mounts("none /mnt/with\\040space cgroup2 rw 0 0\nshort line\n");
  ASSERT_EQ(entries.size(), 1u) << "a line without three fields is skipped";
  EXPECT_EQ(entries[0].mount_point, "/mnt/with space");
  EXPECT_EQ(entries[0].fs_type, "cgroup2");
}

}  // namespace
}  // namespace sockmesh::loader
