#include "base/version.h"

#include <cstdio>
#include <cstring>

#include "version_info.h"

namespace sockmesh {

const char* version() { return SM_VERSION; }
const char* commit() { return SM_COMMIT; }

bool print_version_if_asked(int argc, char** argv, const char* program) {
  if (argc != 2 || std::strcmp(argv[1], "--version") != 0) return false;
  std::printf("%s %s (commit %s)\n", program, version(), commit());
  return true;
}

}  // namespace sockmesh
