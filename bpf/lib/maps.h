/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
#pragma once
/* Every sockmesh map, defined once and included by each BPF object. Maps are pinned by name under
 * the loader's pin root, so the capture and bypass objects (and a restarted loader) share the same
 * instances: libbpf reuses a pinned map when its type, sizes and flags match. */
#include "lib/common.h"

/* Workload records keyed by IP (struct sm_ip). */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, SM_MAX_WORKLOADS);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, struct sm_ip);
  __type(value, struct sm_workload);
  __uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_workloads SEC(".maps");

/* The proxy's listening sockets in each pod, by (pod IP, listener kind). The proxy inserts them;
 * tc looks them up and assigns captured SYNs to them. */
struct {
  __uint(type, BPF_MAP_TYPE_SOCKHASH);
  __uint(max_entries, SM_MAX_LISTENERS);
  __type(key, struct sm_listener_key);
  __type(value, __u64);
  __uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_listeners SEC(".maps");

/* The node's own addresses (the node agent writes them): inbound SYNs from them are not
 * captured. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, SM_MAX_NODE_ADDRS);
  __type(key, struct sm_ip);
  __type(value, __u32);
  __uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_node_addrs SEC(".maps");

/* Per-CPU counters indexed by enum sm_counter. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, SM_CNT_SLOTS);
  __type(key, __u32);
  __type(value, __u64);
  __uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_counters SEC(".maps");

/* The app ends of bypassed connections, by their own 4-tuple; the sk_msg program is attached to
 * this map and redirects each send to the peer found under the reversed tuple. */
struct {
  __uint(type, BPF_MAP_TYPE_SOCKHASH);
  __uint(max_entries, SM_MAX_BYPASS_SOCKETS);
  __type(key, struct sm_flow_key);
  __type(value, __u64);
  __uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_bypass SEC(".maps");

/* The proxy ends of bypassed connections (sockets with SM_MARK_PROXY), by their own 4-tuple: where
 * sk_msg redirects the apps' sends. No program is attached to this map, so the proxy's own sends
 * keep TCP's send path: a socket in a map with an sk_msg program runs it on every sendmsg and is
 * pushed out page by page (tcp_bpf_push), which cost the proxy 6 to 7% CPU per GB for nothing, as
 * those sends always go through the stack anyway (see the top of bypass.bpf.c). */
struct {
  __uint(type, BPF_MAP_TYPE_SOCKHASH);
  __uint(max_entries, SM_MAX_BYPASS_SOCKETS);
  __type(key, struct sm_flow_key);
  __type(value, __u64);
  __uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_bypass_proxy SEC(".maps");

/* Sockets that sent through the stack once (their peer was not yet in the bypass maps), or whose
 * proxy end stopped reading (the proxy writes those): they keep sending through the stack, because
 * bytes redirected later would overtake the ones still queued in the peer's normal receive queue
 * (the sockmap queue is read first). Entries go when their socket closes (sockops STATE_CB); LRU
 * bounds the rest. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, SM_MAX_STACK_FLOWS);
  __type(key, struct sm_flow_key);
  __type(value, __u32);
  __uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_stack_flows SEC(".maps");

/* Active ends inserted into a bypass map whose passive peer has not been established yet: the
 * passive side goes into one only if it finds (and consumes) a fresh note of its peer here. A
 * separate map because sockops may not look sockets up in a SOCKHASH (it cannot release the
 * reference). Entries go when consumed or when their socket closes (sockops STATE_CB); LRU bounds
 * the rest. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, SM_MAX_AWAIT_PEER);
  __type(key, struct sm_flow_key);
  __type(value, struct sm_peer_note);
  __uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_await_peer SEC(".maps");

/* SYNs tc handed to a TIME_WAIT socket, for sm_sk_lookup (lookup.bpf.c) to give to the proxy's
 * listener. LRU: an entry whose lookup never came (the TIME_WAIT socket refused the SYN) ages out.
 */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, SM_MAX_TIME_WAIT_SYNS);
  __type(key, struct sm_flow_key);
  __type(value, struct sm_time_wait_syn);
  __uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_tw_syns SEC(".maps");

/* Enrolled apps' SYNs given to the proxy's listener in their pod (include/sockmesh/maps.h,
 * SM_MAP_PROXY_SYNS): tc and sm_sk_lookup write, sockops consumes. LRU: a note whose handshake
 * never completed ages out. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, SM_MAX_PROXY_SYNS);
  __type(key, struct sm_flow_key);
  __type(value, struct sm_peer_note);
  __uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_proxy_syns SEC(".maps");

static __always_inline void sm_count(enum sm_counter counter) {
  __u32 key = counter;
  __u64* value = bpf_map_lookup_elem(&sm_counters, &key);
  if (value) *value += 1; /* per-CPU slot: no atomic needed */
}

/* Every byte of `out` is written, `reserved` too: it is a map key, and the verifier accepted this
 * program with that field unwritten (stack bytes the program never wrote hold whatever the kernel
 * stack held). Left unwritten, the IPv6 passive ends missed their notes every time in the cluster;
 * IPv4 happened to find zeros there. (Shared: bypass.bpf.c pairs by it, capture.bpf.c and
 * lookup.bpf.c turn a SYN's key from one side to the other.) */
static __always_inline void sm_flow_reverse(const struct sm_flow_key* in, struct sm_flow_key* out) {
  out->netns = in->netns;
  out->reserved = 0;
  out->local = in->remote;
  out->remote = in->local;
  out->local_port = in->remote_port;
  out->remote_port = in->local_port;
}

static __always_inline struct sm_workload* sm_workload_of(const struct sm_ip* ip) {
  return bpf_map_lookup_elem(&sm_workloads, ip);
}

static __always_inline void sm_ip_from_v4(struct sm_ip* ip, __u32 addr_be) {
  __u32* w = (__u32*)ip->addr;
  w[0] = 0;
  w[1] = 0;
  w[2] = bpf_htonl(0x0000ffff);
  w[3] = addr_be;
}

static __always_inline void sm_ip_from_v6(struct sm_ip* ip, const __u32 addr_be[4]) {
  __u32* w = (__u32*)ip->addr;
  w[0] = addr_be[0];
  w[1] = addr_be[1];
  w[2] = addr_be[2];
  w[3] = addr_be[3];
}
