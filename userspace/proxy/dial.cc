#include "proxy/dial.h"

#include <boost/asio/steady_timer.hpp>
#include <memory>

namespace sockmesh::proxy {

void dial(boost::asio::io_context& io, const Endpoint& target, const net::DialOptions& options,
          std::chrono::milliseconds timeout, DialCallback done) {
  struct State {
    boost::asio::ip::tcp::socket socket;
    boost::asio::steady_timer timer;
    DialResult result;
    DialCallback done;
    bool settled = false;  // the result is decided (by the connect or by the deadline)
    explicit State(boost::asio::io_context& io) : socket(io), timer(io) {}
  };
  auto s = std::make_shared<State>(io);
  s->done = std::move(done);
  if (auto err = net::prepare_dial(s->socket, target, options, &s->result.source_kept)) {
    s->result.error = *err;
    auto cb = std::move(s->done);
    cb(s->result, std::move(s->socket));
    return;
  }
  // The deadline and the connect complete on the same thread, but either completion may already
  // be queued when the other runs (cancel() cannot recall it). Whichever runs first decides the
  // result and sets `settled`; the other then does nothing. So a connect that completes at the
  // deadline is either a success with an open socket or a timeout with a closed one, never a
  // success on a socket the deadline has closed.
  s->timer.expires_after(timeout);
  s->timer.async_wait([s, target](const boost::system::error_code& ec) {
    if (ec || s->settled) return;
    s->settled = true;
    boost::system::error_code ignored;
    s->socket.close(ignored);  // the pending connect then completes with an error, ignored
    s->result.timed_out = true;
    s->result.error = "connect " + target.to_string() + ": timed out";
    auto cb = std::move(s->done);
    cb(s->result, boost::asio::ip::tcp::socket(s->socket.get_executor()));
  });
  s->socket.async_connect(net::to_asio(target), [s, target](const boost::system::error_code& ec) {
    if (s->settled) return;
    s->settled = true;
    s->timer.cancel();
    if (ec) {
      s->result.error = "connect " + target.to_string() + ": " + ec.message();
    } else {
      s->result.ok = true;
    }
    auto cb = std::move(s->done);
    cb(s->result, std::move(s->socket));
  });
}

}  // namespace sockmesh::proxy
