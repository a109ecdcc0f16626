#pragma once
// The relay of a connection that is not tunnelled (outbound passthrough, inbound plaintext):
// splice(2) (net::SpliceRelay) where it is safe, the copying net::TcpRelay otherwise.
//
// Safe means: --splice-passthrough is on and no app-facing socket is in the sockmap bypass. Bytes
// sk_msg redirects into a bypassed socket wait on its psock's ingress queue, which splice never
// reads (loader_bypass_pinning_test SpliceDoesNotSeeRedirectedBytes), and only TcpRelay has the
// read-paused hook that pins such a flow back to the TCP stack. When the bypass maps are
// configured but not open, the proxy cannot tell whether a socket is bypassed, so it copies.
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

// Starts relaying `a` <-> `b`. `a_paused`/`b_paused`: ProxyContext::bypass_read_paused() of the
// app-facing socket(s), null for a socket that is not bypassed. Counts the choice in
// sockmesh_plain_relays_total{relay="splice"|"copy"}.
PlainRelay start_plain_relay(ProxyContext& ctx, net::Tcp::socket a, net::Tcp::socket b,
                             net::TcpRelay::ReadPaused a_paused, net::TcpRelay::ReadPaused b_paused,
                             net::TcpRelay::Done done, net::TcpRelay::Progress progress);

}  // namespace sockmesh::proxy
