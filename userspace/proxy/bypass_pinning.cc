#include "proxy/bypass_pinning.h"

#include <atomic>
#include <string>

#include "base/log.h"

namespace sockmesh::proxy {
namespace {

// A map write the kernel refused: counted each time, said once per kind with what it costs.
void count_refusal(observe::Counter& failures, std::atomic<bool>& warned, const std::string& error,
                   const char* consequence) {
  failures.inc();
  if (!warned.exchange(true)) SM_WARN("proxy") << "bypass: " << error << "; " << consequence;
}

std::atomic<bool> pin_refusal_warned{false};
std::atomic<bool> release_refusal_warned{false};

}  // namespace

std::function<void()> on_read_paused(BypassExit exit) {
  if (!exit) return nullptr;
  return [exit = std::move(exit)] { exit(BypassExitReason::kReadPaused); };
}

BypassPinning::BypassPinning(std::string pin_root, observe::Registry& metrics,
                             std::chrono::milliseconds retry)
    : pin_root_(std::move(pin_root)),
      retry_(retry),
      pinned_(metrics.counter("sockmesh_bypass_flows_pinned_total",
                              "Bypassed app flows sent back to the TCP stack because the proxy "
                              "stopped reading them (its other side was blocked)")),
      two_way_(metrics.counter("sockmesh_bypass_flows_two_way_total",
                               "Bypassed app flows of a tunnel sent back to the TCP stack because "
                               "the app answered what it was sent (request and response), so "
                               "that its ACKs ride on its answers")),
      spliced_(metrics.counter("sockmesh_bypass_flows_spliced_total",
                               "Bypassed app flows of a plain relay (passthrough, inbound "
                               "plaintext) sent back to the TCP stack so that the proxy can "
                               "splice them instead of copying")),
      pin_failures_(metrics.counter("sockmesh_bypass_pin_failures_total",
                                    "Bypassed app flows the proxy could not pin to the TCP stack "
                                    "(their bytes keep queueing without TCP flow control)")),
      release_failures_(metrics.counter(
          "sockmesh_bypass_release_failures_total",
          "Pinned app flows whose socket the proxy could not take out of the sockmap bypass (a "
          "blocking recv() of that app can see EAGAIN without data; see OPERATING 5.1)")) {}

bool BypassPinning::available() { return flows() != nullptr; }

std::shared_ptr<const maps::BypassFlows> BypassPinning::flows() {
  using Clock = std::chrono::steady_clock;
  std::lock_guard lock(mu_);
  if (flows_ && flows_->proxy_map_arrived()) {
    SM_INFO("proxy") << "bypass: the loader under " << pin_root_
                     << " now has sm_bypass_proxy; opening the maps again";
    flows_.reset();
    next_try_ = {};
  } else if (flows_ && Clock::now() >= next_pin_check_) {
    next_pin_check_ = Clock::now() + retry_;
    if (!flows_->still_pinned()) {
      // Reinstalled or upgraded: connections made from now on are in the new maps.
      SM_WARN("proxy") << "bypass maps under " << pin_root_
                       << " were recreated by the loader; opening the new ones";
      flows_.reset();
      next_try_ = {};
    }
  }
  if (flows_ || Clock::now() < next_try_) return flows_;
  next_try_ = Clock::now() + retry_;
  if (pin_root_.empty()) {
    if (!logged_missing_) {
      SM_INFO("proxy") << "no BPF pin root: bypassed app flows are not pinned to the TCP stack";
      logged_missing_ = true;
    }
    next_try_ = Clock::time_point::max();
    return nullptr;
  }
  auto opened = maps::BypassFlows::open(pin_root_);
  if (!opened) {
    if (!logged_missing_) {
      SM_INFO("proxy") << "bypass maps not usable (" << opened.error().message
                       << "): app flows are not pinned to the TCP stack when reading pauses";
      logged_missing_ = true;
    }
    return nullptr;
  }
  flows_ = std::make_shared<const maps::BypassFlows>(std::move(opened).value());
  next_pin_check_ = Clock::now() + retry_;
  SM_INFO("proxy") << "bypass maps under " << pin_root_
                   << " open: an app flow whose proxy socket stops being read goes to the stack";
  return flows_;
}

BypassPinning::ExitFacts BypassPinning::ExitCounters::facts(BypassExitReason why) const {
  switch (why) {
    case BypassExitReason::kReadPaused:
      return {pinned, "reading paused", "this flow keeps queueing without flow control"};
    case BypassExitReason::kTwoWay:
      return {two_way, "request and response", "this flow keeps its own ACK per message"};
    case BypassExitReason::kSplice:
      break;
  }
  return {spliced, "relayed by splice", "this flow is copied, not spliced"};
}

BypassExit BypassPinning::exit_handler(int fd) {
  auto map = flows();
  if (!map) return nullptr;
  auto own = maps::flow_of_socket(fd);
  if (!own) {
    SM_DEBUG("proxy") << "bypass: cannot read the flow of a socket: " << own.error().message;
    return nullptr;
  }
  if (!map->bypassed(*own)) return nullptr;
  // The handler may outlive this object (a relay's last handler); the counters are the registry's.
  ExitCounters counters{&pinned_, &two_way_, &spliced_, &pin_failures_, &release_failures_};
  return [counters, map, app = own->reversed(), done = false,
          on_stack = false](BypassExitReason why) mutable {
    if (done) return on_stack;
    done = true;  // a pinned flow stays pinned: once is enough, and a failure is not retried
    const ExitFacts facts = counters.facts(why);
    if (auto s = map->pin_to_stack(app); !s) {
      count_refusal(*counters.pin_failures, pin_refusal_warned, s.error().message, facts.unpinned);
      return false;
    }
    on_stack = true;
    facts.counter->inc();
    // The flow will not come back to the redirect, so the app's socket leaves sm_bypass: its
    // receive path is TCP's again (see BypassFlows::release_app_socket for why that matters).
    if (auto s = map->release_app_socket(app); !s) {
      count_refusal(*counters.release_failures, release_refusal_warned, s.error().message,
                    "the app's socket keeps sockmap's receive path");
    }
    SM_DEBUG("proxy") << "bypass: " << facts.what << ", app flow " << app.to_string()
                      << " pinned to the TCP stack and its socket out of the bypass";
    return true;
  };
}

}  // namespace sockmesh::proxy
