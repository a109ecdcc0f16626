#include "base/log.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

namespace sockmesh::log {
namespace {

// /logging sets levels for known scopes only; a scope the code logs under but the list lacks
// could not be tuned at run time. Every SM_<LEVEL>("scope") and kScope literal in the tree must
// be known.
TEST(LogScopes, EveryScopeTheCodeUsesIsKnown) {
  const char* src = std::getenv("SOCKMESH_SOURCE_DIR");
  if (src == nullptr) GTEST_SKIP() << "SOCKMESH_SOURCE_DIR not set (ctest sets it)";
  const std::regex use(R"(SM_(?:TRACE|DEBUG|INFO|WARN|ERROR)\("([A-Za-z0-9_.-]+)\")");
  const std::regex constant(R"(kScope\s*=\s*"([A-Za-z0-9_.-]+)\")");
  std::set<std::string> used;
  for (const char* dir : {"userspace", "loader", "cni"}) {
    for (const auto& e :
         std::filesystem::recursive_directory_iterator(std::filesystem::path(src) / dir)) {
      auto ext = e.path().extension();
      if (ext != ".cc" && ext != ".h") continue;
      std::stringstream text;
      text << std::ifstream(e.path()).rdbuf();
      const std::string s = text.str();
      for (const auto* re : {&use, &constant}) {
        for (std::sregex_iterator it(s.begin(), s.end(), *re), end; it != end; ++it) {
          used.insert((*it)[1]);
        }
      }
    }
  }
  EXPECT_GT(used.size(), 10u);
  for (const auto& scope : used) EXPECT_TRUE(is_known_scope(scope)) << scope;
}

TEST(LogScopes, UnknownScopesAreRefusedAndNotStored) {
  EXPECT_FALSE(set_level("no-such-scope", Level::kDebug));
  EXPECT_EQ(describe_levels().find("no-such-scope"), std::string::npos);
  EXPECT_TRUE(set_level("proxy", Level::kWarn));
  EXPECT_EQ(level_of("proxy"), Level::kWarn);
  set_level(Level::kInfo);
}

}  // namespace
}  // namespace sockmesh::log
