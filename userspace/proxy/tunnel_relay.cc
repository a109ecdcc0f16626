#include "proxy/tunnel_relay.h"

#include <span>

#include "net/sockets.h"

namespace sockmesh::proxy {
namespace {
// A DATA frame at least this large is written straight from nghttp2's buffer when nothing is
// queued: for it the copy into the queue would cost about what batching saves. (16 KiB is the
// frame size most HTTP/2 peers send by default.)
constexpr size_t kDirectWriteBytes = 16 * 1024;
// Queued runs per gather write: 1 MiB of 64 KiB chunks, more than a socket buffer takes at once.
constexpr size_t kGatherRuns = 16;
}  // namespace

TunnelRelay::TunnelRelay(std::shared_ptr<Tcp::socket> socket, std::shared_ptr<h2::H2Stream> stream)
    : socket_holder_(std::move(socket)), socket_(*socket_holder_), stream_(std::move(stream)) {
  net::reset_unless_closed_gracefully(socket_);
  net::limit_relay_buffers(socket_);
}

void TunnelRelay::start(Done done, Progress progress) {
  done_ = std::move(done);
  progress_ = std::move(progress);
  attach();
  started_ = true;
  boost::system::error_code ec;
  socket_.non_blocking(true, ec);  // reads and writes are tried first, then waited for
  write_socket();
  read_socket();
}

void TunnelRelay::attach() {
  if (attached_) return;
  attached_ = true;
  // The stream holds its handlers, the handlers hold the relay: that keeps the relay alive for
  // as long as the stream is open, without a cycle once the stream closes.
  auto self = shared_from_this();
  h2::H2Stream::Handlers h;
  h.on_data = [self](const uint8_t* data, size_t len) { self->on_stream_data(data, len); };
  h.on_batch_end = [self] { self->write_socket(); };
  h.on_end = [self] { self->on_stream_end(); };
  h.on_close = [self](uint32_t code) { self->on_stream_close(code); };
  h.on_writable = [self] {
    if (self->paused_) {
      self->paused_ = false;
      self->read_socket();
    }
  };
  stream_->set_handlers(std::move(h));
}

void TunnelRelay::read_socket() {
  if (!started_ || finished_ || reading_ || socket_eof_ || paused_) return;
  // Read what is there now; wait for readability only when there is nothing, so that an idle
  // tunnel holds no buffer. A burst is bounded so that one busy tunnel cannot starve the others.
  for (int burst = 0; burst < 8; ++burst) {
    Bytes buf(net::kRelayBufferBytes);
    boost::system::error_code ec;
    size_t n = socket_.read_some(boost::asio::buffer(buf), ec);
    if (ec == boost::asio::error::would_block) break;
    if (ec == boost::asio::error::eof) {
      socket_eof_ = true;
      stream_->finish();
      maybe_finish();
      return;
    }
    if (ec) {
      fail("socket read: " + ec.message(), true);
      return;
    }
    buf.resize(n);
    app_spoke_ = true;
    result_.bytes_to_stream += n;
    if (progress_) progress_(true, n);
    if (!stream_->send(std::move(buf))) {
      fail("tunnel closed while sending", true);
      return;
    }
    if (stream_->above_high_watermark()) {
      paused_ = true;  // on_writable resumes
      if (bypass_exit_) bypass_exit_(BypassExitReason::kReadPaused);
      return;
    }
    // Not paused, but far behind a bypassed app (its sends are queued without limit): the same.
    if (bypass_exit_ && n == net::kRelayBufferBytes &&
        net::unread_bytes(socket_) > net::kMaxUnreadBeforePause) {
      bypass_exit_(BypassExitReason::kReadPaused);
    }
    // A short read took what was queued: wait now rather than make a read that says EAGAIN.
    // The wait re-arms the socket in epoll (epoll_ctl), and re-arming reports it readable at
    // once if bytes are still there (a bypassed socket, read by tcp_bpf, can answer short with
    // more queued), so nothing is left behind.
    if (n < net::kRelayBufferBytes) break;
  }
  if (registration_stale_ && !writing_) {
    registration_stale_ = false;
    if (auto ec = net::register_for_reading(socket_)) {
      fail("registering the socket again: " + ec.message(), true);
      return;
    }
  }
  reading_ = true;
  socket_.async_wait(Tcp::socket::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       self->reading_ = false;
                       if (self->finished_) return;
                       if (ec) {
                         self->fail("socket wait: " + ec.message(), true);
                         return;
                       }
                       self->read_socket();
                     });
}

void TunnelRelay::on_stream_data(const uint8_t* data, size_t len) {
  if (finished_) {
    stream_->consume(len);
    return;
  }
  if (app_spoke_ && len > 0 && answers_ < kTwoWayAnswers) {
    app_spoke_ = false;
    // Before the write: the app's answer to these bytes then goes through TCP with its ACK.
    if (++answers_ == kTwoWayAnswers && bypass_exit_) bypass_exit_(BypassExitReason::kTwoWay);
  }
  if (started_ && !writing_ && pending_.empty() && len >= kDirectWriteBytes) {
    // Usually the socket has room: write straight from nghttp2's buffer, no copy.
    boost::system::error_code ec;
    size_t n = socket_.write_some(boost::asio::buffer(data, len), ec);
    if (ec && ec != boost::asio::error::would_block) {
      fail("socket write: " + ec.message(), true);
      return;
    }
    if (!ec) {
      wrote_to_socket(n);
      data += n;
      len -= n;
      if (len == 0) return;
    }
  }
  // Written with the rest of this read's frames at on_batch_end (or when the socket takes more).
  pending_.append(data, len);
}

void TunnelRelay::wrote_to_socket(size_t n) {
  result_.bytes_to_socket += n;
  if (progress_) progress_(false, n);
  // Only now may the peer send more: the window follows what the application has taken.
  stream_->consume(n);
}

void TunnelRelay::write_socket() {
  if (!started_ || writing_ || finished_) return;
  while (!pending_.empty()) {
    std::span<const uint8_t> runs[kGatherRuns];
    boost::asio::const_buffer bufs[kGatherRuns];
    size_t count = pending_.gather(runs);
    for (size_t i = 0; i < count; ++i) {
      bufs[i] = boost::asio::buffer(runs[i].data(), runs[i].size());
    }
    boost::system::error_code ec;
    size_t n = socket_.write_some(std::span<const boost::asio::const_buffer>(bufs, count), ec);
    if (ec == boost::asio::error::would_block) {
      writing_ = true;
      socket_.async_wait(Tcp::socket::wait_write,
                         [self = shared_from_this()](const boost::system::error_code& wait_ec) {
                           self->writing_ = false;
                           self->registration_stale_ = true;
                           if (self->finished_) return;
                           if (wait_ec) {
                             self->fail("socket wait: " + wait_ec.message(), true);
                             return;
                           }
                           self->write_socket();
                         });
      return;
    }
    if (ec) {
      fail("socket write: " + ec.message(), true);
      return;
    }
    pending_.consume(n);
    wrote_to_socket(n);
    if (finished_) return;  // a progress handler may abort the relay
  }
  if (stream_ended_ && !socket_shut_) {
    socket_shut_ = true;
    boost::system::error_code ec;
    socket_.shutdown(Tcp::socket::shutdown_send, ec);
  }
  maybe_finish();
}

void TunnelRelay::on_stream_end() {
  stream_ended_ = true;
  write_socket();
}

void TunnelRelay::on_stream_close(uint32_t error_code) {
  stream_closed_ = true;
  if (finished_) return;
  if (error_code != 0) {
    fail(std::string("tunnel reset: ") + h2::error_code_name(error_code), false);
    return;
  }
  // A clean close means both ends sent END_STREAM; finish once the socket has everything.
  stream_ended_ = true;
  write_socket();
}

void TunnelRelay::maybe_finish() {
  if (finished_) return;
  // Done when the peer's data has all been written and shut, and our side has ended too (or the
  // stream is gone, so nothing more can be sent).
  bool our_side_done = socket_eof_ || stream_closed_;
  if (!our_side_done || !stream_ended_ || writing_ || !pending_.empty() || !socket_shut_) return;
  finished_ = true;
  net::close_gracefully(socket_);
  if (done_) {
    auto done = std::move(done_);
    done_ = nullptr;
    done(result_);
  }
}

void TunnelRelay::fail(const std::string& error, bool reset_stream) {
  if (finished_) return;
  finished_ = true;
  result_.error = error;
  pending_.clear();  // never to be written: free it now, not when the last handler goes
  net::close_with_reset(socket_);
  if (reset_stream && !stream_closed_) stream_->reset(NGHTTP2_CANCEL);
  if (done_) {
    auto done = std::move(done_);
    done_ = nullptr;
    done(result_);
  }
}

void TunnelRelay::abort(const std::string& reason) { fail(reason, true); }

}  // namespace sockmesh::proxy
