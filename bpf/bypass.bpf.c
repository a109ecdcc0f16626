// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* sockops + sk_msg on a cgroup v2: the local hop between an app and the proxy skips the TCP/IP
 * stack. Both ends of such a connection go into the SOCKHASH sm_bypass under their own 4-tuple;
 * sk_msg then moves each sendmsg straight into the peer's receive queue (BPF_F_INGRESS).
 *
 * Which sockets go in (sockets whose peer is not local must stay out: in the SOCKHASH a blocking
 * recv() can fail with EAGAIN when the sockmap receive path wakes on unrelated events):
 *   active side  the proxy's sockets marked SM_MARK_LOCAL_HOP (its hop to the app), and app
 *                sockets of an enrolled, captured workload (tc hands them to the proxy);
 *   passive side only when its active peer was inserted (it left a note in sm_await_peer).
 *
 * It is an acceleration: whenever the redirect misses, the send goes through the stack (SK_PASS)
 * and is counted; that socket then stays on the stack path (sm_stack_flows), so that bytes sent
 * later cannot overtake bytes still queued in the peer's normal receive queue. */
#include "lib/maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Knobs set by the loader before load. */
const volatile bool cfg_bypass = true; /* false: sockops inserts nothing, sk_msg always passes */

static __always_inline void sm_flow_reverse(const struct sm_flow_key* in, struct sm_flow_key* out) {
  out->local = in->remote;
  out->remote = in->local;
  out->local_port = in->remote_port;
  out->remote_port = in->local_port;
}

/* Context fields are read with 4-byte loads: narrower loads of them can fail the verifier. The
 * remote port is the network-order port as the context rewrite loads it (upper half on x86),
 * which bpf_ntohl() turns into the host-order port; the local port is host order already. */
static __always_inline int sm_flow_from_sockops(struct bpf_sock_ops* ops, struct sm_flow_key* key) {
  __u32 family = ops->family;
  if (family == SM_AF_INET) {
    sm_ip_from_v4(&key->local, ops->local_ip4);
    sm_ip_from_v4(&key->remote, ops->remote_ip4);
  } else if (family == SM_AF_INET6) {
    __u32 local[4] = {ops->local_ip6[0], ops->local_ip6[1], ops->local_ip6[2], ops->local_ip6[3]};
    __u32 remote[4] = {ops->remote_ip6[0], ops->remote_ip6[1], ops->remote_ip6[2],
                       ops->remote_ip6[3]};
    sm_ip_from_v6(&key->local, local);
    sm_ip_from_v6(&key->remote, remote);
  } else {
    return -1;
  }
  key->local_port = (__u16)ops->local_port;
  key->remote_port = (__u16)bpf_ntohl(ops->remote_port);
  return 0;
}

static __always_inline int sm_flow_from_msg(struct sk_msg_md* msg, struct sm_flow_key* key) {
  __u32 family = msg->family;
  if (family == SM_AF_INET) {
    sm_ip_from_v4(&key->local, msg->local_ip4);
    sm_ip_from_v4(&key->remote, msg->remote_ip4);
  } else if (family == SM_AF_INET6) {
    __u32 local[4] = {msg->local_ip6[0], msg->local_ip6[1], msg->local_ip6[2], msg->local_ip6[3]};
    __u32 remote[4] = {msg->remote_ip6[0], msg->remote_ip6[1], msg->remote_ip6[2],
                       msg->remote_ip6[3]};
    sm_ip_from_v6(&key->local, local);
    sm_ip_from_v6(&key->remote, remote);
  } else {
    return -1;
  }
  key->local_port = (__u16)msg->local_port;
  key->remote_port = (__u16)bpf_ntohl(msg->remote_port);
  return 0;
}

/* Whether an actively opened socket talks to a local peer. */
static __always_inline bool sm_active_has_local_peer(struct bpf_sock_ops* ops,
                                                     const struct sm_flow_key* key) {
  struct bpf_sock* sk = ops->sk;
  if (!sk) return false;
  __u32 mark = sk->mark;
  if (mark & SM_MARK_PROXY) return (mark & SM_MARK_LOCAL_HOP) != 0;
  /* An app socket: if its workload is enrolled, tc gave its SYN to the proxy in the pod. */
  struct sm_workload* wl = sm_workload_of(&key->local);
  return wl && (wl->flags & SM_WL_ENROLLED);
}

/* Whether a passively opened socket's peer is local: its active end left a note. */
static __always_inline bool sm_passive_has_local_peer(const struct sm_flow_key* key) {
  struct sm_flow_key peer_key;
  sm_flow_reverse(key, &peer_key);
  if (!bpf_map_lookup_elem(&sm_await_peer, &peer_key)) return false;
  bpf_map_delete_elem(&sm_await_peer, &peer_key);
  return true;
}

static __always_inline bool sm_insert(struct bpf_sock_ops* ops, struct sm_flow_key* key) {
  /* A new connection that reuses a 4-tuple must not inherit an old one's stack pinning. */
  bpf_map_delete_elem(&sm_stack_flows, key);
  if (bpf_sock_hash_update(ops, &sm_bypass, key, BPF_ANY) != 0) {
    sm_count(SM_CNT_SOCKOPS_INSERT_FAILED);
    return false;
  }
  sm_count(SM_CNT_SOCKOPS_INSERTED);
  return true;
}

SEC("sockops")
int sm_sockops(struct bpf_sock_ops* ops) {
  if (!cfg_bypass) return 1;
  __u32 op = ops->op;
  struct sm_flow_key key = {};
  if (op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB) {
    if (sm_flow_from_sockops(ops, &key) < 0 || !sm_active_has_local_peer(ops, &key)) return 1;
    /* ACTIVE_ESTABLISHED runs before the handshake's last ACK leaves, so the note is there
     * before the passive side looks for it. */
    __u32 one = 1;
    if (sm_insert(ops, &key)) bpf_map_update_elem(&sm_await_peer, &key, &one, BPF_ANY);
  } else if (op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) {
    if (sm_flow_from_sockops(ops, &key) < 0 || !sm_passive_has_local_peer(&key)) return 1;
    sm_insert(ops, &key);
  }
  return 1;
}

SEC("sk_msg")
int sm_sk_msg(struct sk_msg_md* msg) {
  if (!cfg_bypass) return SK_PASS;
  struct sm_flow_key own = {};
  if (sm_flow_from_msg(msg, &own) < 0) return SK_PASS;
  if (bpf_map_lookup_elem(&sm_stack_flows, &own)) {
    sm_count(SM_CNT_BYPASS_PINNED);
    return SK_PASS;
  }
  struct sm_flow_key peer = {};
  sm_flow_reverse(&own, &peer);
  if (bpf_msg_redirect_hash(msg, &sm_bypass, &peer, BPF_F_INGRESS) == SK_PASS) {
    sm_count(SM_CNT_BYPASS_SENDS);
    return SK_PASS;
  }
  /* The helper answers SK_DROP on a miss; the data must go through the stack instead. */
  __u32 one = 1;
  bpf_map_update_elem(&sm_stack_flows, &own, &one, BPF_ANY);
  sm_count(SM_CNT_BYPASS_MISSES);
  return SK_PASS;
}
