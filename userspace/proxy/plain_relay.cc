#include "proxy/plain_relay.h"

#include <memory>

#include "net/splice_relay.h"

namespace sockmesh::proxy {
namespace {

bool bypass_state_known(ProxyContext& ctx) {
  return !ctx.bypass_pinning || !ctx.bypass_pinning->configured() ||
         ctx.bypass_pinning->available();
}

void count_choice(ProxyContext& ctx, bool splice) {
  if (ctx.metrics == nullptr) return;
  ctx.metrics
      ->counter("sockmesh_plain_relays_total",
                "Connections relayed without a tunnel, by how the bytes were moved: splice "
                "(in the kernel) or copy (through user space: two bypassed apps on this node, a "
                "bypassed flow the kernel would not pin, or --splice-passthrough false)",
                {{"relay", splice ? "splice" : "copy"}})
      .inc();
}

}  // namespace

PlainRelay start_plain_relay(ProxyContext& ctx, net::Tcp::socket a, net::Tcp::socket b,
                             BypassExit a_exit, BypassExit b_exit, net::TcpRelay::Done done,
                             net::TcpRelay::Progress progress) {
  // Two bypassed apps (the same-node fast path): both hops skip TCP, which beats splicing them
  // (README, rows (2) and (3)). One bypassed app (passthrough, inbound plaintext): its flow goes
  // back to the stack so that the relay can splice it.
  bool splice = ctx.config.splice_passthrough && bypass_state_known(ctx) && !(a_exit && b_exit);
  if (splice && a_exit) splice = a_exit(BypassExitReason::kSplice);
  if (splice && b_exit) splice = b_exit(BypassExitReason::kSplice);
  count_choice(ctx, splice);
  if (splice) {
    auto relay = std::make_shared<net::SpliceRelay>(std::move(a), std::move(b));
    relay->drain_redirected_first(a_exit != nullptr, b_exit != nullptr);
    std::weak_ptr<net::SpliceRelay> weak = relay;
    relay->start(std::move(done), std::move(progress));
    return {[weak](const std::string& reason) {
              if (auto r = weak.lock()) r->abort(reason);
            },
            true};
  }
  auto relay = std::make_shared<net::TcpRelay>(std::move(a), std::move(b));
  std::weak_ptr<net::TcpRelay> weak = relay;
  relay->on_read_paused(on_read_paused(std::move(a_exit)), on_read_paused(std::move(b_exit)));
  relay->start(std::move(done), std::move(progress));
  return {[weak](const std::string& reason) {
            if (auto r = weak.lock()) r->abort(reason);
          },
          false};
}

}  // namespace sockmesh::proxy
