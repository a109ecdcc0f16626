#include "net/relay.h"

#include <sys/socket.h>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include "net/sockets.h"

namespace sockmesh::net {
namespace {
// Reads per turn of one direction before it yields to other work on the worker.
constexpr int kBurstReads = 8;

}  // namespace

TcpRelay::TcpRelay(Tcp::socket a, Tcp::socket b, size_t buffer_bytes)
    : a_(std::move(a)),
      b_(std::move(b)),
      ab_{&a_, &b_},
      ba_{&b_, &a_},
      buffer_bytes_(buffer_bytes) {
  reset_unless_closed_gracefully(a_);
  reset_unless_closed_gracefully(b_);
  limit_relay_buffers(a_);
  limit_relay_buffers(b_);
}

void TcpRelay::start(Done done, Progress progress) {
  done_ = std::move(done);
  progress_ = std::move(progress);
  boost::system::error_code ec;
  a_.non_blocking(true, ec);
  b_.non_blocking(true, ec);
  pump(ab_, true);
  pump(ba_, false);
}

void TcpRelay::on_read_paused(ReadPaused a, ReadPaused b) {
  ab_.read_paused = std::move(a);
  ba_.read_paused = std::move(b);
}

void TcpRelay::pump(Direction& d, bool a_to_b) {
  // A burst is bounded so that one busy connection cannot starve the others on its worker.
  for (int burst = 0; burst < kBurstReads; ++burst) {
    if (finished_) return;
    if (d.buffer.size() != buffer_bytes_) d.buffer.resize(buffer_bytes_);
    boost::system::error_code ec;
    size_t n = d.from->read_some(boost::asio::buffer(d.buffer), ec);
    if (ec == boost::asio::error::would_block) {
      wait_readable(d, a_to_b);
      return;
    }
    if (ec == boost::asio::error::eof) {
      finish_direction(d);
      return;
    }
    if (ec) {
      fail("read: " + ec.message());
      return;
    }
    // Usually the other side has room: write at once. Trying here, rather than only through
    // async_write, is what tells a pause (the write would block) from a write that completes.
    size_t written = d.to->write_some(boost::asio::buffer(d.buffer.data(), n), ec);
    if (ec == boost::asio::error::would_block) {
      written = 0;
    } else if (ec) {
      fail("write: " + ec.message());
      return;
    }
    if (written > 0 && !wrote(d, a_to_b, written)) return;
    if (written == n) {
      // Keeping up with every write, but perhaps not with the peer: far behind is a pause too.
      if (d.read_paused && n == d.buffer.size() && unread_bytes(*d.from) > kMaxUnreadBeforePause) {
        d.read_paused();
        if (finished_) return;
      }
      // A short read took what was queued: wait now rather than make a read that says EAGAIN
      // (one system call per message less). The wait re-arms the socket in epoll, which reports
      // it readable at once if bytes or a FIN came meanwhile, or are still queued (a socket in
      // the sockmap bypass can answer short with more there), so nothing is left behind.
      if (n < d.buffer.size()) {
        wait_readable(d, a_to_b);
        return;
      }
      continue;
    }
    if (d.read_paused) d.read_paused();
    if (finished_) return;  // the handler may abort the relay
    d.writing = true;
    boost::asio::async_write(
        *d.to, boost::asio::buffer(d.buffer.data() + written, n - written),
        [self = shared_from_this(), &d, a_to_b](const boost::system::error_code& wec, size_t rest) {
          d.writing = false;
          d.to_registration_stale = true;
          if (self->finished_) return;
          if (wec) {
            self->fail("write: " + wec.message());
            return;
          }
          if (self->wrote(d, a_to_b, rest)) self->pump(d, a_to_b);
        });
    return;
  }
  boost::asio::post(d.from->get_executor(), [self = shared_from_this(), &d, a_to_b] {
    if (!self->finished_) self->pump(d, a_to_b);
  });
}

void TcpRelay::wait_readable(Direction& d, bool a_to_b) {
  // Give the buffer back while waiting, so idle connections cost no buffers.
  Bytes().swap(d.buffer);
  // The other direction writes to d.from: if one of its writes waited, register d.from afresh
  // before waiting on it (no operation is pending on it now: this is its only reader).
  Direction& other = &d == &ab_ ? ba_ : ab_;
  if (other.to_registration_stale && !other.writing) {
    other.to_registration_stale = false;
    if (auto ec = register_for_reading(*d.from)) {
      fail("registering the socket again: " + ec.message());
      return;
    }
  }
  d.from->async_wait(Tcp::socket::wait_read,
                     [self = shared_from_this(), &d, a_to_b](const boost::system::error_code& e) {
                       if (self->finished_) return;
                       if (e) {
                         self->fail("wait: " + e.message());
                         return;
                       }
                       self->pump(d, a_to_b);
                     });
}

bool TcpRelay::wrote(Direction& d, bool a_to_b, size_t n) {
  d.bytes += n;
  if (progress_) progress_(a_to_b, n);
  return !finished_;
}

void TcpRelay::finish_direction(Direction& d) {
  d.done = true;
  boost::system::error_code ec;
  d.to->shutdown(Tcp::socket::shutdown_send, ec);
  maybe_done();
}

void TcpRelay::maybe_done() {
  if (finished_ || !ab_.done || !ba_.done) return;
  finished_ = true;
  close_gracefully(a_);
  close_gracefully(b_);
  if (done_) done_(Result{ab_.bytes, ba_.bytes, error_});
}

void TcpRelay::fail(const std::string& error) {
  if (finished_) return;
  error_ = error;
  close_with_reset(a_);
  close_with_reset(b_);
  finished_ = true;
  if (done_) done_(Result{ab_.bytes, ba_.bytes, error_});
}

void TcpRelay::abort(const std::string& reason) { fail(reason); }

}  // namespace sockmesh::net
