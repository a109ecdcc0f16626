// istiod's xDS resources: bytes parsed as an istio.workload.Address, an
// istio.security.Authorization or a whole DeltaDiscoveryResponse (the first byte picks which),
// then converted into the state model. Bad input is a ConvertError naming the resource, never a
// crash; a refused response leaves the held resources as they were.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "xds/convert.h"
#include "xds/resources.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  sockmesh::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t kind = data[0] % 3;
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  using namespace sockmesh::xds;
  if (kind == 0) {
    istio::workload::Address address;
    if (!address.ParseFromString(bytes)) return 0;
    auto r = convert_address("fuzz", address);
    if (!r) FUZZ_CHECK(!r.error().message.empty() && r.error().resource == "fuzz");
  } else if (kind == 1) {
    istio::security::Authorization authorization;
    if (!authorization.ParseFromString(bytes)) return 0;
    auto r = convert_authorization("fuzz", authorization);
    if (!r) FUZZ_CHECK(!r.error().message.empty() && r.error().resource == "fuzz");
  } else {
    envoy::service::discovery::v3::DeltaDiscoveryResponse response;
    if (!response.ParseFromString(bytes)) return 0;
    XdsResources resources;
    // Twice: the second time over a set that may already hold what the first added.
    for (int i = 0; i < 2; ++i) {
      size_t before =
          resources.workload_count() + resources.service_count() + resources.policy_count();
      auto r = resources.apply(response);
      size_t after =
          resources.workload_count() + resources.service_count() + resources.policy_count();
      if (!r) {
        FUZZ_CHECK(!r.error().message.empty());
        FUZZ_CHECK(before == after);
      }
      FUZZ_CHECK(resources.snapshot() != nullptr);
    }
  }
  return 0;
}
