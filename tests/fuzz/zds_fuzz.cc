// ZDS messages (loader/agent/zds_protocol): the proxy decodes WorkloadRequests from the node
// agent, the agent decodes ZdsHello and Ack from the proxy. The first byte picks the decoder.
// Whatever decodes is described (as the proxy logs it) and encoded again, and the encoding is a
// fixed point: encode(decode(encode(m))) == encode(m).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "loader/agent/zds_protocol.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  sockmesh::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace zds = sockmesh::zds;
  if (size == 0) return 0;
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string error;
  switch (data[0] % 3) {
    case 0: {
      auto request = zds::decode_request(bytes, &error);
      if (!request) {
        FUZZ_CHECK(!error.empty());
        // The proxy answers a bad request with a nack that carries the decoder's message.
        auto nack = zds::decode_ack(zds::encode(zds::Ack{error}), &error);
        FUZZ_CHECK(nack.has_value());
        break;
      }
      (void)zds::describe(*request);
      std::string once = zds::encode(*request);
      auto again = zds::decode_request(once, &error);
      FUZZ_CHECK(again.has_value());
      FUZZ_CHECK(zds::encode(*again) == once);
      FUZZ_CHECK(zds::describe(*again) == zds::describe(*request));
      break;
    }
    case 1: {
      auto hello = zds::decode_hello(bytes, &error);
      if (!hello) {
        FUZZ_CHECK(!error.empty());
        break;
      }
      auto again = zds::decode_hello(zds::encode(*hello), &error);
      FUZZ_CHECK(again && again->version == hello->version);
      break;
    }
    default: {
      auto ack = zds::decode_ack(bytes, &error);
      if (!ack) {
        FUZZ_CHECK(!error.empty());
        break;
      }
      auto again = zds::decode_ack(zds::encode(*ack), &error);
      FUZZ_CHECK(again && again->error == ack->error);
      break;
    }
  }
  return 0;
}
