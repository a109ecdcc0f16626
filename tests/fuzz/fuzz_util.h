#pragma once
// Shared by the fuzz targets: quiet logs (an operator's log line per input would be most of the
// work), and a failed property is a crash that libFuzzer keeps as a reproducer.
#include <cstdio>
#include <cstdlib>

#include "base/log.h"

namespace sockmesh::fuzz {

// SOCKMESH_FUZZ_LOG=1 keeps the proxy's log lines (to see what an input did).
inline void quiet_logs() {
  const char* keep = std::getenv("SOCKMESH_FUZZ_LOG");
  if (keep == nullptr || *keep == '\0' || *keep == '0') log::set_level(log::Level::kOff);
}

[[noreturn]] inline void property_failed(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: property failed: %s\n", file, line, what);
  std::abort();
}

}  // namespace sockmesh::fuzz

#define FUZZ_CHECK(cond) \
  ((cond) ? (void)0 : ::sockmesh::fuzz::property_failed(__FILE__, __LINE__, #cond))
