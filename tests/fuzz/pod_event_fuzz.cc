// The plugin <-> agent messages (cni/event): what the node agent decodes from a plugin's packet
// (PodEvent), what the plugin decodes from the agent (AgentReply) and from the hints file
// (NamespaceHints). The first byte picks the decoder; whatever decodes must encode and decode back
// to itself.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cni/event/pod_event.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  sockmesh::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sockmesh::cni;
  if (size == 0) return 0;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string error;
  switch (data[0] % 3) {
    case 0:
      if (auto e = decode_pod_event(text, &error)) {
        auto back = decode_pod_event(encode(*e), &error);
        FUZZ_CHECK(back && *back == *e);
      } else {
        FUZZ_CHECK(!error.empty());
      }
      break;
    case 1:
      if (auto r = decode_agent_reply(text, &error)) {
        auto back = decode_agent_reply(encode(*r), &error);
        FUZZ_CHECK(back && *back == *r);
      } else {
        FUZZ_CHECK(!error.empty());
      }
      break;
    default:
      if (auto h = decode_namespace_hints(text, &error)) {
        auto back = decode_namespace_hints(encode(*h), &error);
        FUZZ_CHECK(back && *back == *h);
      } else {
        FUZZ_CHECK(!error.empty());
      }
      break;
  }
  return 0;
}
