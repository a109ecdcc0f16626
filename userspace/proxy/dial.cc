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
    bool timed_out = false;
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
  s->timer.expires_after(timeout);
  s->timer.async_wait([s](const boost::system::error_code& ec) {
    if (ec) return;
    s->timed_out = true;
    boost::system::error_code ignored;
    s->socket.close(ignored);
  });
  s->socket.async_connect(net::to_asio(target), [s, target](const boost::system::error_code& ec) {
    s->timer.cancel();
    if (ec) {
      s->result.timed_out = s->timed_out;
      s->result.error = "connect " + target.to_string() + ": " +
                        (s->timed_out ? std::string("timed out") : ec.message());
    } else {
      s->result.ok = true;
    }
    auto cb = std::move(s->done);
    cb(s->result, std::move(s->socket));
  });
}

}  // namespace sockmesh::proxy
