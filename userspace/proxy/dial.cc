#include "proxy/dial.h"

#include <boost/asio/steady_timer.hpp>
#include <memory>

#include "base/log.h"

namespace sockmesh::proxy {
namespace {

// A source port the proxy chose itself (net::choose_source_port) is checked free with sock_diag
// and then bound; between the two, a dial on another worker thread to the same destination can
// take the same four-tuple, and connect() fails with EADDRNOTAVAIL. Then the dial starts over
// with another port, this many times in all, within the one deadline.
constexpr int kConnectAttempts = 3;

struct State {
  boost::asio::ip::tcp::socket socket;
  boost::asio::steady_timer timer;
  Endpoint target;
  net::DialOptions options;
  DialResult result;
  DialCallback done;
  int attempts = 0;
  bool settled = false;  // the result is decided (by the connect or by the deadline)
  State(boost::asio::io_context& io, const Endpoint& t, const net::DialOptions& o)
      : socket(io), timer(io), target(t), options(o) {}

  void finish() {
    auto cb = std::move(done);
    cb(result, std::move(socket));
  }
};

// asio waited for the connect by adding EPOLLOUT to the socket's registration: without a fresh
// one, each wait of a relay for readability on this socket would be reported at once
// (net::register_for_reading). bench/hbone_profile.py showed it on the server side of each
// tunnel, as an epoll_wait that returned without a read.
void connect(const std::shared_ptr<State>& s) {
  ++s->attempts;
  if (auto err = net::prepare_dial(s->socket, s->target, s->options, &s->result.source_kept)) {
    s->settled = true;
    s->timer.cancel();
    s->result.error = *err;
    s->finish();
    return;
  }
  s->socket.async_connect(net::to_asio(s->target), [s](const boost::system::error_code& ec) {
    if (s->settled) return;
    // (With a bound source, EADDRNOTAVAIL from connect() means its four-tuple is in use.)
    bool port_taken = ec == boost::system::errc::address_not_available && s->result.source_kept;
    if (port_taken && s->attempts < kConnectAttempts) {
      SM_INFO("net") << "connect " << s->target.to_string()
                     << ": the chosen source port was taken meanwhile; trying another";
      boost::system::error_code ignored;
      s->socket.close(ignored);
      connect(s);
      return;
    }
    s->settled = true;
    s->timer.cancel();
    if (ec) {
      s->result.error = "connect " + s->target.to_string() + ": " + ec.message();
    } else if (auto rec = net::register_for_reading(s->socket)) {
      s->result.error = "connect " + s->target.to_string() +
                        ": registering the connected socket again: " + rec.message();
    } else {
      s->result.ok = true;
    }
    s->finish();
  });
}

}  // namespace

void dial(boost::asio::io_context& io, const Endpoint& target, const net::DialOptions& options,
          std::chrono::milliseconds timeout, DialCallback done) {
  auto s = std::make_shared<State>(io, target, options);
  s->done = std::move(done);
  // The deadline and the connect complete on the same thread, but either completion may already
  // be queued when the other runs (cancel() cannot recall it). Whichever runs first decides the
  // result and sets `settled`; the other then does nothing. So a connect that completes at the
  // deadline is either a success with an open socket or a timeout with a closed one, never a
  // success on a socket the deadline has closed.
  s->timer.expires_after(timeout);
  s->timer.async_wait([s](const boost::system::error_code& ec) {
    if (ec || s->settled) return;
    s->settled = true;
    boost::system::error_code ignored;
    s->socket.close(ignored);  // the pending connect then completes with an error, ignored
    s->result.timed_out = true;
    s->result.error = "connect " + s->target.to_string() + ": timed out";
    auto cb = std::move(s->done);
    cb(s->result, boost::asio::ip::tcp::socket(s->socket.get_executor()));
  });
  connect(s);
}

}  // namespace sockmesh::proxy
