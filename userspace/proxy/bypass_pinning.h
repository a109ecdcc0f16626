#pragma once
// Sending a bypassed app flow back to the TCP stack (sm_stack_flows): for backpressure, when the
// proxy stops reading the app's bypassed socket, so that TCP's window stops the app; and for a
// tunnelled flow that turns out to be request and response, whose ACKs then ride on its answers;
// and for a flow the proxy relays with splice(2), which reads TCP's receive queue only.
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "loader/maps/bypass_flows.h"
#include "observe/metrics.h"

namespace sockmesh::proxy {

// Why a relay sends a bypassed app flow back to the TCP stack.
enum class BypassExitReason {
  kReadPaused,  // the relay stopped reading the proxy's socket: its other side is blocked
  // The app answered what it was sent, twice (TunnelRelay): request and response. While its
  // answers go through sk_msg its own TCP socket never sends data, so TCP acknowledges every
  // message it gets with a pure ACK; on the stack the ACK rides on the answer.
  kTwoWay,
  // A plain relay (passthrough, inbound plaintext) splices this flow: splice reads the proxy
  // socket's TCP receive queue, never the psock queue sk_msg redirects into (net::SpliceRelay).
  kSplice,
};
// Sends one bypassed app flow back to the TCP stack; acts on its first call only, and belongs to
// the socket's worker thread. True when the flow is on the stack path now (false: the kernel
// refused the pin, counted and said; every later call answers as the first did).
using BypassExit = std::function<bool(BypassExitReason)>;
// `exit` as a relay that only pauses runs it (nullptr when `exit` is).
std::function<void()> on_read_paused(BypassExit exit);

// The proxy's side of the sockmap bypass (bpf/bypass.bpf.c): an app's sends into a bypassed proxy
// socket are redirected into its ingress queue, which nothing bounds, so not reading that socket
// does not slow the app. When a relay stops reading such a socket, the app's flow is pinned to the
// TCP stack, whose receive window then stops the app within its socket buffers. Best effort:
// without the maps (no pin root, sockmesh not installed) nothing is pinned, said once, and the
// proxy serves as before.
class BypassPinning {
 public:
  // `pin_root`: where the loader pinned its maps (empty: none). Opened on first use and, while
  // missing, tried again at most every `retry`: short, because the proxy usually starts before
  // its node agent installs the maps, and a connection served meanwhile is never pinned.
  BypassPinning(std::string pin_root, observe::Registry& metrics,
                std::chrono::milliseconds retry = std::chrono::milliseconds(250));

  // Whether the maps are open (tries to open them if the last try is older than `retry`).
  bool available();
  // False when no pin root was given: the proxy runs without the sockmap bypass.
  bool configured() const { return !pin_root_.empty(); }

  // For the proxy's connected socket `fd` towards an app: what a relay runs to send the app's flow
  // back to the stack, or nullptr when the socket is not bypassed. Decided once per socket, right
  // after accept or connect: sockops put both ends into sm_bypass when the connection was
  // established.
  BypassExit exit_handler(int fd);
  // exit_handler(fd) for a relay that only pauses.
  std::function<void()> read_paused_handler(int fd) { return on_read_paused(exit_handler(fd)); }

 private:
  std::shared_ptr<const maps::BypassFlows> flows();
  // Per reason: its counter, what the debug log says, and what a refused pin costs.
  struct ExitFacts {
    observe::Counter* counter;
    const char* what;
    const char* unpinned;
  };
  struct ExitCounters {
    observe::Counter* pinned;
    observe::Counter* two_way;
    observe::Counter* spliced;
    observe::Counter* pin_failures;
    observe::Counter* release_failures;
    ExitFacts facts(BypassExitReason why) const;
  };

  const std::string pin_root_;
  const std::chrono::milliseconds retry_;
  observe::Counter& pinned_;
  observe::Counter& two_way_;
  observe::Counter& spliced_;
  observe::Counter& pin_failures_;
  observe::Counter& release_failures_;
  std::mutex mu_;
  std::shared_ptr<const maps::BypassFlows> flows_;
  std::chrono::steady_clock::time_point next_try_{};
  std::chrono::steady_clock::time_point next_pin_check_{};
  bool logged_missing_ = false;
};

}  // namespace sockmesh::proxy
