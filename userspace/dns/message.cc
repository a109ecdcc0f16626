#include "dns/message.h"

#include <array>
#include <string_view>

namespace sockmesh::dns {
namespace {

uint16_t read16(std::span<const uint8_t> m, size_t at) {
  return static_cast<uint16_t>((m[at] << 8) | m[at + 1]);
}
void put16(std::vector<uint8_t>* out, uint16_t v) {
  out->push_back(static_cast<uint8_t>(v >> 8));
  out->push_back(static_cast<uint8_t>(v & 0xFF));
}
void put32(std::vector<uint8_t>* out, uint32_t v) {
  put16(out, static_cast<uint16_t>(v >> 16));
  put16(out, static_cast<uint16_t>(v & 0xFFFF));
}

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// Reply flags: QR, the query's opcode and RD, RA, the given rcode; AA for answers we own.
uint16_t reply_flags(uint16_t query_flags, Rcode rcode, bool authoritative) {
  uint16_t f = 0x8000 | (query_flags & 0x7800) | (query_flags & 0x0100) | 0x0080;
  if (authoritative) f |= 0x0400;
  return static_cast<uint16_t>(f | static_cast<uint16_t>(rcode));
}

void put_header(std::vector<uint8_t>* out, uint16_t id, uint16_t flags, uint16_t qd, uint16_t an) {
  put16(out, id);
  put16(out, flags);
  put16(out, qd);
  put16(out, an);
  put16(out, 0);
  put16(out, 0);
}

}  // namespace

Result<Header> parse_header(std::span<const uint8_t> msg) {
  if (msg.size() < kHeaderSize) {
    return Error{"DNS message of " + std::to_string(msg.size()) +
                 " bytes is shorter than the 12-byte header"};
  }
  Header h;
  h.id = read16(msg, 0);
  h.flags = read16(msg, 2);
  h.qdcount = read16(msg, 4);
  h.ancount = read16(msg, 6);
  h.nscount = read16(msg, 8);
  h.arcount = read16(msg, 10);
  return h;
}

Result<std::string> read_name(std::span<const uint8_t> msg, size_t* offset) {
  std::string name;
  size_t pos = *offset;
  size_t wire_length = 1;  // the terminating zero octet
  bool jumped = false;
  size_t lowest_pointer_source = pos;  // every pointer must go below the previous one
  while (true) {
    if (pos >= msg.size()) {
      return Error{"DNS name runs past the end of the message at offset " + std::to_string(pos)};
    }
    uint8_t len = msg[pos];
    if ((len & 0xC0) == 0xC0) {
      if (pos + 1 >= msg.size()) return Error{"DNS name has a truncated compression pointer"};
      size_t target = ((len & 0x3F) << 8) | msg[pos + 1];
      if (target >= lowest_pointer_source) {
        return Error{"DNS name compression pointer at offset " + std::to_string(pos) +
                     " does not point backwards (a loop)"};
      }
      if (!jumped) *offset = pos + 2;
      jumped = true;
      lowest_pointer_source = target;
      pos = target;
      continue;
    }
    if ((len & 0xC0) != 0) {
      return Error{"DNS label length octet " + std::to_string(len) +
                   " is over 63 (extended label types are not supported)"};
    }
    if (len == 0) {
      if (!jumped) *offset = pos + 1;
      return name;
    }
    if (pos + 1 + len > msg.size()) return Error{"DNS label runs past the end of the message"};
    wire_length += 1 + len;
    if (wire_length > kMaxNameLength) return Error{"DNS name is longer than 255 octets"};
    if (!name.empty()) name.push_back('.');
    for (size_t i = 0; i < len; ++i) {
      const char c = static_cast<char>(msg[pos + 1 + i]);
      // A dot inside a label cannot be told apart from a label boundary in the text form that
      // names are matched in (and replies rebuilt from).
      if (c == '.') return Error{"DNS label contains a '.'"};
      name.push_back(lower(c));
    }
    pos += 1 + len;
  }
}

Result<Query> parse_query(std::span<const uint8_t> msg) {
  auto header = parse_header(msg);
  if (!header) return header.error();
  Query q{*header, {}};
  if (q.header.qr()) return Error{"DNS message is a response (QR=1), not a query"};
  if (q.header.qdcount != 1) {
    return Error{"DNS query has " + std::to_string(q.header.qdcount) +
                 " questions; exactly 1 is supported"};
  }
  size_t offset = kHeaderSize;
  auto name = read_name(msg, &offset);
  if (!name) return Error{"DNS question name: " + name.error().message};
  if (offset + 4 > msg.size()) return Error{"DNS question ends before its type and class"};
  q.question.name = std::move(*name);
  q.question.type = read16(msg, offset);
  q.question.klass = read16(msg, offset + 2);
  return q;
}

Status append_name(std::vector<uint8_t>* out, std::string_view name) {
  size_t wire_length = 1;
  while (!name.empty()) {
    size_t dot = name.find('.');
    std::string_view label = name.substr(0, dot);
    if (label.empty()) return Error{"DNS name has an empty label"};
    if (label.size() > kMaxLabelLength) return Error{"DNS label is longer than 63 octets"};
    wire_length += 1 + label.size();
    if (wire_length > kMaxNameLength) return Error{"DNS name is longer than 255 octets"};
    out->push_back(static_cast<uint8_t>(label.size()));
    out->insert(out->end(), label.begin(), label.end());
    name = dot == std::string_view::npos ? std::string_view() : name.substr(dot + 1);
  }
  out->push_back(0);
  return {};
}

std::vector<uint8_t> build_answer(const Query& query, const std::vector<IpAddress>& answers,
                                  uint32_t ttl_seconds) {
  std::vector<uint8_t> out;
  out.reserve(64 + answers.size() * 28);
  const uint16_t type = query.question.type;
  uint16_t count = 0;
  for (const auto& ip : answers) {
    if ((type == kTypeA && ip.is_v4()) || (type == kTypeAAAA && !ip.is_v4())) ++count;
  }
  put_header(&out, query.header.id, reply_flags(query.header.flags, Rcode::kNoError, true), 1,
             count);
  if (!append_name(&out, query.question.name)) {
    return build_error(query.header.id, query.header.flags, nullptr, Rcode::kFormErr);
  }
  put16(&out, query.question.type);
  put16(&out, query.question.klass);
  for (const auto& ip : answers) {
    const bool v4 = ip.is_v4();
    if (!((type == kTypeA && v4) || (type == kTypeAAAA && !v4))) continue;
    put16(&out, 0xC000 | kHeaderSize);  // the question's name
    put16(&out, type);
    put16(&out, kClassIn);
    put32(&out, ttl_seconds);
    const auto& b = ip.bytes16();
    if (v4) {
      put16(&out, 4);
      out.insert(out.end(), b.begin() + 12, b.end());
    } else {
      put16(&out, 16);
      out.insert(out.end(), b.begin(), b.end());
    }
  }
  return out;
}

std::vector<uint8_t> build_error(uint16_t id, uint16_t query_flags, const Question* question,
                                 Rcode rcode) {
  std::vector<uint8_t> out;
  std::vector<uint8_t> qbytes;
  if (question != nullptr && append_name(&qbytes, question->name)) {
    put16(&qbytes, question->type);
    put16(&qbytes, question->klass);
  } else {
    qbytes.clear();
  }
  put_header(&out, id, reply_flags(query_flags, rcode, rcode == Rcode::kNxDomain),
             qbytes.empty() ? 0 : 1, 0);
  out.insert(out.end(), qbytes.begin(), qbytes.end());
  return out;
}

std::string_view type_name(uint16_t type) {
  switch (type) {
    case 1:
      return "a";
    case 2:
      return "ns";
    case 5:
      return "cname";
    case 6:
      return "soa";
    case 12:
      return "ptr";
    case 15:
      return "mx";
    case 16:
      return "txt";
    case 28:
      return "aaaa";
    case 33:
      return "srv";
    case 65:
      return "https";
    case 255:
      return "any";
    default:
      return "other";
  }
}

std::string_view rcode_name(Rcode rcode) {
  switch (rcode) {
    case Rcode::kNoError:
      return "NOERROR";
    case Rcode::kFormErr:
      return "FORMERR";
    case Rcode::kServFail:
      return "SERVFAIL";
    case Rcode::kNxDomain:
      return "NXDOMAIN";
    case Rcode::kNotImp:
      return "NOTIMP";
    case Rcode::kRefused:
      return "REFUSED";
  }
  return "OTHER";
}

}  // namespace sockmesh::dns
