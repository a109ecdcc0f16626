#include "loader/agent/files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace sockmesh::agent {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::stringstream s;
  s << std::ifstream(p).rdbuf();
  return s.str();
}

// The agent writes pod records (0600) as root; a link planted at the temporary name it writes
// through must neither redirect that write to another file nor make the write fail.
TEST(AgentFiles, WriteFileAtomicNeverFollowsAPlantedTemporaryName) {
  fs::path dir = fs::temp_directory_path() / ("sockmesh-agent-tmp-" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::path victim = dir / "victim";
  std::ofstream(victim) << "keep me";
  fs::path target = dir / "pod.json";
  // The name the agent used to pick: <path>.tmp.<pid>
  fs::create_symlink(victim, target.string() + ".tmp." + std::to_string(getpid()));
  auto st = write_file_atomic(target.string(), "{\"secret\":1}\n", 0600);
  EXPECT_TRUE(st) << (st ? "" : st.error().message);
  EXPECT_EQ(slurp(victim), "keep me");
  EXPECT_EQ(slurp(target), "{\"secret\":1}\n");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(target)));
  EXPECT_EQ(fs::status(target).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sockmesh::agent
