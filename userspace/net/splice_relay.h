#pragma once
// TcpRelay's contract (FIN passes as FIN, an error or reset on either side resets both, a side is
// read only while the other takes its bytes) with the bytes moved by splice(2) through one pipe
// per direction, so that they never cross into user space.
//
// Not for a socket in the sockmap bypass (sm_bypass): the bytes sk_msg redirects into such a
// socket wait on its psock's ingress queue, which only recvmsg() reads; tcp_splice_read() reads
// the TCP receive queue alone and would never see them (tests/loader/bypass_pinning_test.cc,
// SpliceDoesNotSeeRedirectedBytes). Callers pick TcpRelay for bypassed sockets.
//
// Falls back to TcpRelay, transparently, when the kernel refuses splice on these sockets
// (EINVAL/ENOSYS before any byte moved) or no pipe can be had (e.g. EMFILE).
#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>

#include "net/relay.h"

namespace sockmesh::net {

class SpliceRelay : public std::enable_shared_from_this<SpliceRelay> {
 public:
  using Tcp = boost::asio::ip::tcp;
  using Result = TcpRelay::Result;
  using Done = TcpRelay::Done;
  using Progress = TcpRelay::Progress;

  // `pipe_bytes`: the capacity asked of each pipe (F_SETPIPE_SZ), the most one direction holds;
  // as much as a copying relay reads at once (against 128 KiB: one spliced passthrough stream
  // 8.3 -> 9.1 Gbit/s across nodes, CPU per GB -14%; docs/ARCHITECTURE.md, #16).
  SpliceRelay(Tcp::socket a, Tcp::socket b, size_t pipe_bytes = kRelayBufferBytes);
  ~SpliceRelay();
  void start(Done done, Progress progress = nullptr);
  // Resets both sides now (e.g. policy revoked the connection).
  void abort(const std::string& reason);
  // Whether the bytes are moved by the copying TcpRelay instead (the kernel refused splice).
  bool fell_back() const { return fallback_ != nullptr; }

 private:
  struct Pipe {
    int read_end = -1;
    int write_end = -1;
  };
  struct Direction {
    Tcp::socket* from;
    Tcp::socket* to;
    Pipe pipe;
    size_t in_pipe = 0;  // read from `from`, not yet taken by `to`
    uint64_t bytes = 0;
    bool eof = false;  // `from` sent FIN; shut `to` down once the pipe drained
    bool done = false;
  };
  void pump(Direction& d, bool a_to_b);
  // pump(d) again once `socket` is ready for `what`; a failed wait fails the relay.
  void pump_when(Tcp::socket& socket, Tcp::socket::wait_type what, Direction& d, bool a_to_b);
  void finish_direction(Direction& d);
  void fall_back();
  void fail(const std::string& error);
  void maybe_done();
  void close_pipes();

  Tcp::socket a_, b_;
  Direction ab_, ba_;
  Done done_;
  Progress progress_;
  std::string error_;
  size_t pipe_bytes_;
  bool finished_ = false;
  std::shared_ptr<TcpRelay> fallback_;
};

}  // namespace sockmesh::net
