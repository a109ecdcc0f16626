// The local config file (ztunnel's LocalConfig YAML): parse_local_config on arbitrary text. Bad
// input is a ConfigError, never an exception or a crash; an error names a position in the text.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/local_config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  sockmesh::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto result = sockmesh::config::parse_local_config(text, "fuzz.yaml");
  if (const auto* error = sockmesh::config::error_of(result)) {
    FUZZ_CHECK(!error->message.empty());
    FUZZ_CHECK(error->line >= 0 && error->column >= 0);
    (void)error->to_string();
  } else {
    FUZZ_CHECK(sockmesh::config::snapshot_of(result) != nullptr);
  }
  return 0;
}
