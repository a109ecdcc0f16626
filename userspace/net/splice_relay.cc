#include "net/splice_relay.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>

#include "base/errno_text.h"
#include "base/log.h"
#include "net/sockets.h"

namespace sockmesh::net {
namespace {
// splice calls per turn of one direction before it yields to other work on the worker.
constexpr int kBurstSplices = 16;
constexpr unsigned kSpliceFlags = SPLICE_F_MOVE | SPLICE_F_NONBLOCK;

bool would_block(int err) { return err == EAGAIN || err == EWOULDBLOCK; }
// What a kernel says when it cannot splice these descriptors at all.
bool splice_refused(int err) { return err == EINVAL || err == ENOSYS || err == EOPNOTSUPP; }

}  // namespace

SpliceRelay::SpliceRelay(Tcp::socket a, Tcp::socket b, size_t pipe_bytes)
    : a_(std::move(a)), b_(std::move(b)), ab_{&a_, &b_}, ba_{&b_, &a_}, pipe_bytes_(pipe_bytes) {
  reset_unless_closed_gracefully(a_);
  reset_unless_closed_gracefully(b_);
  limit_relay_buffers(a_);
  limit_relay_buffers(b_);
}

SpliceRelay::~SpliceRelay() { close_pipes(); }

void SpliceRelay::start(Done done, Progress progress) {
  done_ = std::move(done);
  progress_ = std::move(progress);
  for (Direction* d : {&ab_, &ba_}) {
    int fds[2];
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
      SM_WARN("net") << "splice relay: " << errno_text("pipe2")
                     << "; relaying this connection by copying";
      fall_back();
      return;
    }
    d->pipe = {fds[0], fds[1]};
    // Best effort: the default (16 pages) also works, in smaller steps.
    fcntl(fds[1], F_SETPIPE_SZ, static_cast<int>(pipe_bytes_));
  }
  boost::system::error_code ec;
  a_.non_blocking(true, ec);
  b_.non_blocking(true, ec);
  pump(ab_, true);
  pump(ba_, false);
}

void SpliceRelay::pump_when(Tcp::socket& socket, Tcp::socket::wait_type what, Direction& d,
                            bool a_to_b) {
  socket.async_wait(what,
                    [self = shared_from_this(), &d, a_to_b](const boost::system::error_code& e) {
                      if (self->finished_) return;
                      if (e) {
                        self->fail("wait: " + e.message());
                        return;
                      }
                      self->pump(d, a_to_b);
                    });
}

void SpliceRelay::pump(Direction& d, bool a_to_b) {
  // A burst is bounded so that one busy connection cannot starve the others on its worker.
  for (int burst = 0; burst < kBurstSplices; ++burst) {
    if (finished_) return;
    if (d.in_pipe > 0) {
      ssize_t n =
          splice(d.pipe.read_end, nullptr, d.to->native_handle(), nullptr, d.in_pipe, kSpliceFlags);
      if (n > 0) {
        d.in_pipe -= static_cast<size_t>(n);
        d.bytes += static_cast<uint64_t>(n);
        if (progress_) progress_(a_to_b, static_cast<size_t>(n));
        continue;
      }
      int err = n < 0 ? errno : EPIPE;
      if (err == EINTR) continue;
      if (!would_block(err)) {
        fail("write: " + errno_text(err));
        return;
      }
      // The destination is not taking bytes: `from` is not read until it took these (TCP's
      // window then pushes back on the sender, as with TcpRelay).
      pump_when(*d.to, Tcp::socket::wait_write, d, a_to_b);
      return;
    }
    if (d.eof) {
      finish_direction(d);
      return;
    }
    ssize_t n = splice(d.from->native_handle(), nullptr, d.pipe.write_end, nullptr, pipe_bytes_,
                       kSpliceFlags);
    if (n > 0) {
      d.in_pipe = static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      d.eof = true;
      continue;
    }
    int err = errno;
    if (err == EINTR) continue;
    if (would_block(err)) {
      pump_when(*d.from, Tcp::socket::wait_read, d, a_to_b);
      return;
    }
    if (splice_refused(err) && ab_.bytes + ba_.bytes + ab_.in_pipe + ba_.in_pipe == 0) {
      SM_WARN("net") << "splice relay: the kernel refused splice from a TCP socket ("
                     << errno_text(err) << "); relaying this connection by copying";
      fall_back();
      return;
    }
    fail("read: " + errno_text(err));
    return;
  }
  boost::asio::post(a_.get_executor(), [self = shared_from_this(), &d, a_to_b] {
    if (!self->finished_) self->pump(d, a_to_b);
  });
}

void SpliceRelay::fall_back() {
  // Our waits end (operation_aborted) and find finished_ set; the sockets go to the copier.
  finished_ = true;
  boost::system::error_code ec;
  a_.cancel(ec);
  b_.cancel(ec);
  close_pipes();
  fallback_ = std::make_shared<TcpRelay>(std::move(a_), std::move(b_));
  fallback_->start(std::move(done_), std::move(progress_));
}

void SpliceRelay::finish_direction(Direction& d) {
  d.done = true;
  boost::system::error_code ec;
  d.to->shutdown(Tcp::socket::shutdown_send, ec);
  maybe_done();
}

void SpliceRelay::maybe_done() {
  if (finished_ || !ab_.done || !ba_.done) return;
  finished_ = true;
  close_pipes();
  close_gracefully(a_);
  close_gracefully(b_);
  if (done_) done_(Result{ab_.bytes, ba_.bytes, error_});
}

void SpliceRelay::fail(const std::string& error) {
  if (finished_) return;
  error_ = error;
  close_with_reset(a_);
  close_with_reset(b_);
  close_pipes();
  finished_ = true;
  if (done_) done_(Result{ab_.bytes, ba_.bytes, error_});
}

void SpliceRelay::abort(const std::string& reason) {
  if (fallback_) {
    fallback_->abort(reason);
    return;
  }
  fail(reason);
}

void SpliceRelay::close_pipes() {
  for (Direction* d : {&ab_, &ba_}) {
    for (int* fd : {&d->pipe.read_end, &d->pipe.write_end}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }
}

}  // namespace sockmesh::net
