#include "loader/agent/zds_protocol.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstring>

namespace sockmesh::zds {
namespace {

// Protobuf wire types.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

// Field numbers, as in zds.proto.
constexpr uint32_t kHelloVersion = 1;
constexpr uint32_t kInfoName = 1;
constexpr uint32_t kInfoNamespace = 2;
constexpr uint32_t kInfoServiceAccount = 3;
constexpr uint32_t kAddUid = 1;
constexpr uint32_t kAddInfo = 2;
constexpr uint32_t kAddSockmeshIps = 1000;  // sockmesh extension
constexpr uint32_t kKeepUid = 1;
constexpr uint32_t kDelUid = 2;
constexpr uint32_t kRequestAdd = 1;
constexpr uint32_t kRequestDel = 2;
constexpr uint32_t kRequestSnapshotSent = 3;
constexpr uint32_t kRequestKeep = 5;
constexpr uint32_t kAckError = 1;
constexpr uint32_t kResponseAck = 1;

// ---- encoding ----

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (uint64_t{field} << 3) | wire_type);
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// proto3 leaves fields at their default value (empty) off the wire.
void put_string(std::string& out, uint32_t field, std::string_view s) {
  if (!s.empty()) put_bytes(out, field, s);
}

std::string ip_bytes(const IpAddress& ip) {
  const auto& b = ip.bytes16();
  if (ip.is_v4()) return std::string(reinterpret_cast<const char*>(b.data()) + 12, 4);
  return std::string(reinterpret_cast<const char*>(b.data()), 16);
}

std::string encode_info(const WorkloadInfo& info) {
  std::string out;
  put_string(out, kInfoName, info.name);
  put_string(out, kInfoNamespace, info.namespace_name);
  put_string(out, kInfoServiceAccount, info.service_account);
  return out;
}

std::string encode_add(const AddWorkload& add) {
  std::string out;
  put_string(out, kAddUid, add.uid);
  put_bytes(out, kAddInfo, encode_info(add.info));  // workload_info is required by ztunnel
  for (const auto& ip : add.ips) put_bytes(out, kAddSockmeshIps, ip_bytes(ip));
  return out;
}

// ---- decoding ----

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool done() const { return pos_ >= in_.size(); }

  bool varint(uint64_t* v) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= in_.size()) return false;
      auto byte = static_cast<uint8_t>(in_[pos_++]);
      result |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) {
        *v = result;
        return true;
      }
    }
    return false;  // more than 10 bytes
  }

  bool bytes(std::string_view* out) {
    uint64_t len = 0;
    if (!varint(&len) || len > in_.size() - pos_) return false;
    *out = in_.substr(pos_, len);
    pos_ += len;
    return true;
  }

  bool skip(uint32_t wire_type) {
    uint64_t ignored = 0;
    std::string_view ignored_bytes;
    switch (wire_type) {
      case kVarint:
        return varint(&ignored);
      case kFixed64:
        return advance(8);
      case kLengthDelimited:
        return bytes(&ignored_bytes);
      case kFixed32:
        return advance(4);
      default:
        return false;  // groups (3, 4) are not used by any proto3 message
    }
  }

 private:
  bool advance(size_t n) {
    if (n > in_.size() - pos_) return false;
    pos_ += n;
    return true;
  }
  std::string_view in_;
  size_t pos_ = 0;
};

// Calls on_field(field, wire_type, reader) for each field; on_field consumes the value (or
// returns false to have it skipped, as an unknown field). Returns an error message or "".
template <typename OnField>
std::string for_each_field(std::string_view bytes, const char* message, OnField on_field) {
  Reader r(bytes);
  while (!r.done()) {
    uint64_t tag = 0;
    if (!r.varint(&tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff) {
      return std::string("malformed tag in ") + message;
    }
    auto field = static_cast<uint32_t>(tag >> 3);
    auto wire_type = static_cast<uint32_t>(tag & 7);
    std::string err;
    bool consumed = on_field(field, wire_type, r, &err);
    if (!err.empty()) return std::string(message) + ": " + err;
    if (!consumed && !r.skip(wire_type)) {
      return std::string("malformed field ") + std::to_string(field) + " in " + message;
    }
  }
  return "";
}

// A length-delimited field's bytes, or an error when the wire type is wrong or the length bad.
bool read_bytes(Reader& r, uint32_t wire_type, uint32_t field, std::string_view* out,
                std::string* err) {
  if (wire_type != kLengthDelimited) {
    *err = "field " + std::to_string(field) + " has wire type " + std::to_string(wire_type) +
           ", expected 2 (length-delimited)";
    return false;
  }
  if (!r.bytes(out)) {
    *err = "field " + std::to_string(field) + " runs past the end";
    return false;
  }
  return true;
}

bool decode_info(std::string_view bytes, WorkloadInfo* info, std::string* error) {
  *error = for_each_field(bytes, "WorkloadInfo",
                          [&](uint32_t field, uint32_t wt, Reader& r, std::string* err) {
                            std::string* target = nullptr;
                            if (field == kInfoName) target = &info->name;
                            if (field == kInfoNamespace) target = &info->namespace_name;
                            if (field == kInfoServiceAccount) target = &info->service_account;
                            if (target == nullptr) return false;
                            std::string_view v;
                            if (read_bytes(r, wt, field, &v, err)) target->assign(v);
                            return true;
                          });
  return error->empty();
}

bool decode_add(std::string_view bytes, AddWorkload* add, std::string* error) {
  *error = for_each_field(
      bytes, "AddWorkload", [&](uint32_t field, uint32_t wt, Reader& r, std::string* err) {
        if (field != kAddUid && field != kAddInfo && field != kAddSockmeshIps) return false;
        std::string_view v;
        if (!read_bytes(r, wt, field, &v, err)) return true;
        if (field == kAddUid) {
          add->uid.assign(v);
        } else if (field == kAddInfo) {
          std::string e;
          if (!decode_info(v, &add->info, &e)) *err = e;  // a repeated message field merges
        } else if (v.size() == 4) {
          uint32_t be = 0;
          std::memcpy(&be, v.data(), 4);
          add->ips.push_back(IpAddress::v4(ntohl(be)));
        } else if (v.size() == 16) {
          std::array<uint8_t, 16> b{};
          std::memcpy(b.data(), v.data(), 16);
          add->ips.push_back(IpAddress::from_bytes16(b));
        } else {
          *err = "an IP of " + std::to_string(v.size()) + " bytes (expected 4 or 16)";
        }
        return true;
      });
  return error->empty();
}

bool decode_uid(std::string_view bytes, uint32_t uid_field, const char* message, std::string* uid,
                std::string* error) {
  *error =
      for_each_field(bytes, message, [&](uint32_t field, uint32_t wt, Reader& r, std::string* err) {
        if (field != uid_field) return false;
        std::string_view v;
        if (read_bytes(r, wt, field, &v, err)) uid->assign(v);
        return true;
      });
  return error->empty();
}

}  // namespace

std::string encode(const Hello& hello) {
  std::string out;
  if (hello.version != 0) {
    put_tag(out, kHelloVersion, kVarint);
    put_varint(out, hello.version);
  }
  return out;
}

std::string encode(const Request& request) {
  std::string out;
  if (const auto* add = std::get_if<AddWorkload>(&request)) {
    put_bytes(out, kRequestAdd, encode_add(*add));
  } else if (const auto* keep = std::get_if<KeepWorkload>(&request)) {
    std::string inner;
    put_string(inner, kKeepUid, keep->uid);
    put_bytes(out, kRequestKeep, inner);
  } else if (const auto* del = std::get_if<DelWorkload>(&request)) {
    std::string inner;
    put_string(inner, kDelUid, del->uid);
    put_bytes(out, kRequestDel, inner);
  } else {
    put_bytes(out, kRequestSnapshotSent, "");
  }
  return out;
}

std::string encode(const Ack& ack) {
  std::string inner;
  put_string(inner, kAckError, ack.error);
  std::string out;
  put_bytes(out, kResponseAck, inner);
  return out;
}

std::optional<Hello> decode_hello(std::string_view bytes, std::string* error) {
  Hello hello{0};
  *error = for_each_field(bytes, "ZdsHello",
                          [&](uint32_t field, uint32_t wt, Reader& r, std::string* err) {
                            if (field != kHelloVersion) return false;
                            uint64_t v = 0;
                            if (wt != kVarint || !r.varint(&v)) {
                              *err = "malformed version";
                            } else {
                              hello.version = static_cast<uint32_t>(v);
                            }
                            return true;
                          });
  if (!error->empty()) return std::nullopt;
  return hello;
}

std::optional<Request> decode_request(std::string_view bytes, std::string* error) {
  std::optional<Request> request;
  *error = for_each_field(
      bytes, "WorkloadRequest", [&](uint32_t field, uint32_t wt, Reader& r, std::string* err) {
        if (field != kRequestAdd && field != kRequestDel && field != kRequestSnapshotSent &&
            field != kRequestKeep) {
          return false;
        }
        std::string_view v;
        if (!read_bytes(r, wt, field, &v, err)) return true;
        // The last member of a oneof on the wire wins; the same member twice merges.
        if (field == kRequestAdd) {
          AddWorkload add;
          if (request && std::holds_alternative<AddWorkload>(*request)) {
            add = std::get<AddWorkload>(*request);
          }
          if (decode_add(v, &add, err)) request = std::move(add);
        } else if (field == kRequestKeep) {
          KeepWorkload keep;
          if (decode_uid(v, kKeepUid, "KeepWorkload", &keep.uid, err)) request = std::move(keep);
        } else if (field == kRequestDel) {
          DelWorkload del;
          if (decode_uid(v, kDelUid, "DelWorkload", &del.uid, err)) request = std::move(del);
        } else {
          std::string e = for_each_field(
              v, "SnapshotSent", [](uint32_t, uint32_t, Reader&, std::string*) { return false; });
          if (e.empty()) {
            request = SnapshotSent{};
          } else {
            *err = e;
          }
        }
        return true;
      });
  if (!error->empty()) return std::nullopt;
  if (!request) {
    *error = "WorkloadRequest without a payload";
    return std::nullopt;
  }
  return request;
}

std::optional<Ack> decode_ack(std::string_view bytes, std::string* error) {
  std::optional<Ack> ack;
  *error = for_each_field(bytes, "WorkloadResponse",
                          [&](uint32_t field, uint32_t wt, Reader& r, std::string* err) {
                            if (field != kResponseAck) return false;
                            std::string_view v;
                            if (!read_bytes(r, wt, field, &v, err)) return true;
                            Ack a;
                            std::string e;
                            if (decode_uid(v, kAckError, "Ack", &a.error, &e)) {
                              ack = std::move(a);
                            } else {
                              *err = e;
                            }
                            return true;
                          });
  if (!error->empty()) return std::nullopt;
  if (!ack) {
    *error = "WorkloadResponse without an ack";
    return std::nullopt;
  }
  return ack;
}

std::string describe(const Request& request) {
  if (const auto* add = std::get_if<AddWorkload>(&request)) {
    std::string s = "add uid=" + add->uid + " name=" + add->info.namespace_name + "/" +
                    add->info.name + " sa=" + add->info.service_account + " ips=";
    for (size_t i = 0; i < add->ips.size(); ++i) {
      s += (i == 0 ? "" : ",") + add->ips[i].to_string();
    }
    return s;
  }
  if (const auto* keep = std::get_if<KeepWorkload>(&request)) return "keep uid=" + keep->uid;
  if (const auto* del = std::get_if<DelWorkload>(&request)) return "del uid=" + del->uid;
  return "snapshot_sent";
}

std::optional<std::string> socket_address(const std::string& path, sockaddr_un* out) {
  *out = sockaddr_un{};
  out->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof out->sun_path) {
    return "the ZDS socket path needs 1 to " + std::to_string(sizeof out->sun_path - 1) +
           " characters: \"" + path + "\"";
  }
  std::memcpy(out->sun_path, path.data(), path.size());
  return std::nullopt;
}

std::optional<std::string> send_packet(int socket_fd, std::string_view bytes, int attach_fd) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (attach_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &attach_fd, sizeof(int));
  }
  while (true) {
    ssize_t n = sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
    if (n >= 0) return std::nullopt;
    if (errno == EINTR) continue;
    return std::string("sendmsg: ") + std::strerror(errno);
  }
}

Received receive_packet(int socket_fd, int timeout_ms) {
  Received out;
  pollfd p{socket_fd, POLLIN, 0};
  while (true) {
    int r = poll(&p, 1, timeout_ms);
    if (r > 0) break;
    if (r == 0) {
      out.status = ReceiveStatus::kTimeout;
      return out;
    }
    if (errno != EINTR) {
      out.error = std::string("poll: ") + std::strerror(errno);
      return out;
    }
  }
  std::string buf(kMaxMessageBytes, '\0');
  iovec iov{buf.data(), buf.size()};
  // Room for a few descriptors, so that a peer sending too many is caught rather than truncated.
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN) {
      out.status = ReceiveStatus::kTimeout;  // woken without data; the caller asks again
      return out;
    }
    if (errno == ECONNRESET) {
      out.status = ReceiveStatus::kClosed;
      return out;
    }
    out.error = std::string("recvmsg: ") + std::strerror(errno);
    return out;
  }
  // Take every descriptor first, so that none leaks whatever is wrong with the packet.
  std::vector<maps::UniqueFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  if (n == 0 && fds.empty()) {
    out.status = ReceiveStatus::kClosed;
    return out;
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    out.error = "truncated message";
    return out;
  }
  if (fds.size() > 1) {
    out.error = "expected at most one descriptor, got " + std::to_string(fds.size());
    return out;
  }
  buf.resize(static_cast<size_t>(n));
  out.status = ReceiveStatus::kOk;
  out.packet.bytes = std::move(buf);
  if (!fds.empty()) out.packet.fd = std::move(fds.front());
  return out;
}

}  // namespace sockmesh::zds
