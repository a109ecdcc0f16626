#pragma once
// Blocking sockets for the integration tests, created inside a chosen network namespace, and two
// small servers: an echo server (the remote app) and a relay standing in for the proxy (accepts
// on one of its listeners in the pod, dials the original destination, copies bytes both ways).
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/ip_address.h"
#include "loader/maps/listener_map.h"
#include "loader/maps/unique_fd.h"

namespace sockmesh::testing {

using maps::UniqueFd;

struct SocketOptions {
  bool transparent = false;         // IP_TRANSPARENT / IPV6_TRANSPARENT
  uint32_t mark = 0;                // SO_MARK
  std::optional<IpAddress> source;  // connect_in: bind to this address (port 0) first
};

// socket() + options + bind() + listen(), in the netns at `netns_path`.
UniqueFd listen_in(const std::string& netns_path, const Endpoint& at,
                   const SocketOptions& options = {});
// socket() + options + connect() within `timeout_ms`; invalid fd on failure (errno kept).
UniqueFd connect_in(const std::string& netns_path, const Endpoint& to,
                    const SocketOptions& options = {}, int timeout_ms = 3000);
// accept() within `timeout_ms`; invalid fd when nothing arrived.
UniqueFd accept_within(int listener, int timeout_ms);

Endpoint local_of(int fd);
Endpoint peer_of(int fd);

// send() all of it; recv() exactly n bytes within `timeout_ms` overall. EAGAIN is retried (a
// socket in a SOCKHASH can wake without data).
bool send_all(int fd, const uint8_t* data, size_t n);
bool recv_exact(int fd, uint8_t* data, size_t n, int timeout_ms);
std::vector<uint8_t> pattern(size_t n, uint32_t seed);

// Sends `data` on `from` (in a thread) while reading as many bytes on `to` (so that neither side's
// buffers fill up); true when all was sent and what arrived equals `data`.
bool send_and_receive(int from, int to, const std::vector<uint8_t>& data, int timeout_ms);
// send_and_receive on one socket whose peer echoes.
bool echo_round_trip(int fd, const std::vector<uint8_t>& data, int timeout_ms);

// Something that accepts connections on a listener in a thread and serves each in its own thread.
class Server {
 public:
  virtual ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  Endpoint endpoint() const { return local_of(listener_.get()); }
  int listener_fd() const { return listener_.get(); }
  int accepted() const { return accepted_.load(); }
  // Peers of accepted connections and the local address each was accepted on.
  std::vector<std::pair<Endpoint, Endpoint>> connections() const;

 protected:
  explicit Server(UniqueFd listener);
  void start();
  void stop();
  // Serves one accepted connection; the Server owns `fd` and closes it after stop().
  virtual void serve(int fd) = 0;
  std::atomic<bool> stopping_{false};

 private:
  void accept_loop();
  UniqueFd listener_;
  std::atomic<int> accepted_{0};
  mutable std::mutex mu_;
  std::vector<std::pair<Endpoint, Endpoint>> connections_;
  std::vector<UniqueFd> fds_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

class EchoServer : public Server {
 public:
  EchoServer(const std::string& netns_path, const Endpoint& at);
  ~EchoServer() override;

 protected:
  void serve(int fd) override;
};

// A stand-in proxy listener inside the pod: registered in the listener SOCKHASH under
// (pod_ip, kind); each accepted connection is relayed to its local address (the original
// destination), dialled from the pod's netns with `upstream_mark`. With `keep_source`, the dial
// binds (transparently) to the client's address, as a proxy that preserves source IPs does.
class Relay : public Server {
 public:
  Relay(const std::string& netns_path, maps::ListenerMap& listeners, const IpAddress& pod_ip,
        maps::ListenerKind kind, uint32_t upstream_mark, bool keep_source = false);
  ~Relay() override;

  // TCP_MAXSEG of each relayed connection's two sockets once the dial is up: what the relay
  // sends to the app (accepted) and to the original destination (upstream) in one segment.
  struct SegmentSizes {
    int accepted = 0;
    int upstream = 0;
  };
  std::vector<SegmentSizes> segment_sizes() const;

 protected:
  void serve(int fd) override;

 private:
  std::string netns_path_;
  uint32_t upstream_mark_;
  bool keep_source_;
  mutable std::mutex mss_mu_;
  std::vector<SegmentSizes> mss_;
};

// TCP_MAXSEG of a connected socket (-1 on error).
int max_segment(int fd);
// SO_MARK of a socket (0 on error, with a test failure recorded).
uint32_t socket_mark(int fd);

// Copies a -> b until EOF on a, then shuts b's write side. EAGAIN is retried.
void pump(int from, int to, const std::atomic<bool>& stopping);

}  // namespace sockmesh::testing
