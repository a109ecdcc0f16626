// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Test-only (tests/loader/egress_redirect_test.cc; never loaded by the loader): the kernel facts
 * behind issue 16's stage 2 of the same-node fast path, where an app's sends are moved by sk_msg
 * to the *egress* of another socket (bpf_msg_redirect_hash with flags 0, not BPF_F_INGRESS), so
 * that a proxy's two sockets are joined in the kernel. Its own maps, not pinned: nothing here
 * touches an installed datapath.
 *
 * ep_sources (SOCKMAP, with this program as its msg verdict) holds the senders; ep_targets
 * (SOCKHASH) maps a sender's local port to the socket whose egress its sends go to. A send that
 * finds no target passes to the stack (SK_PASS). ep_counts: [0] sends redirected, [1] their bytes,
 * [2] sends passed.
 *
 * ep_gated (on ep_gated_sources) tries the gate a join needs: a sender's bytes go to the ingress
 * of the proxy socket (ep_ingress, as the bypass does) and are counted in ep_ingressed, until the
 * join is armed (ep_armed) and the proxy has published (ep_forwarded) that it forwarded exactly
 * that many; from then on they go to the egress target (ep_targets), counted in ep_joined. The
 * program runs under the sender's socket lock, so the check and the switch are serialized per
 * sender; the counters are globals because the probe serves one flow at a time. */
#include "vmlinux.h"

#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
  __uint(type, BPF_MAP_TYPE_SOCKMAP);
  __uint(max_entries, 8);
  __type(key, __u32);
  __type(value, __u64);
} ep_sources SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_SOCKHASH);
  __uint(max_entries, 8);
  __type(key, __u32);
  __type(value, __u64);
} ep_targets SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 3);
  __type(key, __u32);
  __type(value, __u64);
} ep_counts SEC(".maps");

/* The gate's state, one flow (read and written by the test through the skeleton's .bss). */
__u64 ep_ingressed = 0; /* bytes sent towards the proxy socket (its ingress, or the stack) */
__u64 ep_forwarded = 0; /* published by the proxy: bytes it read from there and wrote onwards */
__u64 ep_joined = 0;    /* bytes sent to the egress target after the switch */
__u32 ep_armed = 0;     /* set by the proxy: switch once ep_forwarded == ep_ingressed (2: and
                         * until then send through the stack, see ep_gated) */
__u32 ep_switched = 0;  /* set by the program at the switch; never cleared */
__u64 ep_egress_misses = 0;

struct {
  __uint(type, BPF_MAP_TYPE_SOCKMAP);
  __uint(max_entries, 8);
  __type(key, __u32);
  __type(value, __u64);
} ep_gated_sources SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_SOCKHASH);
  __uint(max_entries, 8);
  __type(key, __u32);
  __type(value, __u64);
} ep_ingress SEC(".maps");

static __always_inline void ep_add(__u32 index, __u64 n) {
  __u64* v = bpf_map_lookup_elem(&ep_counts, &index);
  if (v) __sync_fetch_and_add(v, n);
}

SEC("sk_msg")
int ep_redirect(struct sk_msg_md* msg) {
  __u32 key = msg->local_port;
  __u64 size = msg->size;
  if (bpf_msg_redirect_hash(msg, &ep_targets, &key, 0) == SK_PASS) {
    ep_add(0, 1);
    ep_add(1, size);
    return SK_PASS;
  }
  ep_add(2, 1);
  return SK_PASS; /* a miss returns SK_DROP from the helper: pass to the stack instead */
}

SEC("sk_msg")
int ep_gated(struct sk_msg_md* msg) {
  __u32 key = msg->local_port;
  __u64 size = msg->size;
  if (!ep_switched && ep_armed && *(volatile __u64*)&ep_forwarded == ep_ingressed) {
    ep_switched = 1;
  }
  if (ep_switched) {
    if (bpf_msg_redirect_hash(msg, &ep_targets, &key, 0) == SK_PASS) {
      __sync_fetch_and_add(&ep_joined, size);
      return SK_PASS;
    }
    __sync_fetch_and_add(&ep_egress_misses, 1);
    return SK_DROP; /* never to the stack after the switch: those bytes would come second */
  }
  if (ep_armed == 2) {
    /* Armed to drain through the stack: the bytes go to B's TCP queue (behind its ingress
     * queue, which B's reads empty first), counted as bytes the proxy must forward, and TCP's
     * window stops a sender that outruns the proxy, so that the proxy catches up. */
    __sync_fetch_and_add(&ep_ingressed, size);
    return SK_PASS;
  }
  if (bpf_msg_redirect_hash(msg, &ep_ingress, &key, BPF_F_INGRESS) == SK_PASS) {
    __sync_fetch_and_add(&ep_ingressed, size);
    return SK_PASS;
  }
  ep_add(2, 1);
  return SK_PASS;
}
