#include "h2/connection.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <sys/socket.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>

#include "base/log.h"

namespace sockmesh::h2 {
namespace {

constexpr size_t kReadBufferBytes = 256 * 1024;
// Frames are gathered up to this many bytes, then encrypted with one SSL_write and sent.
constexpr size_t kWriteBatchBytes = 256 * 1024;
// Our receive side accepts DATA frames this large, which cuts per-frame work for our own peers.
constexpr uint32_t kMaxFrameSize = 256 * 1024;
// Batches one connection moves before it lets the other handlers of its thread run.
constexpr int kReadRounds = 4;
constexpr int kWriteRounds = 4;
// What the server tells nghttp2 about its own stream limit: none. nghttp2 treats a stream over
// its local limit as a connection error (GOAWAY PROTOCOL_ERROR), where RFC 9113 5.1.2 wants a
// stream error; so the connection counts streams itself and refuses the extra ones with
// RST_STREAM(REFUSED_STREAM), and the SETTINGS frame on the wire carries the real limit.
constexpr uint32_t kLibraryStreamLimit = 0xffffffffu;

nghttp2_nv make_nv(const std::string& name, const std::string& value) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                    value.size(), NGHTTP2_NV_FLAG_NONE};
}

ssize_t data_source_read(nghttp2_session*, int32_t, uint8_t*, size_t length,
                         uint32_t* data_flags, nghttp2_data_source* source, void*) {
  return static_cast<H2Stream*>(source->ptr)->read_for_send(length, data_flags);
}

// The first queued OpenSSL error as text (and the queue cleared), for logs.
std::string tls_error_text(int ssl_error) {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    return buf;
  }
  return "TLS error " + std::to_string(ssl_error);
}

ssize_t data_read_length(nghttp2_session*, uint8_t, int32_t, int32_t session_window,
                         int32_t stream_window, uint32_t remote_max_frame, void*) {
  int64_t n = std::min<int64_t>({session_window, stream_window, remote_max_frame});
  return static_cast<ssize_t>(std::max<int64_t>(n, 1));
}

}  // namespace

// A BIO for the SSL object of an established connection: reads take ciphertext from the
// connection's receive buffer, writes append ciphertext to its send buffer. The socket I/O is the
// connection's own, in as few system calls as possible.
struct TlsBio {
  static BIO_METHOD* method() {
    static BIO_METHOD* m = [] {
      BIO_METHOD* bm = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "sockmesh-h2");
      BIO_meth_set_write_ex(bm, write);
      BIO_meth_set_read_ex(bm, read);
      BIO_meth_set_ctrl(bm, ctrl);
      BIO_meth_set_create(bm, create);
      return bm;
    }();
    return m;
  }
  static int create(BIO* b) {
    BIO_set_init(b, 1);
    return 1;
  }
  static int write(BIO* b, const char* data, size_t len, size_t* written) {
    BIO_clear_retry_flags(b);
    auto* c = static_cast<H2Connection*>(BIO_get_data(b));
    if (c == nullptr) return 0;
    append(c->out_, data, len);
    *written = len;
    return 1;
  }
  static int read(BIO* b, char* data, size_t len, size_t* read_bytes) {
    BIO_clear_retry_flags(b);
    auto* c = static_cast<H2Connection*>(BIO_get_data(b));
    if (c == nullptr) return 0;
    size_t avail = c->in_len_ - c->in_pos_;
    if (avail == 0) {
      BIO_set_retry_read(b);  // the connection reads the socket and calls SSL_read again
      return 0;
    }
    size_t n = std::min(len, avail);
    std::memcpy(data, c->in_.data() + c->in_pos_, n);
    c->in_pos_ += n;
    *read_bytes = n;
    return 1;
  }
  static long ctrl(BIO* b, int cmd, long, void*) {
    auto* c = static_cast<H2Connection*>(BIO_get_data(b));
    switch (cmd) {
      case BIO_CTRL_FLUSH:
        return 1;
      case BIO_CTRL_PENDING:
        return c == nullptr ? 0 : static_cast<long>(c->in_len_ - c->in_pos_);
      default:
        return 0;
    }
  }
};

const std::string* Request::header(std::string_view name) const {
  for (const auto& h : headers) {
    if (h.name == name) return &h.value;
  }
  return nullptr;
}

const char* error_code_name(uint32_t code) {
  return nghttp2_http2_strerror(code);
}

// ---------------------------------------------------------------------------------------------
// H2Stream

H2Stream::H2Stream(std::shared_ptr<H2Connection> connection, int32_t id)
    : connection_(std::move(connection)), id_(id) {}

void H2Stream::set_handlers(Handlers handlers) {
  handlers_ = std::move(handlers);
  if (closed_) return;
  auto self = shared_from_this();  // a handler may drop the last other reference
  if (handlers_.on_data && !early_data_.empty()) {
    ByteQueue early = std::move(early_data_);
    // The consumer calls consume(n) for these like for any other received bytes.
    while (!early.empty() && !closed_ && handlers_.on_data) {
      auto run = early.front();
      handlers_.on_data(run.data(), run.size());
      early.consume(run.size());
    }
    if (!closed_ && handlers_.on_batch_end) {
      auto on_batch_end = handlers_.on_batch_end;
      on_batch_end();
    }
  }
  if (early_end_ && !closed_ && handlers_.on_end) {
    early_end_ = false;
    auto on_end = handlers_.on_end;
    on_end();
  }
}

void H2Stream::drop_early_data() {
  size_t n = early_data_.size();
  if (n == 0) return;
  // Nobody will consume these bytes: give their windows back (only the connection's once the
  // stream is closed).
  if (closed_) {
    nghttp2_session_consume_connection(connection_->session(), n);
  } else {
    nghttp2_session_consume(connection_->session(), id_, n);
  }
  early_data_.clear();
  connection_->schedule_write();
}

bool H2Stream::send(Bytes chunk) {
  if (closed_ || finish_requested_) return false;
  if (chunk.empty()) return true;
  queued_bytes_ += chunk.size();
  // A small chunk goes into the spare room of the one queued last when it fits (a chunk is
  // usually a whole read buffer): an application that writes a byte at a time behind a closed
  // window then costs its bytes here, not a read buffer per byte. Appending within capacity
  // moves nothing, so the front may be in the middle of a frame.
  if (chunk.size() <= kCoalesceBytes && !send_queue_.empty() &&
      send_queue_.back().capacity() - send_queue_.back().size() >= chunk.size()) {
    append(send_queue_.back(), chunk.data(), chunk.size());
  } else {
    send_queue_.push_back(std::move(chunk));
  }
  if (data_deferred_) {
    data_deferred_ = false;
    nghttp2_session_resume_data(connection_->session(), id_);
  }
  connection_->schedule_write();
  return true;
}

bool H2Stream::send(const uint8_t* data, size_t len) {
  return send(bytes_of(data, len));
}

bool H2Stream::above_high_watermark() {
  if (queued_bytes_ < kHighWatermark) return false;
  want_writable_ = true;
  return true;
}

void H2Stream::finish() {
  if (closed_ || finish_requested_) return;
  finish_requested_ = true;
  if (data_deferred_) {
    data_deferred_ = false;
    nghttp2_session_resume_data(connection_->session(), id_);
  }
  connection_->schedule_write();
}

void H2Stream::reset(uint32_t error_code) {
  if (closed_) return;
  nghttp2_submit_rst_stream(connection_->session(), NGHTTP2_FLAG_NONE, id_, error_code);
  connection_->schedule_write();
}

void H2Stream::consume(size_t n) {
  if (closed_ || n == 0) return;
  nghttp2_session_consume(connection_->session(), id_, n);
  connection_->schedule_write();
}

void H2Stream::respond(int status, const HeaderList& extra) {
  if (closed_) return;
  std::string status_name = ":status";
  std::string status_value = std::to_string(status);
  std::vector<nghttp2_nv> nva;
  nva.push_back(make_nv(status_name, status_value));
  for (const auto& h : extra) nva.push_back(make_nv(h.name, h.value));
  auto* session = connection_->session();
  if (status >= 200 && status < 300) {
    nghttp2_data_provider provider{};
    provider.source.ptr = this;
    provider.read_callback = data_source_read;
    nghttp2_submit_response(session, id_, nva.data(), nva.size(), &provider);
  } else {
    refused_ = true;
    early_end_ = false;
    drop_early_data();
    nghttp2_submit_response(session, id_, nva.data(), nva.size(), nullptr);
    // The answer is final: once it is on the wire, tell the client to stop sending (RFC 9113
    // 8.1). Submitting RST_STREAM now would make nghttp2 drop the queued HEADERS.
    reset_after_response_ = true;
  }
  connection_->schedule_write();
}

ssize_t H2Stream::read_for_send(size_t length, uint32_t* data_flags) {
  size_t n = std::min(length, queued_bytes_);
  if (n == queued_bytes_) {  // this frame takes everything queued
    if (finish_requested_) {
      *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    } else if (n == 0) {
      data_deferred_ = true;
      return NGHTTP2_ERR_DEFERRED;
    }
  }
  // The bytes are copied once, straight into the connection's write batch (write_data).
  if (n > 0) *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
  return static_cast<ssize_t>(n);
}

void H2Stream::write_data(AlignedBytes& out, size_t length) {
  size_t left = length;
  while (left > 0 && !send_queue_.empty()) {
    auto& front = send_queue_.front();
    size_t take = std::min(left, front.size() - front_offset_);
    const uint8_t* from = front.data() + front_offset_;
    append(out, from, take);
    left -= take;
    front_offset_ += take;
    if (front_offset_ == front.size()) {
      send_queue_.pop_front();
      front_offset_ = 0;
    }
  }
  queued_bytes_ -= length - left;
  if (want_writable_ && queued_bytes_ <= kLowWatermark) {
    want_writable_ = false;
    // Not from inside nghttp2: the handler will queue more data and resume this stream.
    boost::asio::post(connection_->executor(), [self = shared_from_this()] {
      if (!self->closed_ && self->handlers_.on_writable) self->handlers_.on_writable();
    });
  }
}

void H2Stream::on_closed(uint32_t error_code) {
  if (closed_) return;
  closed_ = true;
  drop_early_data();
  send_queue_.clear();
  queued_bytes_ = 0;
  auto handlers = std::move(handlers_);
  handlers_ = {};
  if (handlers.on_close) handlers.on_close(error_code);
  connection_.reset();
}

// ---------------------------------------------------------------------------------------------
// H2Connection

nghttp2_session_callbacks* H2Connection::callbacks() {
  static nghttp2_session_callbacks* cbs = [] {
    nghttp2_session_callbacks* c = nullptr;
    nghttp2_session_callbacks_new(&c);
    nghttp2_session_callbacks_set_on_begin_headers_callback(c, &H2Connection::on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(c, &H2Connection::on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(c, &H2Connection::on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(c, &H2Connection::on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(c, &H2Connection::on_stream_close);
    nghttp2_session_callbacks_set_data_source_read_length_callback(c, data_read_length);
    nghttp2_session_callbacks_set_on_frame_send_callback(c, &H2Connection::on_frame_send);
    nghttp2_session_callbacks_set_send_data_callback(c, &H2Connection::on_send_data);
    nghttp2_session_callbacks_set_on_begin_frame_callback(c, &H2Connection::on_begin_frame);
    return c;
  }();
  return cbs;
}

H2Connection::H2Connection(std::unique_ptr<TlsStream> stream, Role role, Settings settings)
    : stream_(std::move(stream)),
      role_(role),
      settings_(settings),
      in_(kReadBufferBytes),
      read_buf_(kReadBufferBytes),
      keepalive_(stream_->get_executor()) {
  plain_.reserve(kWriteBatchBytes + kMaxFrameSize + 64);
  take_over_tls();
  nghttp2_option* opt = nullptr;
  nghttp2_option_new(&opt);
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_option_set_max_send_header_block_length(opt, 64 * 1024);
  // The library's own flood guards stay on, looser than ours, so that ours (which answer with
  // ENHANCE_YOUR_CALM and are counted) act first.
  nghttp2_option_set_max_continuations(opt, settings_.max_continuations + 8);
  nghttp2_option_set_stream_reset_rate_limit(opt, 2ull * settings_.reset_burst + 100,
                                             2ull * settings_.resets_per_second + 100);
  if (role_ == Role::kServer) {
    nghttp2_session_server_new2(&session_, callbacks(), this, opt);
  } else {
    nghttp2_session_client_new2(&session_, callbacks(), this, opt);
  }
  nghttp2_option_del(opt);
  last_frame_ = idle_since_ = reset_refill_ = std::chrono::steady_clock::now();
  reset_tokens_ = settings_.reset_burst;
}

H2Connection::~H2Connection() {
  if (session_ != nullptr) nghttp2_session_del(session_);
  // The SSL object (and with it our BIO) goes with stream_, after this body: nothing may reach
  // this connection through the BIO any more.
  if (ssl_ != nullptr && SSL_get_rbio(ssl_) != nullptr) BIO_set_data(SSL_get_rbio(ssl_), nullptr);
}

void H2Connection::take_over_tls() {
  ssl_ = stream_->native_handle();
  auto& socket = stream_->next_layer();
  fd_ = socket.native_handle();
  boost::system::error_code ec;
  socket.non_blocking(true, ec);
  // asio's BIO pair may still hold records that came with the end of the handshake (the peer's
  // first frames); they become the start of our receive buffer. (asio hands everything it reads
  // to the pair while the handshake runs, so nothing else is left behind.)
  BIO* old = SSL_get_rbio(ssl_);
  while (old != nullptr) {
    if (in_len_ == in_.size()) in_.resize(in_.size() * 2);
    int n = BIO_read(old, in_.data() + in_len_, static_cast<int>(in_.size() - in_len_));
    if (n <= 0) break;
    in_len_ += static_cast<size_t>(n);
  }
  // asio sends all handshake output before it reports completion; anything left would be lost.
  if (old != nullptr && BIO_ctrl_wpending(old) != 0) takeover_failed_ = true;
  // asio asks for partial writes (SSL_write returns after each record); one call per batch here.
  SSL_clear_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE);
  // The context releases OpenSSL's record buffers whenever they are empty, which suits
  // connections that sit in a handshake or idle; an established HBONE connection would then
  // allocate and free both (about 17 KiB each) for every small message. Keep them for its life.
  SSL_clear_mode(ssl_, SSL_MODE_RELEASE_BUFFERS);
  // Take a whole buffer of records from our BIO per call, not a 5-byte header and then a body.
  SSL_set_read_ahead(ssl_, 1);
  BIO* bio = BIO_new(TlsBio::method());
  BIO_set_data(bio, this);
  SSL_set_bio(ssl_, bio, bio);  // frees asio's half of the pair; asio frees the other
}

int H2Connection::take_cleartext(uint8_t* to, size_t len, size_t* got) {
  size_t n = std::min(len, in_len_ - in_pos_);
  std::memcpy(to, in_.data() + in_pos_, n);
  in_pos_ += n;
  *got = n;
  return n > 0 ? 1 : 0;
}

bool H2Connection::start() {
  if (takeover_failed_) return false;
  bool server = role_ == Role::kServer;
  std::vector<nghttp2_settings_entry> iv = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS,
       server ? kLibraryStreamLimit : settings_.max_concurrent_streams},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, settings_.stream_window},
      {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, kMaxFrameSize},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, settings_.max_header_list_bytes},
  };
  // A tunnel client has no use for server push (RFC 9113 6.5.2; ztunnel's client says the same).
  if (!server) iv.push_back({NGHTTP2_SETTINGS_ENABLE_PUSH, 0});
  settings_patched_ = !server;
  if (nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, iv.data(), iv.size()) != 0) {
    return false;
  }
  if (nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0,
                                            static_cast<int32_t>(settings_.connection_window)) !=
      0) {
    return false;
  }
  schedule_write();
  read_loop();
  arm_keepalive();
  return true;
}

uint32_t H2Connection::stream_limit() const {
  uint32_t remote =
      nghttp2_session_get_remote_settings(session_, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
  return std::min(remote, settings_.max_concurrent_streams);
}

std::shared_ptr<H2Stream> H2Connection::open_connect(const std::string& authority,
                                                     const HeaderList& headers,
                                                     H2Stream::Handlers handlers) {
  if (!usable() || role_ != Role::kClient || streams_.size() >= stream_limit()) return nullptr;
  static const std::string kMethod = ":method", kConnect = "CONNECT", kAuthority = ":authority";
  std::vector<nghttp2_nv> nva;
  nva.push_back(make_nv(kMethod, kConnect));
  nva.push_back(make_nv(kAuthority, authority));
  for (const auto& h : headers) nva.push_back(make_nv(h.name, h.value));
  auto stream = std::make_shared<H2Stream>(shared_from_this(), 0);
  stream->set_handlers(std::move(handlers));
  nghttp2_data_provider provider{};
  provider.source.ptr = stream.get();
  provider.read_callback = data_source_read;
  int32_t id = nghttp2_submit_request(session_, nullptr, nva.data(), nva.size(), &provider,
                                      stream.get());
  if (id < 0) {
    SM_WARN("h2") << "submit CONNECT failed: " << nghttp2_strerror(id);
    stream->connection_.reset();
    return nullptr;
  }
  stream->id_ = id;
  streams_.emplace(id, stream);
  schedule_write();
  return stream;
}

void H2Connection::shutdown_gracefully() {
  if (closed_ || going_away_) return;
  going_away_ = true;
  if (role_ == Role::kServer) {
    nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(session_), NGHTTP2_NO_ERROR,
                          nullptr, 0);
  } else {
    nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE, 0, NGHTTP2_NO_ERROR, nullptr, 0);
  }
  schedule_write();
  if (streams_.empty()) maybe_close();
}

void H2Connection::abort(const std::string& reason) { close_transport(reason); }

H2Stream* H2Connection::find_stream(int32_t id) {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second.get();
}

void H2Connection::read_loop() {
  if (closed_ || reading_) return;
  on_readable();
}

void H2Connection::on_readable() {
  auto self = shared_from_this();  // a handler may drop the last other reference
  for (int round = 0; round < kReadRounds; ++round) {
    // Decrypt everything that is there (reading the socket when OpenSSL wants more), up to a
    // buffer of plaintext, then hand it to nghttp2 in one call.
    size_t plain = 0;
    bool want_input = false;
    bool eof = false;
    std::string error;
    while (plain < read_buf_.size()) {
      size_t got = 0;
      uint8_t* to = read_buf_.data() + plain;
      size_t room = read_buf_.size() - plain;
      int rv = cleartext_ ? take_cleartext(to, room, &got) : SSL_read_ex(ssl_, to, room, &got);
      if (rv == 1) {
        plain += got;
        // All the ciphertext there was is decrypted and OpenSSL holds nothing back: another
        // SSL_read_ex would only fail with WANT_READ (and a drained socket is not read again).
        if (!cleartext_ && socket_drained_ && in_pos_ == in_len_ && SSL_has_pending(ssl_) == 0) {
          want_input = true;
          break;
        }
        continue;
      }
      int e = cleartext_ ? SSL_ERROR_WANT_READ : SSL_get_error(ssl_, rv);
      if (e == SSL_ERROR_WANT_READ) {  // in_ is used up
        if (socket_drained_) {
          want_input = true;
          break;
        }
        ssize_t n = ::recv(fd_, in_.data(), in_.size(), 0);
        if (n > 0) {
          in_pos_ = 0;
          in_len_ = static_cast<size_t>(n);
          socket_drained_ = in_len_ < in_.size();
          continue;
        }
        if (n == 0) {
          eof = true;
        } else if (errno == EINTR) {
          continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
          want_input = true;
        } else {
          error = std::strerror(errno);
        }
        break;
      }
      if (e == SSL_ERROR_ZERO_RETURN) {
        eof = true;  // close_notify
      } else {
        error = tls_error_text(e);
      }
      break;
    }
    if (plain > 0) {
      last_frame_ = std::chrono::steady_clock::now();
      ping_outstanding_ = false;
      ++in_nghttp2_;
      ssize_t rv = nghttp2_session_mem_recv(session_, read_buf_.data(), plain);
      // Still counted as inside nghttp2: the window updates of what the streams write now go
      // out in the one write below.
      end_read_batch();
      --in_nghttp2_;
      if (rv < 0 && calmed_) {
        // calm_down() stopped nghttp2 and queued the GOAWAY; it goes out below.
      } else if (rv < 0) {
        SM_WARN("h2") << "protocol error from peer: " << nghttp2_strerror(static_cast<int>(rv));
        nghttp2_session_terminate_session(session_, NGHTTP2_PROTOCOL_ERROR);
        close_reason_ = std::string("protocol error: ") + nghttp2_strerror(static_cast<int>(rv));
      }
    }
    schedule_write();
    if (closed_) return;
    if (eof) {
      close_transport("peer closed the connection");
      return;
    }
    if (!error.empty()) {
      close_transport("read failed: " + error);
      return;
    }
    if (nghttp2_session_want_read(session_) == 0) {
      maybe_close();
      return;
    }
    if (want_input) {
      receive_socket();
      return;
    }
  }
  // More is there: let the other connections of this thread have a turn first.
  reading_ = true;
  boost::asio::post(executor(), [self] {
    self->reading_ = false;
    if (!self->closed_) self->on_readable();
  });
}

// Why a read and not async_wait: asio's async_wait re-arms the socket in epoll (epoll_ctl) every
// time, while a read operation keeps the registration it has. asio 1.18 (Boost 1.74) still tries
// the socket once before it waits, so after a short read of ours that try is the EAGAIN we no
// longer make ourselves (socket_drained_): one message through a proxy costs an epoll_wait and
// two recv on this socket instead of those and an epoll_ctl (bench/hbone_profile.py counts them).
// That try also means no byte is left behind when a short read did not empty the socket (a
// socket in the sockmap bypass, read by tcp_bpf, can answer short with bytes still queued).
void H2Connection::receive_socket() {
  reading_ = true;
  stream_->next_layer().async_read_some(
      boost::asio::buffer(in_.data(), in_.size()),
      [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
        self->reading_ = false;
        if (self->closed_) return;
        if (ec == boost::asio::error::eof) {
          self->close_transport("peer closed the connection");
          return;
        }
        if (ec) {
          self->close_transport("read failed: " + ec.message());
          return;
        }
        self->in_pos_ = 0;
        self->in_len_ = n;
        self->socket_drained_ = n < self->in_.size();
        self->on_readable();
      });
}

void H2Connection::end_read_batch() {
  auto streams = std::move(batch_streams_);
  batch_streams_.clear();
  for (auto& stream : streams) {
    stream->in_read_batch_ = false;
    if (stream->closed_ || !stream->handlers_.on_batch_end) continue;
    auto on_batch_end = stream->handlers_.on_batch_end;  // it may replace the handlers
    on_batch_end();
  }
  if (batch_streams_.empty()) {  // keep the vector's capacity for the next read
    streams.clear();
    batch_streams_.swap(streams);
  }
}

void H2Connection::schedule_write() {
  // Inside nghttp2 the outer caller (on_readable, or this loop) writes once nghttp2 returns.
  if (closed_ || writing_ || in_nghttp2_ > 0) return;
  for (int round = 0;; ++round) {
    if (out_.size() - out_pos_ < kWriteBatchBytes) {
      if (out_pos_ > 0) {  // keep only what the socket has not taken yet
        out_.erase(out_.begin(), out_.begin() + static_cast<std::ptrdiff_t>(out_pos_));
        out_pos_ = 0;
      }
      // Gather frames (DATA payloads are appended by on_send_data), then encrypt them at once.
      plain_.clear();
      while (plain_.size() < kWriteBatchBytes) {
        const uint8_t* data = nullptr;
        ++in_nghttp2_;
        ssize_t n = nghttp2_session_mem_send(session_, &data);
        --in_nghttp2_;
        if (n < 0) {
          close_transport(std::string("nghttp2 send failed: ") +
                          nghttp2_strerror(static_cast<int>(n)));
          return;
        }
        if (closed_) return;  // a stream-close handler aborted the connection
        if (n == 0) break;
        size_t at = plain_.size();
        append(plain_, data, static_cast<size_t>(n));
        if (!settings_patched_) patch_advertised_settings(plain_.data() + at, plain_.size() - at);
      }
      if (!plain_.empty() && cleartext_) {
        append(out_, plain_.data(), plain_.size());
      } else if (!plain_.empty()) {
        size_t written = 0;
        // SSL_get_error below needs an empty error queue. Clearing it when it is already empty
        // (nearly always) costs 32 free() calls in OpenSSL 3.0, so look first.
        if (ERR_peek_error() != 0) ERR_clear_error();
        int rv = SSL_write_ex(ssl_, plain_.data(), plain_.size(), &written);
        if (rv != 1 || written != plain_.size()) {  // our BIO takes everything: not expected
          close_transport("TLS write failed: " + tls_error_text(SSL_get_error(ssl_, rv)));
          return;
        }
      }
    }
    size_t pending = out_.size() - out_pos_;
    if (pending == 0) {
      maybe_close();
      return;
    }
    ssize_t n = ::send(fd_, out_.data() + out_pos_, pending, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_writable();
        return;
      }
      close_transport(std::string("write failed: ") + std::strerror(errno));
      return;
    }
    out_pos_ += static_cast<size_t>(n);
    if (out_pos_ == out_.size()) {
      out_.clear();
      out_pos_ = 0;
    }
    if (round + 1 >= kWriteRounds) {
      // Still busy: let the other connections of this thread have a turn first.
      writing_ = true;
      boost::asio::post(executor(), [self = shared_from_this()] {
        self->writing_ = false;
        self->schedule_write();
      });
      return;
    }
  }
}

void H2Connection::wait_writable() {
  writing_ = true;
  stream_->next_layer().async_wait(
      boost::asio::socket_base::wait_write,
      [self = shared_from_this()](const boost::system::error_code& ec) {
        self->writing_ = false;
        if (self->closed_) return;
        if (ec) {
          self->close_transport("write failed: " + ec.message());
          return;
        }
        self->schedule_write();
      });
}

void H2Connection::maybe_close() {
  if (closed_ || writing_ || out_pos_ < out_.size()) return;
  bool done = (nghttp2_session_want_read(session_) == 0 &&
               nghttp2_session_want_write(session_) == 0) ||
              (going_away_ && streams_.empty());
  if (done) close_transport(close_reason_.empty() ? "session finished" : close_reason_);
}

void H2Connection::arm_keepalive() {
  bool pinging = settings_.ping_interval.count() > 0;
  bool idling = role_ == Role::kServer && settings_.idle_timeout.count() > 0;
  if (closed_ || (!pinging && !idling)) return;
  auto period = std::chrono::milliseconds::max();
  if (pinging) period = settings_.ping_interval / 2;
  if (idling) {
    period = std::min(period, std::max(settings_.idle_timeout / 4, std::chrono::milliseconds(10)));
  }
  keepalive_.expires_after(period);
  keepalive_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
    auto self = weak.lock();
    if (ec || !self || self->closed_) return;
    auto now = std::chrono::steady_clock::now();
    auto& s = self->settings_;
    if (self->role_ == Role::kServer && s.idle_timeout.count() > 0 && self->streams_.empty() &&
        !self->going_away_ && now - self->idle_since_ >= s.idle_timeout) {
      SM_DEBUG("h2") << "closing a connection with no stream for " << s.idle_timeout.count()
                     << " ms";
      self->close_reason_ = "idle: no stream for " + std::to_string(s.idle_timeout.count()) + " ms";
      self->notify_limit(Limit::kIdle);
      self->shutdown_gracefully();
      if (self->closed_) return;
    }
    if (s.ping_interval.count() <= 0) {
      self->arm_keepalive();
      return;
    }
    auto quiet = now - self->last_frame_;
    if (quiet >= self->settings_.ping_timeout) {
      self->close_transport("keepalive: no frame from peer for " +
                            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                               quiet)
                                               .count()) +
                            " ms");
      return;
    }
    if (quiet >= self->settings_.ping_interval && !self->ping_outstanding_) {
      self->ping_outstanding_ = true;
      nghttp2_submit_ping(self->session_, NGHTTP2_FLAG_NONE, nullptr);
      self->schedule_write();
    }
    self->arm_keepalive();
  });
}

void H2Connection::close_transport(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  auto self = shared_from_this();
  keepalive_.cancel();
  boost::system::error_code ignored;
  stream_->lowest_layer().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
  stream_->lowest_layer().close(ignored);
  auto streams = std::move(streams_);
  streams_.clear();
  for (auto& [id, s] : streams) s->on_closed(NGHTTP2_CANCEL);
  SM_DEBUG("h2") << "connection closed: " << reason;
  if (close_handler_) {
    auto handler = std::move(close_handler_);
    close_handler_ = nullptr;
    handler(reason);
  }
  request_handler_ = nullptr;
}

// ---------------------------------------------------------------------------------------------
// nghttp2 callbacks

int H2Connection::on_begin_headers(nghttp2_session*, const nghttp2_frame* frame, void* user) {
  auto* self = static_cast<H2Connection*>(user);
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  if (self->role_ != Role::kServer) return 0;
  if (self->streams_.size() >= self->settings_.max_concurrent_streams) {
    // Over the advertised limit: this stream only is refused (RFC 9113 5.1.2); it never reaches
    // the request handler, and its headers and DATA are dropped. Refusals count like resets, so a
    // peer cannot turn them into a flood either.
    SM_DEBUG("h2") << "stream " << frame->hd.stream_id
                   << " refused: " << self->settings_.max_concurrent_streams << " streams are open";
    nghttp2_submit_rst_stream(self->session_, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
                              NGHTTP2_REFUSED_STREAM);
    self->notify_limit(Limit::kRefusedStream);
    return self->charge_reset() ? 0 : NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  auto stream = std::make_shared<H2Stream>(self->shared_from_this(), frame->hd.stream_id);
  self->streams_.emplace(frame->hd.stream_id, std::move(stream));
  self->idle_since_ = std::chrono::steady_clock::now();
  return 0;
}

int H2Connection::on_header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                            size_t namelen, const uint8_t* value, size_t valuelen, uint8_t,
                            void* user) {
  auto* self = static_cast<H2Connection*>(user);
  H2Stream* stream = self->find_stream(frame->hd.stream_id);
  if (stream == nullptr) return 0;
  std::string_view n(reinterpret_cast<const char*>(name), namelen);
  std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  auto& req = stream->request_;
  req.header_bytes += namelen + valuelen + 32;
  if (req.header_bytes > self->settings_.max_header_list_bytes) {
    req.oversized = true;
    return 0;  // keep the count; the request is answered 431 once complete
  }
  if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
    if (n == ":method") {
      req.method = v;
    } else if (n == ":authority") {
      req.authority = v;
    } else if (n == ":scheme") {
      req.scheme = v;
    } else if (n == ":path") {
      req.path = v;
    } else if (n == ":protocol") {
      req.protocol = v;
    } else {
      req.headers.push_back({std::string(n), std::string(v)});
    }
  } else {
    // Response (client side): reuse request_.headers for the response headers and
    // request_.method for :status; both are read back in on_frame_recv.
    if (n == ":status") {
      req.method = v;
    } else {
      req.headers.push_back({std::string(n), std::string(v)});
    }
  }
  return 0;
}

int H2Connection::on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user) {
  auto* self = static_cast<H2Connection*>(user);
  if (frame->hd.type == NGHTTP2_GOAWAY) {
    self->peer_going_away_ = true;
    return 0;
  }
  if (frame->hd.type == NGHTTP2_RST_STREAM && self->role_ == Role::kServer) {
    return self->charge_reset() ? 0 : NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
  auto it = self->streams_.find(frame->hd.stream_id);
  if (it == self->streams_.end()) return 0;
  auto stream = it->second;  // keep alive across handler calls
  if (frame->hd.type == NGHTTP2_HEADERS && (frame->hd.flags & NGHTTP2_FLAG_END_HEADERS) != 0) {
    if (frame->headers.cat == NGHTTP2_HCAT_REQUEST && self->role_ == Role::kServer) {
      if (self->request_handler_) self->request_handler_(stream);
    } else if (frame->headers.cat == NGHTTP2_HCAT_RESPONSE && self->role_ == Role::kClient) {
      int status = std::atoi(stream->request_.method.c_str());
      auto headers = std::move(stream->request_.headers);
      stream->request_.headers.clear();
      // A copy: the handler usually installs the relay's handlers, replacing itself.
      auto on_response = stream->handlers_.on_response;
      if (on_response) on_response(status, headers);
    }
  }
  if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0 && !stream->closed_) {
    auto on_end = stream->handlers_.on_end;
    if (on_end) {
      on_end();
    } else if (self->role_ == Role::kServer && !stream->refused_) {
      stream->early_end_ = true;  // e.g. CONNECT with END_STREAM, target not dialled yet
    }
  }
  return 0;
}

int H2Connection::on_frame_send(nghttp2_session* session, const nghttp2_frame* frame,
                                void* user) {
  auto* self = static_cast<H2Connection*>(user);
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  H2Stream* stream = self->find_stream(frame->hd.stream_id);
  if (stream != nullptr && stream->reset_after_response_) {
    stream->reset_after_response_ = false;
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
  }
  return 0;
}

int H2Connection::on_data_chunk(nghttp2_session*, uint8_t, int32_t stream_id, const uint8_t* data,
                                size_t len, void* user) {
  auto* self = static_cast<H2Connection*>(user);
  H2Stream* stream = self->find_stream(stream_id);
  if (stream != nullptr && self->role_ == Role::kServer && !stream->handlers_.on_data &&
      !stream->refused_) {
    // Not answered yet (the target is still being dialled): keep the bytes for the consumer.
    stream->early_data_.append(data, len);
    return 0;
  }
  if (stream == nullptr || !stream->handlers_.on_data) {
    // Nobody reads this stream (e.g. data after a refusal): give the window back.
    nghttp2_session_consume(self->session_, stream_id, len);
    return 0;
  }
  if (!stream->in_read_batch_) {
    stream->in_read_batch_ = true;
    self->batch_streams_.push_back(stream->shared_from_this());
  }
  stream->handlers_.on_data(data, len);
  return 0;
}

int H2Connection::on_send_data(nghttp2_session*, nghttp2_frame* frame, const uint8_t* framehd,
                               size_t length, nghttp2_data_source* source, void* user) {
  auto* self = static_cast<H2Connection*>(user);
  auto* stream = static_cast<H2Stream*>(source->ptr);
  if (stream->queued_bytes_ < length) return NGHTTP2_ERR_CALLBACK_FAILURE;  // cannot happen
  auto& out = self->plain_;
  append(out, framehd, 9);
  size_t padding = frame->data.padlen;  // includes the Pad Length byte; we never ask for any
  if (padding > 0) out.push_back(static_cast<uint8_t>(padding - 1));
  stream->write_data(out, length);
  if (padding > 1) out.resize(out.size() + padding - 1, 0);
  // One mem_send call would otherwise go on through every DATA frame the windows allow (up to
  // the 16 MiB connection window) before it returns: end the batch here.
  return out.size() >= kWriteBatchBytes ? NGHTTP2_ERR_PAUSE : 0;
}

int H2Connection::on_stream_close(nghttp2_session*, int32_t stream_id, uint32_t error_code,
                                  void* user) {
  auto* self = static_cast<H2Connection*>(user);
  auto it = self->streams_.find(stream_id);
  if (it == self->streams_.end()) return 0;
  auto stream = std::move(it->second);
  self->streams_.erase(it);
  if (self->streams_.empty()) self->idle_since_ = std::chrono::steady_clock::now();
  stream->on_closed(error_code);
  if (self->going_away_ && self->streams_.empty()) {
    boost::asio::post(self->executor(), [weak = self->weak_from_this()] {
      if (auto s = weak.lock()) s->maybe_close();
    });
  }
  return 0;
}

int H2Connection::on_begin_frame(nghttp2_session*, const nghttp2_frame_hd* hd, void* user) {
  auto* self = static_cast<H2Connection*>(user);
  if (self->role_ != Role::kServer) return 0;
  if (hd->type == NGHTTP2_HEADERS) {
    self->continuations_ = 0;
  } else if (hd->type == NGHTTP2_CONTINUATION &&
             ++self->continuations_ > self->settings_.max_continuations) {
    self->calm_down(Limit::kContinuationFlood,
                    "more than " + std::to_string(self->settings_.max_continuations) +
                        " CONTINUATION frames in one header block");
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Abuse limits (server side)

bool H2Connection::charge_reset() {
  if (calmed_) return false;
  auto now = std::chrono::steady_clock::now();
  double elapsed = std::chrono::duration<double>(now - reset_refill_).count();
  reset_refill_ = now;
  reset_tokens_ = std::min<double>(settings_.reset_burst,
                                   reset_tokens_ + elapsed * settings_.resets_per_second);
  if (reset_tokens_ >= 1) {
    reset_tokens_ -= 1;
    return true;
  }
  calm_down(Limit::kRapidReset, "streams reset or refused faster than " +
                                    std::to_string(settings_.resets_per_second) +
                                    "/s after a burst of " + std::to_string(settings_.reset_burst));
  return false;
}

void H2Connection::calm_down(Limit limit, const std::string& why) {
  if (calmed_ || closed_) return;
  calmed_ = true;
  SM_WARN("h2") << "closing connection with GOAWAY(ENHANCE_YOUR_CALM): " << why;
  close_reason_ = "enhance your calm: " + why;
  notify_limit(limit);
  // Queues the GOAWAY; nghttp2 then stops reading and the connection closes once it is sent.
  nghttp2_session_terminate_session(session_, NGHTTP2_ENHANCE_YOUR_CALM);
}

void H2Connection::notify_limit(Limit limit) {
  if (limit_handler_) limit_handler_(limit);
}

void H2Connection::patch_advertised_settings(uint8_t* p, size_t len) {
  // Walks whole frames of one nghttp2 output chunk to our first SETTINGS (not an ACK).
  size_t i = 0;
  while (i + 9 <= len) {
    size_t n = (size_t{p[i]} << 16) | (size_t{p[i + 1]} << 8) | p[i + 2];
    uint8_t type = p[i + 3], flags = p[i + 4];
    if (i + 9 + n > len) return;
    if (type == NGHTTP2_SETTINGS && (flags & NGHTTP2_FLAG_ACK) == 0) {
      for (size_t e = i + 9; e + 6 <= i + 9 + n; e += 6) {
        uint16_t id = static_cast<uint16_t>((p[e] << 8) | p[e + 1]);
        if (id != NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS) continue;
        uint32_t v = settings_.max_concurrent_streams;
        p[e + 2] = static_cast<uint8_t>(v >> 24);
        p[e + 3] = static_cast<uint8_t>(v >> 16);
        p[e + 4] = static_cast<uint8_t>(v >> 8);
        p[e + 5] = static_cast<uint8_t>(v);
      }
      settings_patched_ = true;
      return;
    }
    i += 9 + n;
  }
}

}  // namespace sockmesh::h2
