// DNS queries (userspace/dns/message): what a pod sends to port 53 reaches the proxy unfiltered.
// Whatever parses is answered (as the server would: an answer and the error replies), and each
// reply parses again with the query's id and question; whatever does not parse has a message.
// Every name in the message is also read at every offset, to reach the compression code paths.
#include <cstddef>
#include <cstdint>
#include <span>

#include "dns/message.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  sockmesh::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace dns = sockmesh::dns;
  std::span<const uint8_t> msg(data, size);
  for (size_t at = 0; at < size && at < 512; ++at) {
    size_t off = at;
    auto name = dns::read_name(msg, &off);
    if (name) {
      FUZZ_CHECK(off > at && off <= size);
      FUZZ_CHECK(name->size() <= dns::kMaxNameLength);
    } else {
      FUZZ_CHECK(!name.error().message.empty());
    }
  }
  auto q = dns::parse_query(msg);
  if (!q) {
    FUZZ_CHECK(!q.error().message.empty());
    auto formerr = dns::build_error(size >= 2 ? (data[0] << 8 | data[1]) : 0, 0, nullptr,
                                    dns::Rcode::kFormErr);
    FUZZ_CHECK(formerr.size() == dns::kHeaderSize);
    return 0;
  }
  auto ip4 = *sockmesh::IpAddress::parse("10.96.0.10");
  auto ip6 = *sockmesh::IpAddress::parse("fd00::10");
  std::vector<std::vector<uint8_t>> replies{
      dns::build_answer(*q, {ip4, ip6}, 30),
      dns::build_error(q->header.id, q->header.flags, &q->question, dns::Rcode::kNxDomain),
      dns::build_error(q->header.id, q->header.flags, &q->question, dns::Rcode::kServFail)};
  for (const auto& r : replies) {
    auto h = dns::parse_header(r);
    FUZZ_CHECK(h.ok());
    FUZZ_CHECK(h->id == q->header.id && h->qr());
    size_t off = dns::kHeaderSize;
    auto n = dns::read_name(r, &off);
    FUZZ_CHECK(n.ok() && *n == q->question.name);
  }
  return 0;
}
