// What the inbound side reads from a CONNECT request once HTTP/2 has decoded it (proxy/inbound.cc):
// the :authority as the target "ip:port" (Endpoint::parse) and the client named in a Forwarded
// header (forwarded_for). Input: the :authority, a newline, the Forwarded value. Addresses parsed
// from the authority print back to text that parses to the same value.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/ip_address.h"
#include "fuzz_util.h"
#include "h2/connection.h"
#include "proxy/forwarded.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  sockmesh::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sockmesh;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto nl = in.find('\n');
  h2::Request req;
  req.method = "CONNECT";
  req.authority = std::string(in.substr(0, nl));
  if (nl != std::string_view::npos)
    req.headers.push_back({"forwarded", std::string(in.substr(nl + 1))});

  if (auto target = Endpoint::parse(req.authority)) {
    auto again = Endpoint::parse(target->to_string());
    FUZZ_CHECK(again && *again == *target);
  }
  if (auto ip = IpAddress::parse(req.authority)) {
    auto again = IpAddress::parse(ip->to_string());
    FUZZ_CHECK(again && *again == *ip);
  }
  if (auto net = IpNetwork::parse(req.authority)) {
    auto again = IpNetwork::parse(net->to_string());
    FUZZ_CHECK(again && *again == *net);
    FUZZ_CHECK(net->contains(net->base));
  }
  std::string fwd = proxy::forwarded_for(req);
  if (const std::string* header = req.header("forwarded")) {
    FUZZ_CHECK(fwd.size() <= header->size());
  } else {
    FUZZ_CHECK(fwd.empty());
  }
  return 0;
}
