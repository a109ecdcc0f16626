#pragma once
// The source port of a dial from a foreign source address (source IP preservation: the proxy
// connects to a pod's app as the client's IP, from inside the pod's netns).
//
// The kernel chooses such a port at connect() time among those whose four-tuple is free in the
// sending direction only. In the pod's netns the proxy also holds the accepted sockets of
// captured connections (local = app:port, remote = client:p), which are the *reverse* of what its
// own dial to the app would hold (local = client:p', remote = app:port) and of the app's socket
// for it. The kernel may therefore pick p' == p of a live connection from the same client; the
// dial's SYN then meets the proxy's accepted socket instead of the app's listener (a challenge
// ACK, and the proxy's reply to it resets the client's connection).
//
// choose_source_port() picks p' itself: a random port of [low, high] whose four-tuple no socket of
// the netns holds in either direction (asked of the kernel with sock_diag). A TIME_WAIT socket in
// the reverse direction is no obstacle: a SYN to it starts a new connection, as between two hosts.
//
// The other way round, a live dial holds client:p' in the pod's netns for as long as it lasts; a
// new connection from the client that happens to come from p' would meet the app's socket of that
// dial. The range is therefore one that clients do not draw their ephemeral ports from (the
// caller's default: 1024-32767, below Linux's 32768-60999 and IANA's 49152-65535), so that only a
// client binding such a port on purpose can meet it.
#include <cstdint>
#include <optional>
#include <string>

#include "base/ip_address.h"

namespace sockmesh::net {

struct SourcePortChoice {
  std::optional<uint16_t> port;  // none: leave it to the kernel (the reason says why)
  unsigned tries = 0;            // candidates looked at
  unsigned held = 0;             // candidates refused because a socket held their four-tuple
  std::string reason;
};

// Runs in the calling thread's netns: call it inside run_in(pod netns).
SourcePortChoice choose_source_port(const IpAddress& source, const Endpoint& destination,
                                    uint16_t low, uint16_t high);

// What the kernel holds for local -> remote in the calling thread's netns, by exact lookup
// (sock_diag): nullopt when no socket holds it, else the TCP state (TCP_ESTABLISHED, ..., 10 for
// a listener that would take it). Sets *error (and returns nullopt) when the kernel cannot tell.
std::optional<int> tcp_state_for(const Endpoint& local, const Endpoint& remote, std::string* error);

}  // namespace sockmesh::net
