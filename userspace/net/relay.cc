#include "net/relay.h"

#include <boost/asio/write.hpp>

#include "net/sockets.h"

namespace sockmesh::net {

TcpRelay::TcpRelay(Tcp::socket a, Tcp::socket b, size_t buffer_bytes)
    : a_(std::move(a)), b_(std::move(b)), ab_{&a_, &b_}, ba_{&b_, &a_}, buffer_bytes_(buffer_bytes) {
  reset_unless_closed_gracefully(a_);
  reset_unless_closed_gracefully(b_);
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

void TcpRelay::pump(Direction& d, bool a_to_b) {
  if (finished_) return;
  if (d.buffer.size() != buffer_bytes_) d.buffer.resize(buffer_bytes_);
  boost::system::error_code ec;
  size_t n = d.from->read_some(boost::asio::buffer(d.buffer), ec);
  if (ec == boost::asio::error::would_block) {
    // Nothing to read: give the buffer back while waiting, so idle connections cost no buffers.
    Bytes().swap(d.buffer);
    d.from->async_wait(Tcp::socket::wait_read,
                       [self = shared_from_this(), &d, a_to_b](const boost::system::error_code& e) {
                         if (self->finished_) return;
                         if (e) {
                           self->fail("wait: " + e.message());
                           return;
                         }
                         self->pump(d, a_to_b);
                       });
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
  boost::asio::async_write(
      *d.to, boost::asio::buffer(d.buffer.data(), n),
      [self = shared_from_this(), &d, a_to_b](const boost::system::error_code& wec,
                                               size_t written) {
        if (self->finished_) return;
        if (wec) {
          self->fail("write: " + wec.message());
          return;
        }
        d.bytes += written;
        if (self->progress_) self->progress_(a_to_b, written);
        self->pump(d, a_to_b);
      });
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
