#pragma once
// HTTP/2 over an established TLS stream, for CONNECT tunnels and nothing else of HTTP.
// One H2Connection runs on one io_context thread; its streams are touched only from that thread.
//
// Flow control is explicit: received DATA is handed to the stream's consumer, which calls
// H2Stream::consume(n) once it has written those bytes onwards. Only then does the window open
// again, so a slow receiver slows the sender instead of growing buffers.
//
// The TLS handshake is asio's (ssl::stream); after it, the connection drives the SSL object
// itself over the non-blocking socket with its own buffers: one recv() of up to 256 KiB feeds
// many TLS records, and a batch of frames becomes one SSL_write() and one send(). (asio's stream
// moves at most one 16 KiB record per system call and copies each record twice more.)
#include <nghttp2/nghttp2.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/byte_queue.h"
#include "base/bytes.h"

namespace sockmesh::h2 {

using TlsStream = boost::asio::ssl::stream<boost::asio::ip::tcp::socket>;

struct Header {
  std::string name;
  std::string value;
};
using HeaderList = std::vector<Header>;

struct Settings {
  uint32_t stream_window = 4 * 1024 * 1024;       // as ztunnel
  uint32_t connection_window = 16 * 1024 * 1024;  // as ztunnel
  uint32_t max_concurrent_streams = 100;
  uint32_t max_header_list_bytes = 16 * 1024;
  std::chrono::milliseconds ping_interval{10000};  // idle time before a keepalive PING
  std::chrono::milliseconds ping_timeout{20000};   // no frame at all for this long: dead
  // Server: a connection without an open stream for this long is closed with GOAWAY (PINGs do
  // not count as use). 0: never.
  std::chrono::milliseconds idle_timeout{0};
  // Server: streams the peer resets, and streams refused because the peer went over
  // max_concurrent_streams, are allowed in a burst of reset_burst, refilled at
  // resets_per_second; beyond that GOAWAY(ENHANCE_YOUR_CALM) (the "rapid reset" attack).
  uint32_t reset_burst = 1000;
  uint32_t resets_per_second = 100;
  // CONTINUATION frames allowed after one HEADERS frame; more: GOAWAY(ENHANCE_YOUR_CALM).
  uint32_t max_continuations = 8;
};

// A request as received by the server side.
struct Request {
  std::string method;
  std::string authority;
  std::string scheme;
  std::string path;
  std::string protocol;
  HeaderList headers;  // regular (non-pseudo) headers
  size_t header_bytes = 0;
  bool oversized = false;

  const std::string* header(std::string_view name) const;
};

class H2Connection;

class H2Stream : public std::enable_shared_from_this<H2Stream> {
 public:
  struct Handlers {
    // Bytes of a DATA frame. Valid only during the call; call consume(n) once they are gone on.
    std::function<void(const uint8_t* data, size_t len)> on_data;
    // Every DATA frame of one read from the connection (one TLS read can carry thousands of
    // small frames) has been handed to on_data: a consumer that queued them writes them on now,
    // in one go, instead of once per frame.
    std::function<void()> on_batch_end;
    // The peer sent END_STREAM: no more data will come.
    std::function<void()> on_end;
    // The stream is closed. error_code 0 is a clean close; otherwise an HTTP/2 error code
    // (RST_STREAM from the peer, or the connection failed).
    std::function<void(uint32_t error_code)> on_close;
    // The send queue drained below the low watermark after having been above the high one.
    std::function<void()> on_writable;
    // Client side: the response headers arrived.
    std::function<void(int status, const HeaderList& headers)> on_response;
  };

  static constexpr size_t kHighWatermark = 1024 * 1024;
  static constexpr size_t kLowWatermark = 256 * 1024;
  // Chunks up to this size are copied into the send queue's last chunk when they fit there.
  static constexpr size_t kCoalesceBytes = 64 * 1024;

  H2Stream(std::shared_ptr<H2Connection> connection, int32_t id);

  int32_t id() const { return id_; }
  H2Connection& connection() { return *connection_; }
  const Request& request() const { return request_; }
  bool closed() const { return closed_; }

  // DATA and END_STREAM that arrived before the handlers were set (a server stream waits for
  // its target while the client may already send) are handed over here, in order.
  void set_handlers(Handlers handlers);

  // Queues bytes to send as DATA. Returns false when the stream can no longer send.
  bool send(Bytes chunk);
  bool send(const uint8_t* data, size_t len);
  size_t queued_bytes() const { return queued_bytes_; }
  // True when the caller should stop producing until on_writable.
  bool above_high_watermark();
  // END_STREAM once everything queued is sent.
  void finish();
  // RST_STREAM with this HTTP/2 error code.
  void reset(uint32_t error_code);
  // The consumer is done with n received bytes: reopen the flow-control window by n.
  void consume(size_t n);

  // Server side: answer the request. A 2xx keeps the stream open for the tunnel; anything else
  // ends it.
  void respond(int status, const HeaderList& extra = {});

  // nghttp2's data source: how many queued bytes the next DATA frame carries (NO_COPY; the
  // bytes are appended by write_data when the frame goes out).
  ssize_t read_for_send(size_t length, uint32_t* data_flags);
  // Appends the next `length` queued bytes to out.
  void write_data(AlignedBytes& out, size_t length);

 private:
  friend class H2Connection;
  void on_closed(uint32_t error_code);
  void drop_early_data();

  std::shared_ptr<H2Connection> connection_;
  int32_t id_;
  Request request_;
  Handlers handlers_;
  // Received before any on_data/on_end handler: kept, unconsumed (so the peer's flow-control
  // windows bound it), until set_handlers() or a final non-2xx answer. Coalesced, so that tiny
  // frames cost their bytes and not an allocation each.
  ByteQueue early_data_;
  bool early_end_ = false;
  bool refused_ = false;  // answered with a final non-2xx status: received DATA is dropped
  std::deque<Bytes> send_queue_;
  size_t front_offset_ = 0;
  size_t queued_bytes_ = 0;
  bool finish_requested_ = false;
  bool data_deferred_ = false;
  bool want_writable_ = false;
  bool reset_after_response_ = false;
  bool closed_ = false;
  bool in_read_batch_ = false;  // listed in the connection's batch_streams_
};

class H2Connection : public std::enable_shared_from_this<H2Connection> {
 public:
  enum class Role { kClient, kServer };
  using RequestHandler = std::function<void(std::shared_ptr<H2Stream>)>;
  using CloseHandler = std::function<void(const std::string& reason)>;
  // A limit of the server side was hit (for counters; the connection has already logged it).
  enum class Limit { kRefusedStream, kRapidReset, kContinuationFlood, kIdle };
  using LimitHandler = std::function<void(Limit)>;

  H2Connection(std::unique_ptr<TlsStream> stream, Role role, Settings settings);
  ~H2Connection();
  H2Connection(const H2Connection&) = delete;
  H2Connection& operator=(const H2Connection&) = delete;

  // Server: called once per complete request (headers received).
  void set_request_handler(RequestHandler handler) { request_handler_ = std::move(handler); }
  // Called once when the connection is gone, with a reason for the log.
  void set_close_handler(CloseHandler handler) { close_handler_ = std::move(handler); }
  void set_limit_handler(LimitHandler handler) { limit_handler_ = std::move(handler); }

  // Sends the preface and SETTINGS and starts reading. Returns false if nghttp2 refused.
  bool start();
  // Tests and fuzzing only, before start(): the socket carries the HTTP/2 frames in the clear and
  // the TLS stream's SSL object is never used, so that frames can be fed without a handshake.
  void use_cleartext_for_testing() { cleartext_ = true; }

  // Client: opens a CONNECT stream to authority ("ip:port"). nullptr if the connection cannot
  // take another stream.
  std::shared_ptr<H2Stream> open_connect(const std::string& authority, const HeaderList& headers,
                                         H2Stream::Handlers handlers);

  // GOAWAY: no new streams; existing ones finish; the connection closes when the last one does.
  void shutdown_gracefully();
  // Closes at once; every open stream sees on_close with an error.
  void abort(const std::string& reason);

  bool usable() const { return !closed_ && !going_away_ && !peer_going_away_; }
  bool closed() const { return closed_; }
  size_t active_streams() const { return streams_.size(); }
  // The peer's SETTINGS_MAX_CONCURRENT_STREAMS bounded by ours.
  uint32_t stream_limit() const;
  std::chrono::steady_clock::time_point idle_since() const { return idle_since_; }

  TlsStream& transport() { return *stream_; }
  boost::asio::any_io_executor executor() { return stream_->get_executor(); }

  // Used by H2Stream.
  nghttp2_session* session() { return session_; }
  void schedule_write();

 private:
  friend class H2Stream;
  static nghttp2_session_callbacks* callbacks();
  static int on_begin_headers(nghttp2_session*, const nghttp2_frame*, void*);
  static int on_header(nghttp2_session*, const nghttp2_frame*, const uint8_t*, size_t,
                       const uint8_t*, size_t, uint8_t, void*);
  static int on_frame_recv(nghttp2_session*, const nghttp2_frame*, void*);
  static int on_frame_send(nghttp2_session*, const nghttp2_frame*, void*);
  static int on_data_chunk(nghttp2_session*, uint8_t, int32_t, const uint8_t*, size_t, void*);
  static int on_stream_close(nghttp2_session*, int32_t, uint32_t, void*);
  static int on_send_data(nghttp2_session*, nghttp2_frame*, const uint8_t*, size_t,
                          nghttp2_data_source*, void*);
  static int on_begin_frame(nghttp2_session*, const nghttp2_frame_hd*, void*);

  // Server: one more stream reset by the peer or refused; false once over the budget (the
  // connection is then being closed with ENHANCE_YOUR_CALM).
  bool charge_reset();
  // GOAWAY(ENHANCE_YOUR_CALM) and close, for a peer that abuses the protocol.
  void calm_down(Limit limit, const std::string& why);
  void notify_limit(Limit limit);
  // The wire copy of our first SETTINGS frame carries the real MAX_CONCURRENT_STREAMS (see
  // start()).
  void patch_advertised_settings(uint8_t* frame, size_t len);

  // The custom BIO under the SSL object: reads come from in_, writes go to out_.
  friend struct TlsBio;
  void take_over_tls();
  // Cleartext mode's SSL_read_ex: takes up to len bytes of in_.
  int take_cleartext(uint8_t* to, size_t len, size_t* got);
  void read_loop();
  void on_readable();
  // Waits for ciphertext by reading the socket into in_ through the reactor, then on_readable().
  void receive_socket();
  // Tells every stream that received DATA in this read that the read is over (on_batch_end).
  void end_read_batch();
  // Waits until the socket takes more, with writing_ set meanwhile, then schedule_write(); a
  // failed wait closes the connection ("write failed: <reason>"). Reads wait in receive_socket.
  void wait_writable();
  void maybe_close();
  void arm_keepalive();
  void close_transport(const std::string& reason);
  H2Stream* find_stream(int32_t id);

  std::unique_ptr<TlsStream> stream_;
  Role role_;
  Settings settings_;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<int32_t, std::shared_ptr<H2Stream>> streams_;
  RequestHandler request_handler_;
  CloseHandler close_handler_;
  LimitHandler limit_handler_;
  SSL* ssl_ = nullptr;      // owned by stream_
  int fd_ = -1;             // stream_'s socket, non-blocking
  AlignedBytes in_;         // ciphertext received, not yet taken by OpenSSL: [in_pos_, in_len_)
  size_t in_pos_ = 0;
  size_t in_len_ = 0;
  // The last read of the socket was short: its receive queue was (most likely) empty then, so
  // when OpenSSL wants more the connection hands the next read to the reactor, which tries the
  // socket once before it waits (receive_socket), instead of reading it here first.
  bool socket_drained_ = false;
  AlignedBytes read_buf_;   // plaintext for nghttp2
  AlignedBytes plain_;      // frames of one write batch, before encryption
  AlignedBytes out_;        // ciphertext not yet sent: [out_pos_, end)
  size_t out_pos_ = 0;
  int in_nghttp2_ = 0;  // >0 while nghttp2 runs our callbacks: no re-entry into mem_send
  // Streams handed DATA by the current nghttp2_session_mem_recv call, for end_read_batch().
  std::vector<std::shared_ptr<H2Stream>> batch_streams_;
  bool writing_ = false;  // waiting until the socket takes more
  bool takeover_failed_ = false;
  bool cleartext_ = false;  // use_cleartext_for_testing()
  bool reading_ = false;
  bool closed_ = false;
  bool going_away_ = false;
  bool peer_going_away_ = false;
  bool ping_outstanding_ = false;
  bool settings_patched_ = false;
  bool calmed_ = false;         // GOAWAY(ENHANCE_YOUR_CALM) submitted
  uint32_t continuations_ = 0;  // CONTINUATION frames since the last HEADERS
  double reset_tokens_ = 0;
  std::chrono::steady_clock::time_point reset_refill_;
  std::string close_reason_;
  boost::asio::steady_timer keepalive_;
  std::chrono::steady_clock::time_point last_frame_;
  std::chrono::steady_clock::time_point idle_since_;
};

// A short name for an HTTP/2 error code, for logs.
const char* error_code_name(uint32_t code);

}  // namespace sockmesh::h2
