#include "loader/agent/files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/stat.h>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/fifo.h"

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

// A FIFO planted where the agent reads a file (its pod records, say) must not hang the agent.
TEST(AgentFiles, ReadFileRefusesAFifoAtOnce) {
  fs::path dir = fs::temp_directory_path() / ("sockmesh-agent-fifo-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string fifo = (dir / "agent-pods.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = ::sockmesh::testing::read_of_fifo(fifo, [&] { return read_file(fifo); });
  fs::remove_all(dir);
  ASSERT_TRUE(r.has_value()) << "reading a FIFO blocked for 3 s";
  ASSERT_FALSE(*r);
  EXPECT_EQ(r->error().code, EINVAL);
  EXPECT_NE(r->error().message.find("not a regular file"), std::string::npos) << r->error().message;
  EXPECT_NE(r->error().message.find("agent-pods.json"), std::string::npos) << r->error().message;
}

}  // namespace
}  // namespace sockmesh::agent
