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
 * [2] sends passed. */
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
