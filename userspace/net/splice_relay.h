#pragma once
// TcpRelay's contract (FIN passes as FIN, an error or reset on either side resets both, a side is
// read only while the other takes its bytes) with the bytes moved by splice(2) through one pipe
// per direction, so that they never cross into user space.
//
// Not for a socket in the sockmap bypass (sm_bypass): the bytes sk_msg redirects into such a
// socket wait on its psock's ingress queue, which only recvmsg() reads; tcp_splice_read() reads
// the TCP receive queue alone and would never see them (tests/loader/bypass_pinning_test.cc,
// SpliceDoesNotSeeRedirectedBytes). A caller that took the app's flow out of the redirect (pinned
// it to the stack) names that socket with drain_redirected_first(): what was redirected before the
// pin is read with recvmsg() and sent on by copying, and splicing starts with the first bytes that
// came through TCP (recvmsg() serves the psock queue before the TCP queue, and an app's sends that
// follow the pin follow its redirected ones).
//
// Falls back to TcpRelay, transparently, when the kernel refuses splice on these sockets
// (EINVAL/ENOSYS before any byte moved) or no pipe can be had (e.g. EMFILE).
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "base/bytes.h"
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
  // Before start(): `from_a`/`from_b` is a proxy socket of the sockmap bypass whose app's flow was
  // pinned to the stack. Its direction copies until a read returns bytes from TCP's receive queue
  // (told by the TCP_INQ hint, which only TCP's own recvmsg gives), then splices.
  void drain_redirected_first(bool from_a, bool from_b);
  void start(Done done, Progress progress = nullptr);
  // Resets both sides now (e.g. policy revoked the connection).
  void abort(const std::string& reason);
  // Whether the bytes are moved by the copying TcpRelay instead (the kernel refused splice).
  bool fell_back() const { return fallback_ != nullptr; }
  // Bytes read from the psock queues while draining (redirected before the pin), both directions.
  uint64_t drained_bytes() const { return ab_.drained + ba_.drained; }

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
    // Draining (drain_redirected_first): `from` is read by recvmsg into `held`, which is sent on
    // before anything else; freed once the direction splices.
    bool draining = false;
    Bytes held;  // resized for each read without zeroing
    size_t held_sent = 0;
    uint64_t drained = 0;
    // Drained, then spliced: each splice within 100 ms of the drain's end, then a wake that finds
    // TCP's queue empty, and the end of stream, look at the psock queue once more.
    bool was_drained = false;
    bool woken = false;  // a wait for readability ended and no splice has taken bytes since
    // Until when each splice peeks first (100 ms after the drain's end); empty once past.
    std::optional<std::chrono::steady_clock::time_point> watch_until;
  };
  // Whether bytes sit in `d`'s psock queue that were redirected after its drain ended (then the
  // relay has failed: they belong before bytes already spliced).
  bool redirected_after_drain(Direction& d);
  // One recvmsg of a draining direction; false when the caller must stop (waiting, or failed).
  bool drain_read(Direction& d, bool a_to_b);
  // Sends d.held on; false when the caller must stop (waiting, or failed).
  bool send_held(Direction& d, bool a_to_b);
  void pump(Direction& d, bool a_to_b);
  // pump(d) again once `socket` is ready for `what`; a failed wait fails the relay.
  void pump_when(Tcp::socket& socket, Tcp::socket::wait_type what, Direction& d, bool a_to_b);
  void finish_direction(Direction& d);
  // No byte was read or sent yet: falling back to TcpRelay loses nothing.
  bool nothing_moved() const;
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
