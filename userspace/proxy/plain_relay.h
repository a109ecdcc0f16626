#pragma once
// The relay of a connection that is not tunnelled (outbound passthrough, inbound plaintext):
// splice(2) (net::SpliceRelay) where it is safe, the copying net::TcpRelay otherwise.
//
// Safe means: --splice-passthrough is on, and an app-facing socket in the sockmap bypass had its
// app's flow pinned to the TCP stack first. Bytes sk_msg redirects into a bypassed socket wait on
// its psock's ingress queue, which splice never reads (loader_bypass_pinning_test
// SpliceDoesNotSeeRedirectedBytes): the relay reads what was redirected before the pin by copying,
// then splices (net::SpliceRelay::drain_redirected_first). When both sockets are bypassed (two apps
// on this node) the relay copies: the redirect skips TCP on both hops, which costs less than
// splicing. When the bypass maps are configured but not open, the proxy cannot tell whether a
// socket is bypassed, so it copies.
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <string>

#include "net/relay.h"
#include "proxy/context.h"

namespace sockmesh::proxy {

struct PlainRelay {
  std::function<void(const std::string& reason)> abort;  // resets both sides; safe after the end
  bool spliced = false;
};

// Starts relaying `a` <-> `b`. `a_exit`/`b_exit`: ProxyContext::bypass_exit() of the app-facing
// socket(s), null for a socket that is not bypassed; run with kSplice before splicing, or as the
// copying relay's read-paused hook. Counts the choice in
// sockmesh_plain_relays_total{relay="splice"|"copy"}.
PlainRelay start_plain_relay(ProxyContext& ctx, net::Tcp::socket a, net::Tcp::socket b,
                             BypassExit a_exit, BypassExit b_exit, net::TcpRelay::Done done,
                             net::TcpRelay::Progress progress);

}  // namespace sockmesh::proxy
