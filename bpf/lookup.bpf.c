// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* sk_lookup in an enrolled pod's network namespace: the second half of capture for a SYN that
 * reuses the 4-tuple of a TIME_WAIT socket (see capture.bpf.c). tc hands such a SYN to the
 * TIME_WAIT socket, which yields to a new connection as the kernel does for any SYN that reuses a
 * tuple, and asks for a listener of the SYN's destination; this program answers with the proxy's.
 *
 * It acts only on the SYNs tc handed over (a note in sm_tw_syns keyed by netns and tuple), so it
 * cannot capture anything tc would not. One instance per pod netns: sk_lookup cannot learn its
 * netns (bpf_get_netns_cookie is not offered to it), so the loader sets the netns it is attached to
 * (cfg_netns_cookie); a listener of another netns is never chosen (the kernel would not stop it).
 */
#include "lib/maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set by the loader before load: the cookie of the netns this instance is attached to. */
const volatile __u64 cfg_netns_cookie = 0;

/* The listener lookup of a SYN that met a TIME_WAIT socket: if tc handed this very SYN over (a note
 * in sm_tw_syns for this netns and tuple), the proxy's listener it named. Every other lookup (an
 * app's own listener, HBONE, probes from the node, the proxy's own connections to the app) is
 * left to the kernel. */
SEC("sk_lookup")
int sm_sk_lookup(struct bpf_sk_lookup* ctx) {
  if (ctx->protocol != SM_IPPROTO_TCP) return SK_PASS;
  struct sm_flow_key flow = {.netns = cfg_netns_cookie};
  if (ctx->family == SM_AF_INET) {
    sm_ip_from_v4(&flow.local, ctx->local_ip4);
    sm_ip_from_v4(&flow.remote, ctx->remote_ip4);
  } else if (ctx->family == SM_AF_INET6) {
    __u32 l[4] = {ctx->local_ip6[0], ctx->local_ip6[1], ctx->local_ip6[2], ctx->local_ip6[3]};
    __u32 r[4] = {ctx->remote_ip6[0], ctx->remote_ip6[1], ctx->remote_ip6[2], ctx->remote_ip6[3]};
    sm_ip_from_v6(&flow.local, l);
    sm_ip_from_v6(&flow.remote, r);
  } else {
    return SK_PASS;
  }
  flow.local_port = (__u16)ctx->local_port;
  flow.remote_port = bpf_ntohs(ctx->remote_port);
  struct sm_time_wait_syn* note = bpf_map_lookup_elem(&sm_tw_syns, &flow);
  if (!note) return SK_PASS;
  __u32 kind = note->kind;
  bool fresh = bpf_ktime_get_ns() - note->created_ns <= SM_NOTE_LIFETIME_NS;
  bpf_map_delete_elem(&sm_tw_syns, &flow);
  if (!fresh) return SK_PASS;
  /* The pod whose listener it is: the SYN's source for outbound (and DNS over TCP, which the pod
   * sends), its destination for inbound. */
  bool from_pod = kind == SM_LISTENER_OUTBOUND || kind == SM_LISTENER_DNS_TCP;
  struct sm_listener_key key = {.ip = from_pod ? flow.remote : flow.local, .kind = kind};
  struct bpf_sock* listener = bpf_map_lookup_elem(&sm_listeners, &key);
  if (!listener) return SK_PASS;
  long err = bpf_sk_assign(ctx, listener, 0);
  bpf_sk_release(listener);
  if (err) {
    sm_count(SM_CNT_ASSIGN_FAILED);
    return SK_PASS;
  }
  if (from_pod) {
    /* As tc notes the SYNs it assigns (capture.bpf.c, "Local route"), from the app's side. */
    struct sm_flow_key app_flow;
    sm_flow_reverse(&flow, &app_flow);
    struct sm_peer_note seen = {.created_ns = bpf_ktime_get_ns()};
    bpf_map_update_elem(&sm_proxy_syns, &app_flow, &seen, BPF_ANY);
  }
  sm_count(SM_CNT_TIME_WAIT_REUSED);
  return SK_PASS;
}
