// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* sockops + sk_msg on a cgroup v2: the local hop between an app and the proxy skips the TCP/IP
 * stack in one direction. Both ends of such a connection go into a SOCKHASH under their own (netns,
 * 4-tuple): the app's into sm_bypass, where sk_msg is attached, the proxy's (SM_MARK_PROXY with
 * SM_MARK_PROXY_MAP) into sm_bypass_proxy, where nothing is; sk_msg then moves each sendmsg of
 * the app straight into the proxy socket's receive queue (BPF_F_INGRESS), and the proxy's sends
 * never run it.
 *
 * The pairing rule: two sockets are paired only when they are provably the two ends of one
 * connection in one network namespace. The active end proves it by being established in the
 * cgroup (sockops ran for it) and by being a socket that talks to a local peer: the proxy's sockets
 * marked SM_MARK_LOCAL_HOP, or an app socket of an enrolled workload whose record names this very
 * netns and whose SYN tc gave to the proxy there (its note in sm_proxy_syns) or whose peer is its
 * own pod's address. It leaves a note in sm_await_peer under its (netns, 4-tuple). The passive end
 * joins only if it finds a fresh note under the reversed tuple in its own netns. Anything else
 * stays on the stack (sockets whose peer is not local must stay out: in the SOCKHASH a blocking
 * recv() can fail with EAGAIN when the sockmap receive path wakes on unrelated events). Notes are
 * removed when consumed, when their socket closes, and are refused when older than
 * SM_NOTE_LIFETIME_NS.
 *
 * Only the app's sends are redirected. The proxy's sends towards the app go through the stack, so
 * that the app's receive queue is TCP's: an app that closes with unread data sends RST as it would
 * without the mesh (bytes redirected into a socket's ingress queue are not counted as unread at
 * close, and the close would be a FIN), and the app's receive window bounds what the proxy queues
 * towards it (redirected bytes are queued without limit).
 *
 * It is an acceleration: whenever the redirect misses, the send goes through the stack (SK_PASS)
 * and is counted; that socket then stays on the stack path (sm_stack_flows), so that bytes sent
 * later cannot overtake bytes still queued in the peer's normal receive queue. The proxy also puts
 * a flow there when it stops reading from it (its send side is blocked): from then on the app's
 * bytes meet TCP's flow control instead of piling up in the proxy socket's ingress queue.
 *
 * sockops also gives an enrolled app's sockets the pod's lo-sized route (SM_MARK_APP_ROUTE, see
 * sm_route_app_socket), so that what they send to the proxy through the stack goes in large
 * segments; that part runs with or without the bypass (cfg_app_route). Once established, such a
 * socket whose peer is proven to be the proxy is routed over lo altogether (sm_route_to_proxy): its
 * segments then skip tc and the bounce. */
#include "lib/maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Knobs set by the loader before load. */
const volatile bool cfg_bypass = true; /* false: sockops inserts nothing, sk_msg always passes */
/* false: enrolled apps' sockets keep the pod's own routes (no SM_MARK_APP_ROUTE) */
const volatile bool cfg_app_route = true;

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
  key->netns = bpf_get_netns_cookie(ops);
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
  key->netns = bpf_get_netns_cookie(msg);
  return 0;
}

/* Whether `ip` is an address of the pod whose netns the socket of `key` is in. */
static __always_inline bool sm_is_own_pod_address(const struct sm_flow_key* key,
                                                  const struct sm_ip* ip) {
  struct sm_workload* wl = sm_workload_of(ip);
  return wl && wl->netns_cookie == key->netns;
}

/* Whether an actively opened socket talks to a local peer. `to_proxy`: tc gave its SYN to the
 * proxy in this netns (sm_syn_went_to_proxy). */
static __always_inline bool sm_active_has_local_peer(struct bpf_sock_ops* ops,
                                                     const struct sm_flow_key* key, bool to_proxy) {
  struct bpf_sock* sk = ops->sk;
  if (!sk) return false;
  __u32 mark = sk->mark;
  if (mark & SM_MARK_PROXY) return (mark & SM_MARK_LOCAL_HOP) != 0;
  /* An app socket of an enrolled workload. A socket with the workload's address in another netns
   * (a host process, another pod) is not that app. */
  struct sm_workload* wl = sm_workload_of(&key->local);
  if (!wl || !(wl->flags & SM_WL_ENROLLED)) return false;
  if (wl->netns_cookie != key->netns) {
    sm_count(SM_CNT_BYPASS_REFUSED);
    return false;
  }
  if (to_proxy) return true;
  /* Not captured: its peer is local only when it is the pod's own address (an app talking to
   * itself, over lo). A SYN that failed open to the wire (--fail-open, no listener) has its peer
   * out there: enrollment alone would put that socket into the SOCKHASH. */
  return sm_is_own_pod_address(key, &key->remote);
}

/* Whether a passively opened socket's peer is local: its active end left a fresh note in this
 * netns. */
static __always_inline bool sm_passive_has_local_peer(const struct sm_flow_key* key) {
  struct sm_flow_key peer_key = {};
  sm_flow_reverse(key, &peer_key);
  struct sm_peer_note* note = bpf_map_lookup_elem(&sm_await_peer, &peer_key);
  if (note) {
    __u64 age = bpf_ktime_get_ns() - note->created_ns;
    bpf_map_delete_elem(&sm_await_peer, &peer_key);
    if (age <= SM_NOTE_LIFETIME_NS) return true;
    sm_count(SM_CNT_BYPASS_REFUSED);
    return false;
  }
  /* No note is normal for a peer elsewhere. A peer with the address of an enrolled app of this
   * very netns that left none is a socket outside the pod's cgroup (or one established before the
   * bypass): it is not paired, and that is worth counting. */
  struct sm_workload* wl = sm_workload_of(&key->remote);
  if (wl && (wl->flags & SM_WL_ENROLLED) && wl->netns_cookie == key->netns) {
    sm_count(SM_CNT_BYPASS_REFUSED);
  }
  return false;
}

static __always_inline bool sm_insert(struct bpf_sock_ops* ops, struct sm_flow_key* key) {
  /* A new connection that reuses a 4-tuple must not inherit an old one's stack pinning. */
  bpf_map_delete_elem(&sm_stack_flows, key);
  /* The proxy's end goes where no sk_msg program runs on its sends (bpf/lib/maps.h), if that
   * proxy looks for it there (SM_MARK_PROXY_MAP; an older proxy looks in sm_bypass only). A
   * passive proxy socket has its listener's mark. */
  struct bpf_sock* sk = ops->sk;
  __u32 proxy_map = SM_MARK_PROXY | SM_MARK_PROXY_MAP;
  long rc = (sk && (sk->mark & proxy_map) == proxy_map)
                ? bpf_sock_hash_update(ops, &sm_bypass_proxy, key, BPF_ANY)
                : bpf_sock_hash_update(ops, &sm_bypass, key, BPF_ANY);
  if (rc != 0) {
    sm_count(SM_CNT_SOCKOPS_INSERT_FAILED);
    return false;
  }
  sm_count(SM_CNT_SOCKOPS_INSERTED);
  /* Told when it closes, so that its note and pinning go with it. */
  bpf_sock_ops_cb_flags_set(ops, BPF_SOCK_OPS_STATE_CB_FLAG);
  return true;
}

/* A socket of ours closed: nothing keyed by its flow may outlive it (the 4-tuple can be reused at
 * once by a new connection). Its SOCKHASH entry the kernel removes itself. */
static __always_inline void sm_forget(struct bpf_sock_ops* ops) {
  struct sm_flow_key key = {};
  if (sm_flow_from_sockops(ops, &key) < 0) return;
  if (bpf_map_delete_elem(&sm_await_peer, &key) == 0) sm_count(SM_CNT_BYPASS_NOTES_EXPIRED);
  bpf_map_delete_elem(&sm_stack_flows, &key);
}

/* Sets the socket's SO_MARK; a new value drops its cached route (sk_dst_reset). */
static __always_inline bool sm_set_mark(struct bpf_sock_ops* ops, int mark) {
  return bpf_setsockopt(ops, SM_SOL_SOCKET, SM_SO_MARK, &mark, sizeof(mark)) == 0;
}

/* An enrolled app's socket (see SM_MARK_APP_ROUTE), as it connects or once it was accepted.
 * TCP_CONNECT_CB runs at the start of tcp_connect(), before the socket's route is rebuilt and its
 * MSS derived from that route; a new mark drops the cached route (sk_dst_reset), so both follow
 * the mark's rule. An accepted socket (PASSIVE_ESTABLISHED) sent its SYN-ACK on the pod's route
 * already; its next send looks its route up again under the mark, and TCP raises its MSS to the
 * new path MTU, up to what the peer offered: lo's from a proxy that dialled it (that SYN came over
 * lo), at most eth0's from the wire (tc lowers a larger one). A socket that already has a mark is
 * left alone: the proxy's own, or an app's that routes by it. So is a socket whose source
 * address is not the workload's (a second network's, say): it is not the pod's captured traffic. */
static __always_inline void sm_route_app_socket(struct bpf_sock_ops* ops,
                                                const struct sm_flow_key* key) {
  struct bpf_sock* sk = ops->sk;
  if (!sk || sk->mark != 0) return;
  struct sm_workload* wl = sm_workload_of(&key->local);
  if (!wl || !(wl->flags & SM_WL_ENROLLED) || wl->netns_cookie != key->netns) return;
  if (sm_set_mark(ops, SM_MARK_APP_ROUTE)) sm_count(SM_CNT_APP_ROUTED);
}

/* Whether the socket's SYN went to the proxy in its pod: tc's note (SM_MAP_PROXY_SYNS) for this
 * (netns, 4-tuple), consumed here whatever the answer, so that it cannot vouch for a later
 * connection of the tuple. */
static __always_inline bool sm_syn_went_to_proxy(const struct sm_flow_key* key) {
  struct sm_peer_note* note = bpf_map_lookup_elem(&sm_proxy_syns, key);
  if (!note) return false;
  __u64 age = bpf_ktime_get_ns() - note->created_ns;
  bpf_map_delete_elem(&sm_proxy_syns, key);
  return age <= SM_PROXY_SYN_LIFETIME_NS;
}

/* An enrolled app's established socket whose peer is proven to be the proxy in its own netns
 * gets the bounce mark: the pod's rule for it routes everything over lo (a local default route),
 * so its segments reach the proxy's socket without eth0, tc and the bounce (tc would bounce every
 * one of them to that very socket, the only one in this netns with the 4-tuple). The proof: tc's
 * note of the app's SYN (active side), or the pairing note of its peer's dial (passive side, with
 * the bypass). What went before (the SYN, or the SYN-ACK of an accepted socket) went through tc and
 * has arrived: the socket's next segment answers it. An app's socket with a mark of its own keeps
 * it and its routes (as for SM_MARK_APP_ROUTE). */
static __always_inline void sm_route_to_proxy(struct bpf_sock_ops* ops) {
  struct bpf_sock* sk = ops->sk;
  if (!sk) return;
  __u32 mark = sk->mark;
  if (mark != 0 && mark != SM_MARK_APP_ROUTE) return;
  if (sm_set_mark(ops, SM_MARK_BOUNCED)) {
    sm_count(SM_CNT_LOCAL_ROUTED);
    /* Told when it closes (sm_unroute). */
    bpf_sock_ops_cb_flags_set(ops, ops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
  }
}

/* A socket routed over lo that closes loses the mark: TCP lets it connect again after
 * connect(AF_UNSPEC), and that connect looks its route up before sockops runs (TCP_CONNECT_CB
 * comes after), so with the bounce mark the new SYN would be routed into the pod past tc (IPv6:
 * delivered to whatever listens there on the destination's port; IPv4: no route). With the
 * mark gone it connects as a new socket does. A TIME_WAIT socket copied the mark already, so its
 * answers still go over lo. An app's own mark of that value would be routed over lo by the
 * pod's rule anyway. */
static __always_inline void sm_unroute(struct bpf_sock_ops* ops) {
  struct bpf_sock* sk = ops->sk;
  if (sk && sk->mark == SM_MARK_BOUNCED) sm_set_mark(ops, 0);
}

SEC("sockops")
int sm_sockops(struct bpf_sock_ops* ops) {
  __u32 op = ops->op;
  struct sm_flow_key key = {};
  if (op == BPF_SOCK_OPS_TCP_CONNECT_CB) {
    if (cfg_app_route && sm_flow_from_sockops(ops, &key) == 0) sm_route_app_socket(ops, &key);
    return 1;
  }
  if (op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) {
    if (sm_flow_from_sockops(ops, &key) < 0) return 1;
    if (cfg_app_route) sm_route_app_socket(ops, &key);
    if (cfg_bypass && sm_passive_has_local_peer(&key)) {
      sm_insert(ops, &key);
      /* An app's socket the proxy dialled keeping the client's address (the proxy's own accepted
       * sockets carry its mark; a peer at the pod's own address, an app or the proxy dialling
       * from it, is reached over lo already). */
      if (cfg_app_route && !sm_is_own_pod_address(&key, &key.remote)) sm_route_to_proxy(ops);
    }
    return 1;
  }
  if (op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB) {
    if (sm_flow_from_sockops(ops, &key) < 0) return 1;
    bool to_proxy = sm_syn_went_to_proxy(&key);
    if (to_proxy && cfg_app_route) sm_route_to_proxy(ops);
    if (!cfg_bypass || !sm_active_has_local_peer(ops, &key, to_proxy)) return 1;
    /* ACTIVE_ESTABLISHED runs before the handshake's last ACK leaves, so the note is there
     * before the passive side looks for it. */
    struct sm_peer_note note = {.created_ns = bpf_ktime_get_ns()};
    if (sm_insert(ops, &key)) bpf_map_update_elem(&sm_await_peer, &key, &note, BPF_ANY);
  } else if (op == BPF_SOCK_OPS_STATE_CB && ops->args[1] == BPF_TCP_CLOSE) {
    sm_unroute(ops);
    if (cfg_bypass) sm_forget(ops);
  }
  return 1;
}

SEC("sk_msg")
int sm_sk_msg(struct sk_msg_md* msg) {
  if (!cfg_bypass) return SK_PASS;
  /* The proxy's sends keep TCP's semantics for the app (see the top of this file). Its sockets
   * are in sm_bypass_proxy, where this program does not run, except those of a proxy older than
   * that map, or put here by an older sockops before an upgrade: those are guarded here. */
  struct bpf_sock* sk = msg->sk;
  if (sk && (sk->mark & SM_MARK_PROXY)) {
    sm_count(SM_CNT_PROXY_STACK_SENDS);
    return SK_PASS;
  }
  struct sm_flow_key own = {};
  if (sm_flow_from_msg(msg, &own) < 0) return SK_PASS;
  if (bpf_map_lookup_elem(&sm_stack_flows, &own)) {
    sm_count(SM_CNT_BYPASS_PINNED);
    return SK_PASS;
  }
  struct sm_flow_key peer = {};
  sm_flow_reverse(&own, &peer);
  /* The peer is the proxy, or (an app talking to its own pod's address) another app; also an
   * older sockmesh's proxy socket, which sits in sm_bypass. A miss changes nothing. */
  if (bpf_msg_redirect_hash(msg, &sm_bypass_proxy, &peer, BPF_F_INGRESS) == SK_PASS ||
      bpf_msg_redirect_hash(msg, &sm_bypass, &peer, BPF_F_INGRESS) == SK_PASS) {
    sm_count(SM_CNT_BYPASS_SENDS);
    return SK_PASS;
  }
  /* The helper answers SK_DROP on a miss; the data must go through the stack instead. */
  __u32 one = 1;
  bpf_map_update_elem(&sm_stack_flows, &own, &one, BPF_ANY);
  sm_count(SM_CNT_BYPASS_MISSES);
  return SK_PASS;
}
