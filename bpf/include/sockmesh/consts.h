#pragma once
/* Constants shared by the BPF programs, the loader and the proxy: ports, marks, routing, and the
 * names under which maps and programs are pinned. Plain macros, so that the same header serves
 * BPF C, C and C++, and `#if` can test them. */

/* The proxy's listeners inside each enrolled pod's network namespace. */
#define SM_PORT_OUTBOUND 15001      /* captured outbound connections (transparent) */
#define SM_PORT_INBOUND_PLAIN 15006 /* captured inbound plaintext connections */
#define SM_PORT_HBONE 15008         /* HBONE (mTLS HTTP/2 CONNECT); never captured */
#define SM_PORT_DNS 15053           /* captured DNS queries, UDP and TCP (the proxy's DNS proxy) */
#define SM_PORT_DNS_QUERY 53        /* what capture takes: queries to this port, any address */

/* Packet and socket marks (SO_MARK / skb->mark). All sockmesh bits live under SM_MARK_MASK, so
 * that other users of the mark (CNIs, kube-proxy: 0x4000/0x8000, Calico: 0xffff0000) keep theirs.
 *
 * SM_MARK_BOUNCED   set by the tc egress program on packets it bounces into ingress; the pod's
 *                   policy routing (fwmark rule -> local table) delivers them to local sockets.
 *                   sockops also sets it (SO_MARK) on an enrolled app's socket once established
 *                   when its peer is proven to be the proxy in the pod (bypass.bpf.c,
 *                   sm_route_to_proxy): that rule then sends all its segments over lo, where tc
 *                   is not, straight to the proxy's socket.
 * SM_MARK_PROXY     every socket of the proxy in a pod's netns (listeners, upstream sockets):
 *                   tc never captures a packet that carries it.
 * SM_MARK_LOCAL_HOP the proxy's sockets whose peer is a local app (the inbound hop to the app):
 *                   sockops puts them into the bypass SOCKHASH. Always with SM_MARK_PROXY.
 * SM_MARK_PROXY_MAP the proxy looks for its own bypassed sockets in sm_bypass_proxy, so sockops
 *                   puts them there. A proxy older than that map sets SM_MARK_PROXY without it,
 *                   and its sockets go into sm_bypass, where it looks: the node's BPF and the
 *                   proxy are upgraded separately, in either order. Always with SM_MARK_PROXY.
 * SM_MARK_APP_ROUTE sockops sets it (SO_MARK) on an enrolled app's TCP socket as the socket
 *                   connects or once it is accepted, and the socket's route is looked up again
 *                   under it: the pod's rule for it picks
 *                   SM_APP_ROUTE_TABLE, whose routes are the pod's own with a lo-sized MTU, so
 *                   that the app sends to the proxy in large segments (capture.bpf.c, "MSS").
 *                   Never with SM_MARK_PROXY. */
#define SM_MARK_MASK 0x001f0000u
#define SM_MARK_BOUNCED 0x00010000u
#define SM_MARK_PROXY 0x00020000u
#define SM_MARK_LOCAL_HOP 0x00040000u
#define SM_MARK_PROXY_MAP 0x00080000u
#define SM_MARK_APP_ROUTE 0x00100000u
/* What the proxy sets with SO_MARK. */
#define SM_MARK_PROXY_UPSTREAM (SM_MARK_PROXY | SM_MARK_PROXY_MAP)
#define SM_MARK_PROXY_TO_APP (SM_MARK_PROXY | SM_MARK_LOCAL_HOP | SM_MARK_PROXY_MAP)

/* Policy routing inside an enrolled pod's netns:
 *   ip rule add fwmark SM_MARK_BOUNCED/SM_MARK_BOUNCED lookup SM_ROUTE_TABLE pref SM_RULE_PRIORITY
 *   ip route add local 0.0.0.0/0 dev lo table SM_ROUTE_TABLE   (and ::/0 for IPv6) */
#define SM_ROUTE_TABLE 0x534d /* "SM" */
#define SM_RULE_PRIORITY 32000
/* ... and for the app's captured sockets (SM_MARK_APP_ROUTE):
 *   ip rule add fwmark SM_MARK_APP_ROUTE/SM_MARK_APP_ROUTE lookup SM_APP_ROUTE_TABLE
 *       pref SM_APP_RULE_PRIORITY
 *   each route of the pod's main table, copied into SM_APP_ROUTE_TABLE, with mtu
 *   SM_APP_ROUTE_MTU on the unicast ones out of the captured device (eth0) that have no MTU of
 *   their own */
#define SM_APP_ROUTE_TABLE 0x534e
#define SM_APP_RULE_PRIORITY 32100
/* The largest MTU the kernel keeps for a route (it caps the metric at 65535 - 15): an MSS of
 * 65480 over IPv4 (65460 over IPv6), so the app's segments are lo-sized as to a local peer. */
#define SM_APP_ROUTE_MTU 65520

/* String sizes of a workload record, NUL included. */
#define SM_UID_LEN 64              /* pod UID (36) or any opaque id */
#define SM_NAMESPACE_LEN 64        /* DNS label: 63 + NUL */
#define SM_SERVICE_ACCOUNT_LEN 256 /* DNS subdomain: 253 + NUL */
#define SM_TRUST_DOMAIN_LEN 256    /* SPIFFE trust domain: 255 + NUL */

/* Map sizes. */
#define SM_MAX_WORKLOADS 16384
/* Kept at its first size so that pinned maps stay reusable across an upgrade: with five kinds
 * it holds every listener of 9,830 pods. */
#define SM_MAX_LISTENERS (3 * SM_MAX_WORKLOADS)
/* Slots of SM_MAP_COUNTERS: more than enum sm_counter uses, so that a new counter keeps the
 * pinned map's shape and an upgrade can reuse it. */
#define SM_CNT_SLOTS 32

/* The MSS tc offers a proxy socket in a bounced SYN or SYN-ACK (capture.bpf.c): the largest an
 * IPv4 packet allows (65535 less the IPv4 and TCP headers), lo's MTU being 65536. The sending
 * socket clamps it to its own path MTU. */
#define SM_LOCAL_HOP_MSS 65495
#define SM_MAX_BYPASS_SOCKETS 65536
/* As many as the bypass holds sockets: every app flow the proxy sends back to the stack (a
 * tunnel's after two answers, a spliced relay's, a paused one's) keeps its entry until it closes,
 * so a smaller LRU would push out the pins of flows still in the bypass (the sk_msg misses). It
 * was 16384 before 2026-12-06; the loader replaces a pinned map of the old size and copies its
 * entries (loader/attach/map_upgrade.h). An LRU preallocates: bpftool shows memlock 7865216 B
 * (1966976 B at 16384). */
#define SM_MAX_STACK_FLOWS SM_MAX_BYPASS_SOCKETS
#define SM_MAX_AWAIT_PEER 4096
/* How long a note between two programs may wait for the event it announces: a pairing note in
 * sm_await_peer for its passive end, a TIME_WAIT note in sm_tw_syns for its listener lookup. Both
 * events follow within microseconds, so anything older belongs to another connection. */
#define SM_NOTE_LIFETIME_NS 1000000000ull
/* ... and a captured SYN's note in sm_proxy_syns for its app socket's handshake: well under the
 * 1 s a SYN waits before it is sent again, so that a note cannot vouch for a retransmitted SYN
 * that went to the wire by a path that did not remove it (the pod unenrolled meanwhile, say). The
 * proxy's SYN-ACK comes over lo within microseconds; a later one only costs the local route. */
#define SM_PROXY_SYN_LIFETIME_NS 250000000ull
#define SM_MAX_NODE_ADDRS 256
#define SM_MAX_TIME_WAIT_SYNS 4096
#define SM_MAX_PROXY_SYNS 16384

/* Map names: BPF object names (at most 15 characters) and the file names under the pin root. */
#define SM_MAP_WORKLOADS "sm_workloads"
#define SM_MAP_LISTENERS "sm_listeners"
#define SM_MAP_COUNTERS "sm_counters"
#define SM_MAP_BYPASS "sm_bypass"
#define SM_MAP_BYPASS_PROXY "sm_bypass_proxy"
#define SM_MAP_STACK_FLOWS "sm_stack_flows"
#define SM_MAP_AWAIT_PEER "sm_await_peer"
#define SM_MAP_NODE_ADDRS "sm_node_addrs"
#define SM_MAP_TIME_WAIT_SYNS "sm_tw_syns"
#define SM_MAP_PROXY_SYNS "sm_proxy_syns"

/* Default pin root; programs and links are pinned in subdirectories of it. */
#define SM_PIN_ROOT_DEFAULT "/sys/fs/bpf/sockmesh"
#define SM_PIN_PROGS_DIR "progs"
#define SM_PIN_LINKS_DIR "links"
/* The sockops link under SM_PIN_LINKS_DIR: present when the sockmap bypass is attached. */
#define SM_PIN_LINK_SOCKOPS "sm_sockops"
