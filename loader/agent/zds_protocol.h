#pragma once
// The pod handoff between the node agent and the proxy, in the shape of Istio's ZDS ("ztunnel
// discovery service", proto/zds.proto in istio/ztunnel): one Unix SOCK_SEQPACKET connection, one
// protobuf message per packet, the pod's network namespace attached to `add` as SCM_RIGHTS.
//
// Messages are encoded here by hand in the protobuf wire format, with ZDS's field numbers, so that
// bytes on the socket decode with zds.proto (`protoc --decode istio.workload.zds.WorkloadRequest`).
// The messages are few and flat (strings, one nested message, one enum), which does not justify a
// code generator in the build of both the node agent and the proxy.
//
//   ZdsHello         { Version version = 1; }                     V1 = 1
//   WorkloadInfo     { string name = 1; string namespace = 2; string service_account = 3; }
//   AddWorkload      { string uid = 1; WorkloadInfo workload_info = 2;
//                      repeated bytes sockmesh_ips = 1000; }      (extension, see below)
//   KeepWorkload     { string uid = 1; }
//   DelWorkload      { string uid = 2; }                          (2, as in zds.proto)
//   SnapshotSent     { }
//   WorkloadRequest  { oneof payload { AddWorkload add = 1; DelWorkload del = 2;
//                                      SnapshotSent snapshot_sent = 3; KeepWorkload keep = 5; } }
//   Ack              { string error = 1; }                        empty error: success
//   WorkloadResponse { oneof payload { Ack ack = 1; } }
//
// Extension: ZDS does not carry the pod's IPs (ztunnel learns them from xDS); sockmesh needs them
// to register the in-pod listeners under (pod IP, listener kind) for tc. They travel in field 1000
// of AddWorkload, one entry per IP, 4 bytes (IPv4) or 16 bytes (IPv6) in network order, the way
// Istio's workload.proto encodes addresses. A ZDS peer that does not know the field skips it; an
// add without it (from Istio's agent) makes sockmesh's proxy read the addresses of the pod's
// interfaces inside its netns instead.
//
// Sequence, as in Istio (each request is answered by exactly one WorkloadResponse before the next
// is sent). The node agent listens (Istio's path: /var/run/ztunnel/ztunnel.sock); the proxy
// connects, and connects again whenever the connection ends:
//   proxy -> agent   ZdsHello{V1}, right after connecting
//   agent -> proxy   add (with the netns fd) or keep, for every pod the agent knows
//   agent -> proxy   snapshot_sent: the proxy closes the pods that were neither added nor kept
//   agent -> proxy   add / del as pods come and go
// keep and snapshot_sent are valid only before the first snapshot_sent of a connection; a second
// full snapshot needs a new connection. A restarted proxy, or a restarted agent, therefore meets
// its peer on a new connection and gets (or sends) the whole snapshot.
#include <sys/un.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/ip_address.h"
#include "loader/maps/unique_fd.h"

namespace sockmesh::zds {

inline constexpr uint32_t kVersionV1 = 1;
// Largest message either side accepts. Istio's peers read into 1 KiB: sockmesh's agent keeps the
// messages it sends under kMaxSentBytes by leaving IPs out of an add that would not fit (the
// proxy then reads them in the pod's netns).
inline constexpr size_t kMaxMessageBytes = 64 * 1024;
inline constexpr size_t kMaxSentBytes = 1024;

struct Hello {
  uint32_t version = kVersionV1;
};

struct WorkloadInfo {
  std::string name;
  std::string namespace_name;
  std::string service_account;
};

struct AddWorkload {
  std::string uid;
  WorkloadInfo info;
  std::vector<IpAddress> ips;  // sockmesh extension (field 1000)
};

struct KeepWorkload {
  std::string uid;
};

struct DelWorkload {
  std::string uid;
};

struct SnapshotSent {};

using Request = std::variant<AddWorkload, KeepWorkload, DelWorkload, SnapshotSent>;

struct Ack {
  std::string error;  // empty: the request took effect
};

std::string encode(const Hello& hello);
std::string encode(const Request& request);
std::string encode(const Ack& ack);

// Decoders return nullopt and fill *error on malformed input (bad varint, a length past the end,
// a wrong wire type for a known field, an IP that is neither 4 nor 16 bytes, no payload). Unknown
// fields are skipped, as protobuf does.
std::optional<Hello> decode_hello(std::string_view bytes, std::string* error);
std::optional<Request> decode_request(std::string_view bytes, std::string* error);
std::optional<Ack> decode_ack(std::string_view bytes, std::string* error);

// "add uid=... ips=...", "del uid=...", ...: for logs.
std::string describe(const Request& request);

// One packet on a SOCK_SEQPACKET socket, with at most one file descriptor attached.
struct Packet {
  std::string bytes;
  maps::UniqueFd fd;  // the SCM_RIGHTS descriptor, if one came with the packet
};

enum class ReceiveStatus { kOk, kClosed, kTimeout, kError };

struct Received {
  ReceiveStatus status = ReceiveStatus::kError;
  Packet packet;
  std::string error;  // kError: what went wrong (truncation, more than one fd, errno)
};

// The address of the ZDS socket at `path` (the agent binds it, the proxy connects to it); an
// error when the path is empty or too long for sockaddr_un.
std::optional<std::string> socket_address(const std::string& path, sockaddr_un* out);

// Sends one packet; `attach_fd` >= 0 goes along as SCM_RIGHTS. Returns an error message.
std::optional<std::string> send_packet(int socket_fd, std::string_view bytes, int attach_fd = -1);
// Waits up to `timeout_ms` (< 0: without limit) for one packet. Descriptors that arrive with a
// packet that is refused (truncated, several fds) are closed.
Received receive_packet(int socket_fd, int timeout_ms);

}  // namespace sockmesh::zds
