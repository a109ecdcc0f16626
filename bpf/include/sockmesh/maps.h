#pragma once
/* Keys and values of the sockmesh BPF maps: the one definition that the BPF programs, the loader
 * and the proxy all compile. Layouts are fixed by the static assertions at the end; change a
 * struct and its size together, and expect pinned maps of the old layout to be refused at load. */
#include "sockmesh/consts.h"
#include "sockmesh/types.h"

/* An IPv4 or IPv6 address as 16 bytes in network order; IPv4 is IPv4-mapped (::ffff:a.b.c.d),
 * the same bytes as sockmesh::IpAddress::bytes16(). Aligned to 4 so that BPF code can fill it a
 * word at a time (the verifier refuses misaligned stack access). */
struct sm_ip {
  __u8 addr[16];
} __attribute__((aligned(4)));

/* Flags of a workload record. */
enum sm_workload_flags {
  SM_WL_ENROLLED = 1u << 0,        /* capture this workload's traffic */
  SM_WL_CAPTURE_INBOUND = 1u << 1, /* capture inbound connections to its app ports (15006) */
  SM_WL_CAPTURE_DNS = 1u << 2,     /* capture its DNS queries (UDP and TCP to port 53) into the
                                      proxy's DNS listeners (15053); off for a pod labelled or
                                      annotated ambient.istio.io/dns-capture=false */
  /* Loader bookkeeping, so that unenroll restores exactly what enroll changed. */
  SM_WL_SET_ACCEPT_LOCAL = 1u << 8, /* enroll turned accept_local on for the pod's device */
  SM_WL_MADE_CLSACT = 1u << 9,      /* enroll created the clsact qdisc on the pod's device */
};

/* Value of SM_MAP_WORKLOADS (hash keyed by struct sm_ip): who a workload is and how it is
 * enrolled. Strings are NUL-terminated and NUL-padded. */
struct sm_workload {
  char uid[SM_UID_LEN];
  char namespace_name[SM_NAMESPACE_LEN];
  char service_account[SM_SERVICE_ACCOUNT_LEN];
  char trust_domain[SM_TRUST_DOMAIN_LEN];
  __u32 flags;   /* enum sm_workload_flags */
  __u32 ifindex; /* the pod's device, as seen inside its netns */
  __u64 netns_cookie;
};

/* Which of the proxy's listeners in a pod a slot of SM_MAP_LISTENERS holds. */
enum sm_listener_kind {
  SM_LISTENER_OUTBOUND = 0,      /* port SM_PORT_OUTBOUND */
  SM_LISTENER_INBOUND_PLAIN = 1, /* port SM_PORT_INBOUND_PLAIN */
  SM_LISTENER_HBONE = 2,         /* port SM_PORT_HBONE (registered for completeness; not used
                                    by tc, which lets HBONE through to it untouched) */
  SM_LISTENER_DNS_UDP = 3,       /* port SM_PORT_DNS, a UDP socket (IP_TRANSPARENT) */
  SM_LISTENER_DNS_TCP = 4,       /* port SM_PORT_DNS, a TCP listener (IP_TRANSPARENT) */
  SM_LISTENER_KIND_COUNT = 5,
};

/* Key of SM_MAP_LISTENERS (a SOCKHASH of listening sockets): the pod's IP and the listener. */
struct sm_listener_key {
  struct sm_ip ip;
  __u32 kind; /* enum sm_listener_kind */
};

/* Key of SM_MAP_BYPASS (a SOCKHASH of connected sockets), SM_MAP_STACK_FLOWS, SM_MAP_AWAIT_PEER
 * and SM_MAP_PROXY_SYNS: one end of a TCP connection, from that socket's point of view, in its
 * network namespace (bpf_get_netns_cookie()). Two pods can hold connections with the same 4-tuple;
 * the namespace keeps their sockets apart. Ports in host order; `reserved` is always zero. */
struct sm_flow_key {
  __u64 netns;
  struct sm_ip local;
  struct sm_ip remote;
  __u16 local_port;
  __u16 remote_port;
  __u32 reserved;
};

/* Value of SM_MAP_AWAIT_PEER: when the active end was established. A passive end pairs with it only
 * within SM_NOTE_LIFETIME_NS (a local handshake takes microseconds); an older note is stale,
 * removed and counted as a refused pairing. */
struct sm_peer_note {
  __u64 created_ns; /* bpf_ktime_get_ns() */
};

/* SM_MAP_PROXY_SYNS (LRU hash keyed by struct sm_flow_key, from the app's side: local = the
 * app's own address): an enrolled app's SYN that tc (or sm_sk_lookup, for a SYN that reused a
 * TIME_WAIT tuple) gave to the proxy's listener in the app's pod, and when (struct sm_peer_note).
 * sockops consumes it as the app's socket is established: proof that the socket's peer is the
 * proxy in its own netns. tc removes it when a later SYN of the tuple goes to the wire instead
 * (--fail-open with no listener); an entry older than SM_PROXY_SYN_LIFETIME_NS is ignored. */

/* Value of SM_MAP_TIME_WAIT_SYNS (LRU hash keyed by struct sm_flow_key, from the listener's side:
 * local = the SYN's destination): a SYN that tc handed to a TIME_WAIT socket of its tuple, and the
 * proxy listener (enum sm_listener_kind) that sm_sk_lookup is to give it. Consumed by that lookup,
 * microseconds later; an entry older than SM_NOTE_LIFETIME_NS is ignored. */
struct sm_time_wait_syn {
  __u32 kind;
  __u32 reserved;
  __u64 created_ns;
};

/* SM_MAP_NODE_ADDRS: the source addresses capture exempts (key struct sm_ip, value __u32
 * SM_NODE_ADDR_*): the agent writes the kubelet-probe SNAT addresses only (169.254.7.127 and
 * fd16:9254:7127:1337:ffff:ffff:ffff:ffff, as istio-cni; the node SNATs the kubelet's connections
 * to them), so that mesh policy does not fail a pod's health checks while any other process on
 * the node is captured. */
#define SM_NODE_ADDR_EXEMPT 1u

/* Indexes into SM_MAP_COUNTERS (a per-CPU array of __u64). Names for humans are in
 * sm_counter_names() of loader/maps/counters.h; add both together. */
enum sm_counter {
  SM_CNT_CAPTURED_OUTBOUND = 0, /* outbound SYNs assigned to the proxy's 15001 listener */
  SM_CNT_CAPTURED_INBOUND,      /* inbound SYNs assigned to the proxy's 15006 listener */
  SM_CNT_BOUNCED,               /* packets tc egress bounced into ingress */
  SM_CNT_PASSED,                /* packets of enrolled pods tc let through untouched */
  SM_CNT_NOT_ENROLLED,          /* packets tc saw for an IP that is not enrolled */
  SM_CNT_PROXY_SKIPPED,         /* packets skipped by tc for carrying SM_MARK_PROXY */
  SM_CNT_NO_LISTENER,           /* SYNs to capture while the proxy's listener was missing */
  SM_CNT_ASSIGN_FAILED,         /* bpf_sk_assign refused */
  SM_CNT_TC_PAYLOAD,            /* TCP packets with payload that tc bounced or captured */
  SM_CNT_BYPASS_SENDS,          /* sendmsg redirected to the peer by sk_msg */
  SM_CNT_BYPASS_MISSES,         /* sendmsg whose peer was not in the SOCKHASH: went via the stack */
  SM_CNT_BYPASS_PINNED,         /* sendmsg kept on the stack path because an earlier one missed */
  SM_CNT_SOCKOPS_INSERTED,      /* sockets added to the bypass SOCKHASH */
  SM_CNT_SOCKOPS_INSERT_FAILED, /* sockets the kernel refused to add */
  SM_CNT_NODE_EXEMPT,           /* inbound SYNs from the node's own addresses, not captured */
  SM_CNT_BYPASS_REFUSED,        /* sockets not paired: their peer could not be proven to be the
                                   other end in the same netns (stale note, netns mismatch, or a
                                   socket claiming a local app's address that left no note) */
  SM_CNT_PROXY_STACK_SENDS,     /* the proxy's sendmsg on a socket in sm_bypass (a proxy older
                                   than sm_bypass_proxy, or a socket an older sockops put there),
                                   kept on the stack; 0 for a current proxy's sockets, which are
                                   in sm_bypass_proxy, where sk_msg does not run */
  SM_CNT_BYPASS_NOTES_EXPIRED,  /* pairing notes removed because their socket closed unpaired */
  SM_CNT_TIME_WAIT_SYN,         /* SYNs to capture whose tuple a TIME_WAIT socket held: passed to
                                   it, so that it yields to the proxy's listener (sm_sk_lookup) */
  SM_CNT_TIME_WAIT_REUSED,      /* listener lookups sm_sk_lookup answered with the proxy's listener
                                   (a SYN that reused the tuple of a TIME_WAIT socket) */
  SM_CNT_CAPTURED_DNS,          /* DNS queries given to the proxy's DNS sockets (15053): each UDP
                                   datagram, and each TCP SYN, to port 53 */
  SM_CNT_MSS_RAISED,            /* bounced SYNs and SYN-ACKs whose MSS option tc raised to the
                                   local hop's (SM_LOCAL_HOP_MSS), see capture.bpf.c */
  SM_CNT_APP_ROUTED,            /* enrolled apps' sockets sockops marked SM_MARK_APP_ROUTE as they
                                   connected or were accepted (their route has a lo-sized MTU) */
  SM_CNT_MSS_CLAMPED,           /* SYNs and SYN-ACKs between eth0 and the wire whose MSS option tc
                                   lowered to what eth0's MTU carries, see capture.bpf.c */
  SM_CNT_UNPARSED,              /* packets tc could not parse (not IP, or headers out of reach):
                                   let through untouched */
  SM_CNT_UNKNOWN_FLOW,          /* later TCP packets of an enrolled pod at tc egress with no local
                                   socket for their tuple: to the wire (flows from before the
                                   enrollment) */
  SM_CNT_LOCAL_ROUTED,          /* enrolled apps' established sockets whose peer was proven to be
                                   the proxy in their pod, marked SM_MARK_BOUNCED by sockops: their
                                   segments go over lo, not through eth0 and tc */
  SM_CNT_COUNT,
};

SM_STATIC_ASSERT(SM_CNT_COUNT <= SM_CNT_SLOTS, "sm_counters has a slot for every counter");
SM_STATIC_ASSERT(sizeof(struct sm_ip) == 16, "sm_ip is 16 bytes");
SM_STATIC_ASSERT(__alignof__(struct sm_ip) == 4, "sm_ip is word aligned");
SM_STATIC_ASSERT(sizeof(struct sm_workload) == 656, "sm_workload layout changed");
SM_STATIC_ASSERT(__builtin_offsetof(struct sm_workload, flags) == 640, "sm_workload.flags");
SM_STATIC_ASSERT(__builtin_offsetof(struct sm_workload, netns_cookie) == 648,
                 "sm_workload.netns_cookie");
SM_STATIC_ASSERT(sizeof(struct sm_listener_key) == 20, "sm_listener_key is 20 bytes");
SM_STATIC_ASSERT(sizeof(struct sm_flow_key) == 48, "sm_flow_key is 48 bytes");
SM_STATIC_ASSERT(__builtin_offsetof(struct sm_flow_key, local_port) == 40, "sm_flow_key ports");
SM_STATIC_ASSERT(sizeof(struct sm_peer_note) == 8, "sm_peer_note is 8 bytes");
SM_STATIC_ASSERT(sizeof(struct sm_time_wait_syn) == 16, "sm_time_wait_syn is 16 bytes");
SM_STATIC_ASSERT(sizeof(enum sm_counter) == 4, "enums are 4 bytes in both languages");
