#pragma once
// Privileged tests (LABEL privileged) need root: BPF, network namespaces, transparent sockets.
// Where they cannot run they say so loudly and exit 77, which ctest reports as skipped (and
// scripts/test fails under CI=true).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace sockmesh::testing {

[[noreturn]] inline void skip_privileged(const std::string& why) {
  std::fprintf(stderr,
               "\n"
               "**********************************************************************\n"
               "*** SKIPPED: this privileged test cannot run here.\n"
               "*** %s\n"
               "*** Run it as root (sudo ctest -L privileged) on a kernel >= 5.8.\n"
               "**********************************************************************\n\n",
               why.c_str());
  std::fflush(stderr);
  std::exit(77);
}

inline void require_root() {
  if (geteuid() != 0) skip_privileged("not root (euid " + std::to_string(geteuid()) + ")");
}

}  // namespace sockmesh::testing
