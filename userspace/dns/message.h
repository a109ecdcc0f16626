#pragma once
// DNS wire format (RFC 1035) for what the DNS proxy needs: reading a query's header and single
// question, and building the replies it answers itself. Every read is bounds-checked; malformed
// input yields an Error that says what was wrong, never undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "base/result.h"

namespace sockmesh::dns {

inline constexpr size_t kHeaderSize = 12;
inline constexpr size_t kMaxNameLength = 255;  // wire octets, RFC 1035 2.3.4
inline constexpr size_t kMaxLabelLength = 63;
inline constexpr size_t kMaxMessageSize = 65535;  // a TCP frame's 16-bit length

inline constexpr uint16_t kTypeA = 1;
inline constexpr uint16_t kTypeAAAA = 28;
inline constexpr uint16_t kClassIn = 1;

enum class Rcode : uint8_t {
  kNoError = 0,
  kFormErr = 1,
  kServFail = 2,
  kNxDomain = 3,
  kNotImp = 4,
  kRefused = 5,
};

struct Header {
  uint16_t id = 0;
  uint16_t flags = 0;
  uint16_t qdcount = 0, ancount = 0, nscount = 0, arcount = 0;

  bool qr() const { return (flags & 0x8000) != 0; }
  uint8_t opcode() const { return (flags >> 11) & 0xF; }
  bool tc() const { return (flags & 0x0200) != 0; }
  bool rd() const { return (flags & 0x0100) != 0; }
  Rcode rcode() const { return static_cast<Rcode>(flags & 0xF); }
};

struct Question {
  std::string name;  // lower case, no trailing dot; "" is the root
  uint16_t type = 0;
  uint16_t klass = 0;
};

struct Query {
  Header header;
  Question question;
};

Result<Header> parse_header(std::span<const uint8_t> msg);

// Reads a (possibly compressed) name starting at `*offset` and advances `*offset` past it in the
// original position. Pointers must point strictly backwards (so no loop is possible) and the
// expanded name may not exceed 255 octets.
Result<std::string> read_name(std::span<const uint8_t> msg, size_t* offset);

// A standard query (QR=0, OPCODE 0) with exactly one question. Records after the question
// (EDNS OPT in the additional section) are not parsed.
Result<Query> parse_query(std::span<const uint8_t> msg);

// Appends `name` in uncompressed wire form; fails for a label over 63 octets or a name over 255.
Status append_name(std::vector<uint8_t>* out, std::string_view name);

// A reply that echoes the query's id, RD bit and question, with `answers` as A or AAAA records
// (addresses whose family does not match the question's type are skipped).
std::vector<uint8_t> build_answer(const Query& query, const std::vector<IpAddress>& answers,
                                  uint32_t ttl_seconds);

// An error reply (FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, ...). `question` may be null when the
// query could not be parsed that far; then QDCOUNT is 0.
std::vector<uint8_t> build_error(uint16_t id, uint16_t query_flags, const Question* question,
                                 Rcode rcode);

std::string_view type_name(uint16_t type);  // "a", "aaaa", ... as ztunnel's metrics label them
std::string_view rcode_name(Rcode rcode);

}  // namespace sockmesh::dns
