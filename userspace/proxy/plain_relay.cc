#include "proxy/plain_relay.h"

#include <memory>

#include "net/splice_relay.h"

namespace sockmesh::proxy {
namespace {

bool bypass_state_known(ProxyContext& ctx) {
  return !ctx.bypass_pinning || !ctx.bypass_pinning->configured() ||
         ctx.bypass_pinning->available();
}

}  // namespace

PlainRelay start_plain_relay(ProxyContext& ctx, net::Tcp::socket a, net::Tcp::socket b,
                             net::TcpRelay::ReadPaused a_paused, net::TcpRelay::ReadPaused b_paused,
                             net::TcpRelay::Done done, net::TcpRelay::Progress progress) {
  bool splice = ctx.config.splice_passthrough && !a_paused && !b_paused && bypass_state_known(ctx);
  if (ctx.metrics != nullptr) {
    ctx.metrics
        ->counter("sockmesh_plain_relays_total",
                  "Connections relayed without a tunnel, by how the bytes were moved: splice "
                  "(in the kernel) or copy (through user space: a bypassed socket, or "
                  "--splice-passthrough false)",
                  {{"relay", splice ? "splice" : "copy"}})
        .inc();
  }
  if (splice) {
    auto relay = std::make_shared<net::SpliceRelay>(std::move(a), std::move(b));
    std::weak_ptr<net::SpliceRelay> weak = relay;
    relay->start(std::move(done), std::move(progress));
    return {[weak](const std::string& reason) {
              if (auto r = weak.lock()) r->abort(reason);
            },
            true};
  }
  auto relay = std::make_shared<net::TcpRelay>(std::move(a), std::move(b));
  std::weak_ptr<net::TcpRelay> weak = relay;
  relay->on_read_paused(std::move(a_paused), std::move(b_paused));
  relay->start(std::move(done), std::move(progress));
  return {[weak](const std::string& reason) {
            if (auto r = weak.lock()) r->abort(reason);
          },
          false};
}

}  // namespace sockmesh::proxy
