#pragma once
// Copies bytes both ways between two TCP sockets until both directions have ended. A FIN on one
// side becomes a FIN on the other (half-close is kept); an error or reset on either side resets
// both, so that neither application waits for bytes that will never come.
//
// A side is read only while the other side takes what was read from it: when a write would block,
// the rest is written asynchronously and reading stops until it is done (TCP flow control then
// pushes back on the sender).
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "net/sockets.h"

namespace sockmesh::net {

class TcpRelay : public std::enable_shared_from_this<TcpRelay> {
 public:
  using Tcp = boost::asio::ip::tcp;
  struct Result {
    uint64_t bytes_a_to_b = 0;
    uint64_t bytes_b_to_a = 0;
    std::string error;  // empty when both sides ended cleanly
  };
  using Done = std::function<void(const Result&)>;
  // Called after each chunk: (a_to_b, bytes).
  using Progress = std::function<void(bool a_to_b, size_t bytes)>;

  // Called when the relay stops reading one side because the other is not taking its bytes.
  using ReadPaused = std::function<void()>;

  TcpRelay(Tcp::socket a, Tcp::socket b, size_t buffer_bytes = kRelayBufferBytes);
  // Optional, before start(): run each time reading `a` (resp. `b`) pauses, or falls more than
  // kMaxUnreadBeforePause behind. For a sender whose bytes do not wait for our reads (a sockmap
  // redirect), so that its owner can push back.
  void on_read_paused(ReadPaused a, ReadPaused b);
  void start(Done done, Progress progress = nullptr);
  // Resets both sides now (e.g. policy revoked the connection).
  void abort(const std::string& reason);

 private:
  struct Direction {
    Tcp::socket* from;
    Tcp::socket* to;
    Bytes buffer;  // allocated only while data moves
    uint64_t bytes = 0;
    bool done = false;
    bool writing = false;  // an async_write to `to` is under way
    // An async_write to `to` waited: its epoll registration may carry EPOLLOUT from now on, which
    // the next wait for `to`'s readability would report at once. Registered afresh when that
    // wait starts and no write is under way (net::register_for_reading).
    bool to_registration_stale = false;
    ReadPaused read_paused;  // `from` is no longer read
  };
  void pump(Direction& d, bool a_to_b);
  // Waits until d.from is readable (or has a FIN or an error), holding no buffer meanwhile.
  void wait_readable(Direction& d, bool a_to_b);
  // Counts `n` bytes written; false when the progress handler aborted the relay.
  bool wrote(Direction& d, bool a_to_b, size_t n);
  void finish_direction(Direction& d);
  void fail(const std::string& error);
  void maybe_done();

  Tcp::socket a_, b_;
  Direction ab_, ba_;
  Done done_;
  Progress progress_;
  std::string error_;
  size_t buffer_bytes_;
  bool finished_ = false;
};

}  // namespace sockmesh::net
