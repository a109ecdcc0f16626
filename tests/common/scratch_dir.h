#pragma once
// One private directory per test process under the temporary directory, removed with everything
// in it when the process exits. For files a test cannot name once and delete itself: a listener's
// socket and the lock file that the listener leaves beside it on purpose.
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace sockmesh::testing {

// `prefix` names the directory ("<tmp>/<prefix>-XXXXXX"); the first call creates it.
inline const std::string& scratch_dir(const std::string& prefix) {
  struct Dir {
    std::string path;
    explicit Dir(const std::string& prefix) {
      std::string templ = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
      if (mkdtemp(templ.data()) != nullptr) path = templ;
    }
    ~Dir() {
      std::error_code ignored;
      if (!path.empty()) std::filesystem::remove_all(path, ignored);
    }
  };
  static const Dir dir(prefix);
  return dir.path;
}

}  // namespace sockmesh::testing
