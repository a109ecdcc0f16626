#pragma once
// Joins an HBONE stream (one CONNECT tunnel) to a TCP socket and copies bytes both ways.
// Backpressure runs end to end: the socket is not read while the stream's send queue is above its
// high watermark, and received DATA is acknowledged to the peer (window reopened) only after it
// has been written to the socket.
//
// Towards the socket, received DATA is queued in a ByteQueue and written with one gather write
// per read from the HTTP/2 connection (on_batch_end), not one send() per frame: what a tunnel
// holds and costs follows its bytes, whatever size of frames the peer chooses.
//
// A socket in the sockmap bypass (its app's sends redirected into it) goes back to the TCP stack
// when reading it pauses (backpressure), and once its app has answered what it was sent twice:
// request and response, where the app's ACKs cost less riding on its answers (ARCHITECTURE, "What
// one direction costs a round trip").
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <memory>
#include <string>

#include "base/byte_queue.h"
#include "base/bytes.h"
#include "h2/connection.h"
#include "proxy/bypass_pinning.h"

namespace sockmesh::proxy {

class TunnelRelay : public std::enable_shared_from_this<TunnelRelay> {
 public:
  using Tcp = boost::asio::ip::tcp;
  struct Result {
    uint64_t bytes_to_stream = 0;  // read from the socket, sent into the tunnel
    uint64_t bytes_to_socket = 0;  // received from the tunnel, written to the socket
    std::string error;             // empty when both directions ended cleanly
  };
  using Done = std::function<void(const Result&)>;
  // Progress, for metrics: (to_stream, bytes).
  using Progress = std::function<void(bool to_stream, size_t bytes)>;

  TunnelRelay(std::shared_ptr<Tcp::socket> socket, std::shared_ptr<h2::H2Stream> stream);
  // Takes over the stream's events at once; data that arrives before start() is held back.
  void attach();
  // Optional, before start(), for a socket whose peer's bytes do not wait for our reads (a sockmap
  // redirect into it): run with kReadPaused each time reading the socket pauses because the stream
  // is above its high watermark or falls more than net::kMaxUnreadBeforePause behind, so that its
  // owner can push back on that peer; and with kTwoWay before it writes bytes for the app that
  // come after bytes from it, the kTwoWayAnswers-th time (request and response).
  void on_bypass_exit(BypassExit exit) { bypass_exit_ = std::move(exit); }
  static constexpr int kTwoWayAnswers = 2;
  // Starts moving bytes (attaches first if needed).
  void start(Done done, Progress progress = nullptr);
  // Resets both sides now.
  void abort(const std::string& reason);

 private:
  void read_socket();
  void on_stream_data(const uint8_t* data, size_t len);
  // Writes what is queued until the socket would block (then waits for it), then passes on
  // END_STREAM as a shutdown once everything is written.
  void write_socket();
  void wrote_to_socket(size_t n);
  void on_stream_end();
  void on_stream_close(uint32_t error_code);
  void maybe_finish();
  void fail(const std::string& error, bool reset_stream);

  std::shared_ptr<Tcp::socket> socket_holder_;
  Tcp::socket& socket_;
  std::shared_ptr<h2::H2Stream> stream_;
  Done done_;
  Progress progress_;
  BypassExit bypass_exit_;
  // Request and response: the socket gave bytes since the last bytes for it, and how often bytes
  // for it followed bytes from it (counted up to kTwoWayAnswers).
  bool app_spoke_ = false;
  int answers_ = 0;
  Result result_;
  // socket -> stream
  bool reading_ = false;
  bool socket_eof_ = false;
  bool paused_ = false;
  // stream -> socket
  ByteQueue pending_;
  bool writing_ = false;  // waiting for the socket to take more
  // A wait for writability ran: the socket's epoll registration may carry EPOLLOUT from now on,
  // which each later wait for readability would report at once. Registered afresh
  // (net::register_for_reading) when the next read wait starts with no write wait pending.
  bool registration_stale_ = false;
  bool stream_ended_ = false;
  bool socket_shut_ = false;
  bool stream_closed_ = false;
  bool attached_ = false;
  bool started_ = false;
  bool finished_ = false;
};

}  // namespace sockmesh::proxy
