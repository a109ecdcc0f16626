#pragma once
// The DNS proxy: serves UDP sockets and TCP listeners handed in as descriptors (so that sockets
// opened inside a pod's netns work) on one Asio io_context. Names the mesh knows (NameTable) are
// answered locally; everything else is forwarded to the upstream resolvers over the protocol the
// client used, and the upstream's answer is relayed byte for byte (a TC bit reaches the client,
// which then retries over TCP). All state is touched on the io_context's thread only.
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "base/result.h"
#include "observe/metrics.h"
#include "state/snapshot.h"

namespace sockmesh::dns {

struct ServerOptions {
  std::vector<Endpoint> upstreams;  // tried in order; none: everything not ours gets SERVFAIL
  // ztunnel's forwarder waits 5 s for an upstream (src/dns/forwarder.rs, CONNECT_TIMEOUT).
  std::chrono::milliseconds upstream_timeout{5000};
  std::chrono::milliseconds tcp_idle_timeout{10000};
  size_t max_inflight_per_client = 100;  // forwarded queries awaiting an upstream, per client IP
  size_t max_inflight = 4096;            // the same, over all clients
  size_t max_tcp_connections_per_client = 32;
  uint32_t answer_ttl_seconds = 30;
  uint32_t upstream_mark = 0;  // SO_MARK on upstream and reply sockets (SM_MARK_PROXY); 0: none
  std::string cluster_domain = "cluster.local";
};

// Where a served socket lives. Upstream queries for its clients, and transparent reply sockets,
// are opened through `open_socket`, so that for an in-pod socket they leave from the pod's netns.
struct Binding {
  std::string tag;  // close_tag(tag) closes everything served under it (e.g. a pod's uid)
  // Opens a non-blocking socket(family, type) next to the served one; -1 with *error on failure.
  // Unset: socket() in the calling thread's netns.
  std::function<int(int family, int type, std::string* error)> open_socket;
};

// Counters for tests and diagnostics (the metrics carry the same facts with labels).
struct ServerStats {
  uint64_t queries = 0;
  uint64_t answered_locally = 0;
  uint64_t forwarded = 0;
  uint64_t upstream_failures = 0;
  uint64_t malformed = 0;  // FORMERR sent or dropped
  uint64_t dropped_client_limit = 0;
  uint64_t dropped_global_limit = 0;
  uint64_t tcp_refused_client_limit = 0;
};

class Server : public std::enable_shared_from_this<Server> {
 public:
  using SnapshotSource = std::function<state::SnapshotPtr()>;

  static std::shared_ptr<Server> create(boost::asio::io_context& io, ServerOptions options,
                                        SnapshotSource snapshot, observe::Registry& metrics);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Take ownership of a bound UDP socket / a listening TCP socket and serve them until stop() or
  // close_fds_of(). Call on the io_context's thread (or before it runs). For a transparent UDP
  // socket (captured queries to any address) replies leave from the address the client asked
  // (IP_RECVORIGDSTADDR); a TCP connection's local address is already that address.
  Status serve_udp(int fd, Binding binding = {});
  Status serve_tcp(int fd, Binding binding = {});
  // Closes the sockets served under `tag` (e.g. a pod's uid when it goes away).
  void close_tag(const std::string& tag);
  void stop();

  const ServerStats& stats() const;

 private:
  struct Impl;
  Server(boost::asio::io_context& io, ServerOptions options, SnapshotSource snapshot,
         observe::Registry& metrics);
  std::shared_ptr<Impl> impl_;
};

// A socket for the DNS proxy to serve, in the calling thread's netns: SOCK_DGRAM bound at `at`,
// or SOCK_STREAM bound and listening; SO_REUSEADDR and SO_REUSEPORT (an upgrade's second proxy
// binds the same port while the first drains), IPV6_V6ONLY for IPv6, IP_TRANSPARENT when asked
// (captured queries are to any address; needs CAP_NET_ADMIN) and SO_MARK when non-zero.
// Returns the descriptor, or -1 with *error naming the step that failed.
int open_dns_socket(int type, const Endpoint& at, bool transparent, uint32_t mark,
                    std::string* error);

// The nameservers of a resolv.conf (port 53); an empty list when none can be read.
std::vector<Endpoint> nameservers_from_resolv_conf(const std::string& path = "/etc/resolv.conf");
// "IP[:PORT],..." (IPv6 as [addr]:port or bare addr); nullopt with *error on a bad entry.
std::optional<std::vector<Endpoint>> parse_upstreams(std::string_view text, std::string* error);

}  // namespace sockmesh::dns
