#include "net/splice_relay.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>

#include "base/errno_text.h"
#include "base/log.h"
#include "net/sockets.h"

namespace sockmesh::net {
namespace {
// splice calls per turn of one direction before it yields to other work on the worker.
constexpr int kBurstSplices = 16;
constexpr unsigned kSpliceFlags = SPLICE_F_MOVE | SPLICE_F_NONBLOCK;
// How long after a drain ends each splice first looks for a straggler: a send that was past
// sk_msg's check when the pin landed, still putting bytes into the psock queue. That send is
// mid-flight (sk_msg's verdict, then the enqueue): microseconds, unless its thread is preempted
// in between, which on a busy node can last some milliseconds. After the window, a wake that
// finds TCP's queue empty and the end of stream still look (one recvmsg each).
constexpr auto kStragglerWindow = std::chrono::milliseconds(100);

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

void SpliceRelay::drain_redirected_first(bool from_a, bool from_b) {
  ab_.draining = from_a;
  ba_.draining = from_b;
}

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
  for (Direction* d : {&ab_, &ba_}) {
    if (!d->draining) continue;
    if (!enable_inq_hint(d->from->native_handle())) {
      // Without the hint the end of the psock queue cannot be told: copy for good (correct, and
      // what the relay did for every bypassed socket before).
      SM_WARN("net") << "splice relay: " << errno_text("setsockopt(TCP_INQ)")
                     << "; copying this bypassed direction for its whole life";
    }
  }
  pump(ab_, true);
  pump(ba_, false);
}

void SpliceRelay::pump_when(Tcp::socket& socket, Tcp::socket::wait_type what, Direction& d,
                            bool a_to_b) {
  if (what == Tcp::socket::wait_read) d.woken = true;  // until a splice takes bytes
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
    if (d.held_sent < d.held.size()) {
      if (!send_held(d, a_to_b)) return;
      continue;
    }
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
    if (d.draining) {
      if (!drain_read(d, a_to_b)) return;
      continue;
    }
    // While a straggler (bytes redirected after the drain) can still arrive, each splice is
    // preceded by a look at the psock queue, so that nothing behind a straggler goes on.
    if (d.watch_until) {
      if (std::chrono::steady_clock::now() >= *d.watch_until) {
        d.watch_until.reset();
      } else if (redirected_after_drain(d)) {
        return;
      }
    }
    ssize_t n = splice(d.from->native_handle(), nullptr, d.pipe.write_end, nullptr, pipe_bytes_,
                       kSpliceFlags);
    if (n > 0) {
      d.in_pipe = static_cast<size_t>(n);
      d.woken = false;
      continue;
    }
    if (n == 0) {
      if (d.was_drained && redirected_after_drain(d)) return;
      d.eof = true;
      continue;
    }
    int err = errno;
    if (err == EINTR) continue;
    if (would_block(err)) {
      // Past the straggler window: a wake that finds TCP's queue empty looks at the psock queue
      // (bytes there would end every wait at once).
      if (d.was_drained && !d.watch_until && d.woken && redirected_after_drain(d)) return;
      pump_when(*d.from, Tcp::socket::wait_read, d, a_to_b);
      return;
    }
    if (splice_refused(err) && nothing_moved()) {
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

bool SpliceRelay::nothing_moved() const {
  for (const Direction* d : {&ab_, &ba_}) {
    if (d->bytes != 0 || d->in_pipe != 0 || !d->held.empty()) return false;
  }
  return true;
}

bool SpliceRelay::redirected_after_drain(Direction& d) {
  // tcp_bpf's recvmsg() serves the psock queue first, and without the TCP_INQ hint: a byte read
  // that way was redirected after the drain ended (an app sending from two threads at once, one
  // of them past sk_msg's check when the pin landed). It belongs before bytes already spliced:
  // say so and reset, rather than deliver it out of order or leave it behind.
  char byte = 0;
  bool from_tcp = false;
  ssize_t n =
      recv_with_inq_hint(d.from->native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT, &from_tcp);
  if (n <= 0 || from_tcp) return false;
  SM_WARN("net") << "splice relay: bytes were redirected into a bypassed socket after its "
                 << "flow was pinned to the stack; resetting the connection";
  fail("bytes redirected after the flow left the bypass");
  return true;
}

bool SpliceRelay::send_held(Direction& d, bool a_to_b) {
  ssize_t n = ::send(d.to->native_handle(), d.held.data() + d.held_sent,
                     d.held.size() - d.held_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n > 0) {
    d.held_sent += static_cast<size_t>(n);
    d.bytes += static_cast<uint64_t>(n);
    if (progress_) progress_(a_to_b, static_cast<size_t>(n));
    if (d.held_sent == d.held.size()) {
      d.held_sent = 0;
      d.held.clear();
      if (!d.draining) Bytes().swap(d.held);  // drained: splice from now on
    }
    return true;
  }
  int err = n < 0 ? errno : EPIPE;
  if (err == EINTR) return true;
  if (would_block(err)) {
    pump_when(*d.to, Tcp::socket::wait_write, d, a_to_b);
  } else {
    fail("write: " + errno_text(err));
  }
  return false;
}

bool SpliceRelay::drain_read(Direction& d, bool a_to_b) {
  d.held.resize(pipe_bytes_);
  bool from_tcp = false;
  ssize_t n = recv_with_inq_hint(d.from->native_handle(), d.held.data(), d.held.size(),
                                 MSG_DONTWAIT, &from_tcp);
  if (n < 0) {
    int err = errno;
    Bytes().swap(d.held);  // an idle relay holds no buffer
    if (err == EINTR) return true;
    if (would_block(err)) {
      pump_when(*d.from, Tcp::socket::wait_read, d, a_to_b);
    } else {
      fail("read: " + errno_text(err));
    }
    return false;
  }
  // The first hinted read means the psock queue was empty and TCP's had data: what the app sends
  // after its pin goes through TCP behind everything it redirected.
  d.held.resize(static_cast<size_t>(n));
  d.held_sent = 0;
  if (!from_tcp) d.drained += static_cast<uint64_t>(n);
  if (n == 0) d.eof = true;
  if (from_tcp || n == 0) {
    d.draining = false;
    d.was_drained = true;  // TCP_INQ stays on: redirected_after_drain() tells queues apart by it
    d.watch_until = std::chrono::steady_clock::now() + kStragglerWindow;
    SM_DEBUG("net") << "splice relay: drained " << d.drained
                    << " redirected bytes; splicing from here";
    if (n == 0) Bytes().swap(d.held);
  }
  return true;
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
