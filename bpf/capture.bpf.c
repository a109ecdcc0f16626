// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* tc programs on an enrolled pod's own eth0, inside the pod's network namespace.
 *
 * Outbound: bpf_sk_assign works only at tc ingress, so egress bounces the app's TCP packets into
 * ingress of the same device (destination MAC := source MAC so that IP receive takes it as
 * PACKET_HOST, and SM_MARK_BOUNCED so that ingress knows where it came from and the pod's fwmark
 * rule routes it to the local table). Ingress assigns a new SYN to the proxy's transparent
 * outbound listener (15001); later packets find the proxy's accepted socket by the usual lookup.
 *
 * Inbound: a SYN from the wire to any port but the proxy's own is assigned to the proxy's inbound
 * plaintext listener (15006). HBONE (15008), known flows and SYNs from the probe SNAT addresses
 * (sm_node_addrs: the kubelet's probes, SNATed on the node) pass untouched.
 *
 * A SYN whose 4-tuple is held by a TIME_WAIT socket (one of the proxy's own sockets in the pod,
 * which closed first) is not assigned: the listener would drop it as a duplicate of the TIME_WAIT
 * entry, and the client would hang until TIME_WAIT ends. It goes to the TIME_WAIT socket instead,
 * which, as for any SYN that reuses a tuple, ends itself and asks for a listener; sm_sk_lookup
 * answers that lookup with the proxy's listener, so the SYN is captured as a new connection.
 *
 * DNS (workloads with SM_WL_CAPTURE_DNS): what the pod sends to port 53 of any address goes to the
 * proxy's DNS sockets in the pod (15053), by the same bounce and assign. TCP: the SYN is assigned
 * to the DNS TCP listener instead of 15001; later segments follow the accepted socket like any
 * captured flow. UDP has no connection the kernel could find again, so every datagram to port 53
 * is bounced and assigned to the DNS UDP socket on its own; the proxy receives it with its
 * original destination (IP_RECVORIGDSTADDR) and answers from that address (IP_PKTINFO on its
 * transparent socket). The answer is for the pod's own IP, so it goes over lo and never meets tc.
 * Without a registered DNS socket of that protocol, DNS is not captured: UDP queries go out as if
 * sockmesh were not there (DNS keeps working while the proxy is down or has no DNS server), a TCP
 * query is an outbound connection like any other (15001, or the fail-closed/open rule).
 *
 * MSS: a SYN or SYN-ACK the app sends is bounced to a proxy socket in this netns, yet it carries
 * the MSS of the app's route to the remote address (eth0's, 1460 or less), and the proxy's socket
 * would then send to the app in segments of that size over lo (65536). tc raises that MSS option
 * to SM_LOCAL_HOP_MSS as it bounces the packet: the proxy's socket, whose route to the app is
 * local, sends large segments (its own path MTU still clamps them). The app's own socket caps its
 * segments at its route's MTU; sockops marks an enrolled app's socket as it connects
 * (SM_MARK_APP_ROUTE), and the pod's rule for that mark gives it the pod's routes with a lo-sized
 * MTU, so that it sends large segments too. Such a socket's SYN can still reach the wire (the
 * proxy's listener missing under fail-open), so every SYN and SYN-ACK passing between eth0 and the
 * wire, either way, has its MSS lowered to what eth0's MTU carries (MTU less 40, 60 over IPv6):
 * the app and a peer out there agree on segments eth0 takes. (TCPMSS --clamp-mss-to-pmtu clamps
 * to the route's MTU; the device's is that of every route the app route raises, since a route
 * with an MTU of its own is copied as it is.)
 * Only the first option is looked at, where Linux and the other common stacks put MSS.
 *
 * Local route: an outbound SYN assigned to the proxy's listener leaves a note in sm_proxy_syns
 * under the app's (netns, 4-tuple), and sockops, as the app's socket is established, consumes it
 * and routes the socket over lo (bypass.bpf.c, sm_route_to_proxy). The app's later segments then
 * go straight to the proxy's socket: tc sees the SYN only. A SYN that goes to the wire under
 * --fail-open removes the tuple's note, so that such a connection keeps eth0.
 *
 * Counters: each program run counts exactly one decision (see enum sm_counter); tc_payload,
 * mss_raised and mss_clamped count what a bounce or a pass also did, and unknown_flow why a pass
 * happened (a later packet of an enrolled pod with no local socket, counted as passed too). */
#include "lib/packet.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Knobs set by the loader before load. */
/* Let a SYN through uncaptured when the proxy's listener is missing (default: drop, so that an
 * enrolled pod never talks around the mesh). */
const volatile bool cfg_fail_open = false;

/* The last error bpf_sk_assign returned (0: none yet), for tests and debugging. */
long sm_last_assign_error = 0;

/* Looks up a socket for the packet's tuple in the current netns, the way TCP demux would. Returns
 * its state (enum BPF_TCP_*), or -1 when there is none. */
static __always_inline int sm_known_socket_state(struct __sk_buff* skb, struct sm_packet* pkt) {
  /* The tuple size must be a constant for the verifier. */
  struct bpf_sock* sk =
      pkt->is_v6
          ? bpf_skc_lookup_tcp(skb, &pkt->tuple, sizeof(pkt->tuple.ipv6), BPF_F_CURRENT_NETNS, 0)
          : bpf_skc_lookup_tcp(skb, &pkt->tuple, sizeof(pkt->tuple.ipv4), BPF_F_CURRENT_NETNS, 0);
  if (!sk) return -1;
  int state = sk->state;
  bpf_sk_release(sk);
  return state;
}

/* A socket that is neither a listener nor in TIME_WAIT owns this flow: let TCP demux have it. */
static __always_inline bool sm_flow_is_known(int state) {
  return state >= 0 && state != BPF_TCP_LISTEN && state != BPF_TCP_TIME_WAIT;
}

/* The proxy's own ports in a pod: never captured. */
static __always_inline bool sm_is_proxy_port(__u16 port) {
  return port == SM_PORT_HBONE || port == SM_PORT_OUTBOUND || port == SM_PORT_INBOUND_PLAIN;
}

/* The kubelet's probes (SNATed to the probe address on the node) reach the app uncaptured. */
static __always_inline bool sm_is_node_exempt(const struct sm_ip* ip) {
  __u32* node = bpf_map_lookup_elem(&sm_node_addrs, ip);
  return node && (*node & SM_NODE_ADDR_EXEMPT);
}

static __always_inline int sm_no_listener(void) {
  sm_count(SM_CNT_NO_LISTENER);
  return cfg_fail_open ? SM_TC_ACT_OK : SM_TC_ACT_SHOT;
}

/* A packet's flow key from its sender's side, in the pod's netns (tc runs there; the pod's
 * record carries its cookie): for a SYN the pod sends, the app socket's key in sm_proxy_syns;
 * reversed (sm_flow_reverse), the receiving listener's side, the key of sm_tw_syns. */
static __always_inline void sm_sender_flow(const struct sm_packet* pkt,
                                           const struct sm_workload* pod,
                                           struct sm_flow_key* flow) {
  flow->netns = pod->netns_cookie;
  flow->reserved = 0;
  flow->local = pkt->src;
  flow->remote = pkt->dst;
  flow->local_port = pkt->sport;
  flow->remote_port = pkt->dport;
}

/* Hands a new SYN to the proxy's listener of the given kind in the pod that owns `pod_ip`. A SYN
 * the pod sent (`app_flow` set) is noted in sm_proxy_syns once assigned: the proof sockops needs
 * to route the app's socket over lo when it is established (bypass.bpf.c, sm_route_to_proxy). */
static __always_inline int sm_assign_to_listener(struct __sk_buff* skb, const struct sm_ip* pod_ip,
                                                 __u32 kind, enum sm_counter captured,
                                                 const struct sm_flow_key* app_flow) {
  struct sm_listener_key key = {.ip = *pod_ip, .kind = kind};
  struct bpf_sock* listener = bpf_map_lookup_elem(&sm_listeners, &key);
  if (!listener) return sm_no_listener();
  long err = bpf_sk_assign(skb, listener, 0);
  bpf_sk_release(listener);
  if (err) {
    sm_last_assign_error = err;
    sm_count(SM_CNT_ASSIGN_FAILED);
    return cfg_fail_open ? SM_TC_ACT_OK : SM_TC_ACT_SHOT;
  }
  if (app_flow) {
    struct sm_peer_note note = {.created_ns = bpf_ktime_get_ns()};
    bpf_map_update_elem(&sm_proxy_syns, app_flow, &note, BPF_ANY);
  }
  sm_count(captured);
  return SM_TC_ACT_OK;
}

/* A SYN that meets a TIME_WAIT socket of its tuple: to the stack, where the TIME_WAIT socket yields
 * to the listener sm_sk_lookup picks (see the top of this file), as long as there is one. */
static __always_inline int sm_pass_to_time_wait(const struct sm_packet* pkt,
                                                const struct sm_workload* pod,
                                                const struct sm_ip* pod_ip, __u32 kind) {
  struct sm_listener_key key = {.ip = *pod_ip, .kind = kind};
  struct bpf_sock* listener = bpf_map_lookup_elem(&sm_listeners, &key);
  if (!listener) return sm_no_listener();
  bpf_sk_release(listener);
  /* Keyed from the listener's side (sk_lookup is told its own netns cookie). */
  struct sm_flow_key sent, flow;
  sm_sender_flow(pkt, pod, &sent);
  sm_flow_reverse(&sent, &flow);
  struct sm_time_wait_syn note = {.kind = kind, .created_ns = bpf_ktime_get_ns()};
  bpf_map_update_elem(&sm_tw_syns, &flow, &note, BPF_ANY);
  sm_count(SM_CNT_TIME_WAIT_SYN);
  return SM_TC_ACT_OK;
}

/* A DNS query of a workload whose DNS the proxy captures: to port 53, any address. */
static __always_inline bool sm_is_dns_query(const struct sm_packet* pkt,
                                            const struct sm_workload* wl) {
  return pkt->dport == SM_PORT_DNS_QUERY && (wl->flags & SM_WL_CAPTURE_DNS);
}

/* Whether the pod that owns `pod_ip` has a proxy socket of this kind registered. */
static __always_inline bool sm_has_listener(const struct sm_ip* pod_ip, __u32 kind) {
  struct sm_listener_key key = {.ip = *pod_ip, .kind = kind};
  struct bpf_sock* listener = bpf_map_lookup_elem(&sm_listeners, &key);
  if (!listener) return false;
  bpf_sk_release(listener);
  return true;
}

#define SM_TCPOPT_MSS 2
#define SM_TCPOLEN_MSS 4

/* The MSS option of a SYN or SYN-ACK, when it is the first option: its offset in the frame, and
 * its value in *mss (network order). 0 when the packet has no such option. */
static __always_inline __u32 sm_mss_option(struct __sk_buff* skb, const struct sm_packet* pkt,
                                           __be16* mss) {
  if (pkt->protocol != SM_IPPROTO_TCP || !(pkt->tcp_flags & SM_TCP_SYN)) return 0;
  __u32 tcp = pkt->l4_offset;
  __u8 doff = 0;
  if (bpf_skb_load_bytes(skb, tcp + 12, &doff, 1) < 0) return 0;
  if ((doff >> 4) * 4 < sizeof(struct tcphdr) + SM_TCPOLEN_MSS) return 0;
  __u8 opt[SM_TCPOLEN_MSS];
  __u32 at = tcp + sizeof(struct tcphdr);
  if (bpf_skb_load_bytes(skb, at, opt, sizeof(opt)) < 0) return 0;
  if (opt[0] != SM_TCPOPT_MSS || opt[1] != SM_TCPOLEN_MSS) return 0;
  __builtin_memcpy(mss, &opt[2], 2);
  return at + 2;
}

/* Writes `to` over the MSS at `at` (from sm_mss_option). The checksum first: for a packet whose
 * checksum is still to be computed (CHECKSUM_PARTIAL, as TCP's own are) the helper leaves it
 * alone, as it must. If the store then fails (the skb could not be made writable that far), the
 * checksum is put back: the packet leaves as it came. */
static __always_inline bool sm_write_mss(struct __sk_buff* skb, const struct sm_packet* pkt,
                                         __u32 at, __be16 from, __u16 to) {
  __be16 new_mss = bpf_htons(to);
  __u32 check = pkt->l4_offset + __builtin_offsetof(struct tcphdr, check);
  if (bpf_l4_csum_replace(skb, check, from, new_mss, sizeof(new_mss)) < 0) return false;
  if (bpf_skb_store_bytes(skb, at, &new_mss, sizeof(new_mss), 0) < 0) {
    bpf_l4_csum_replace(skb, check, new_mss, from, sizeof(new_mss));
    return false;
  }
  return true;
}

/* See "MSS" at the top of this file: a packet bounced to a proxy socket offers the local hop's. */
static __always_inline void sm_raise_mss(struct __sk_buff* skb, const struct sm_packet* pkt) {
  __be16 old_mss = 0;
  __u32 at = sm_mss_option(skb, pkt, &old_mss);
  if (!at || bpf_ntohs(old_mss) >= SM_LOCAL_HOP_MSS) return;
  if (sm_write_mss(skb, pkt, at, old_mss, SM_LOCAL_HOP_MSS)) sm_count(SM_CNT_MSS_RAISED);
}

/* See "MSS" at the top of this file: a SYN or SYN-ACK between eth0 and the wire offers no more
 * than eth0's MTU carries. */
static __always_inline void sm_clamp_mss(struct __sk_buff* skb, const struct sm_packet* pkt) {
  __be16 old_mss = 0;
  __u32 at = sm_mss_option(skb, pkt, &old_mss);
  if (!at) return;
  /* The MTU of the device the packet is on (ifindex 0), written whatever the verdict. */
  __u32 mtu = 0;
  if (bpf_check_mtu(skb, 0, &mtu, 0, 0) < 0) return;
  __u32 headers = pkt->is_v6 ? 60 : 40;
  if (mtu <= headers) return;
  __u32 most = mtu - headers;
  if (bpf_ntohs(old_mss) <= most) return;
  if (sm_write_mss(skb, pkt, at, old_mss, (__u16)most)) sm_count(SM_CNT_MSS_CLAMPED);
}

/* A packet of an enrolled pod that leaves for the wire untouched, but for its MSS. */
static __always_inline int sm_pass_to_wire(struct __sk_buff* skb, const struct sm_packet* pkt) {
  sm_clamp_mss(skb, pkt);
  sm_count(SM_CNT_PASSED);
  return SM_TC_ACT_OK;
}

static __always_inline int sm_bounce_to_ingress(struct __sk_buff* skb, struct sm_packet* pkt) {
  void* data = (void*)(long)skb->data;
  void* data_end = (void*)(long)skb->data_end;
  struct ethhdr* eth = data;
  if ((void*)(eth + 1) > data_end) return SM_TC_ACT_OK;
  /* The source MAC is the device's own, so IP receive sees a packet for this host. The helper
   * also unclones the skb (TCP's egress packets are clones) before writing. */
  __u8 mac[SM_ETH_ALEN];
  __builtin_memcpy(mac, eth->h_source, SM_ETH_ALEN);
  if (bpf_skb_store_bytes(skb, __builtin_offsetof(struct ethhdr, h_dest), mac, SM_ETH_ALEN, 0) < 0)
    return SM_TC_ACT_OK;
  sm_raise_mss(skb, pkt);
  skb->mark |= SM_MARK_BOUNCED;
  sm_count(SM_CNT_BOUNCED);
  if (pkt->protocol == SM_IPPROTO_TCP && pkt->payload_len) sm_count(SM_CNT_TC_PAYLOAD);
  return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
}

SEC("tc")
int sm_tc_egress(struct __sk_buff* skb) {
  struct sm_packet pkt = {};
  if (sm_parse_l4(skb, &pkt) < 0) {
    sm_count(SM_CNT_UNPARSED);
    return SM_TC_ACT_OK;
  }
  if (skb->mark & SM_MARK_PROXY) {
    sm_count(SM_CNT_PROXY_SKIPPED);
    return SM_TC_ACT_OK;
  }
  struct sm_workload* wl = sm_workload_of(&pkt.src);
  if (!wl || !(wl->flags & SM_WL_ENROLLED)) {
    sm_count(SM_CNT_NOT_ENROLLED);
    return SM_TC_ACT_OK;
  }

  if (pkt.protocol == SM_IPPROTO_UDP) {
    /* Every datagram to port 53 on its own: nothing of an earlier one is left to find. Without
     * the proxy's DNS socket the query goes out uncaptured (DNS works without the proxy). */
    if (sm_is_dns_query(&pkt, wl) && sm_has_listener(&pkt.src, SM_LISTENER_DNS_UDP)) {
      return sm_bounce_to_ingress(skb, &pkt);
    }
    sm_count(SM_CNT_PASSED);
    return SM_TC_ACT_OK;
  }

  if (sm_tcp_flags_is_syn(pkt.tcp_flags)) {
    /* Bounce only when ingress will have a listener to assign to; otherwise decide here. A DNS
     * query over TCP without the proxy's DNS listener is an outbound connection like any other. */
    if (sm_is_dns_query(&pkt, wl) && sm_has_listener(&pkt.src, SM_LISTENER_DNS_TCP)) {
      return sm_bounce_to_ingress(skb, &pkt);
    }
    if (!sm_has_listener(&pkt.src, SM_LISTENER_OUTBOUND)) {
      int verdict = sm_no_listener();
      if (verdict == SM_TC_ACT_OK) {
        /* To the wire: a note left by an earlier SYN of this tuple that the proxy took must not
         * have sockops route this connection over lo. */
        struct sm_flow_key app_flow;
        sm_sender_flow(&pkt, wl, &app_flow);
        bpf_map_delete_elem(&sm_proxy_syns, &app_flow);
        sm_clamp_mss(skb, &pkt);
      }
      return verdict;
    }
    return sm_bounce_to_ingress(skb, &pkt);
  }

  /* A later packet of a captured flow: the socket that owns the packet's tuple is the proxy's
   * (its accepted transparent socket, or its transparent connection to the app for inbound).
   * Flows that predate enrollment find no local socket and go to the wire as before. */
  if (sm_flow_is_known(sm_known_socket_state(skb, &pkt))) return sm_bounce_to_ingress(skb, &pkt);
  sm_count(SM_CNT_UNKNOWN_FLOW);
  return sm_pass_to_wire(skb, &pkt);
}

/* A bounced UDP datagram: a DNS query (egress bounces nothing else of UDP) for the proxy's DNS
 * socket. Egress saw that socket a moment ago; if it has gone since (the proxy restarting), the
 * datagram cannot be turned back to the wire, so it is dropped and the resolver's retry goes out
 * uncaptured. */
static __always_inline int sm_ingress_bounced_udp(struct __sk_buff* skb, struct sm_packet* pkt) {
  struct sm_workload* wl = sm_workload_of(&pkt->src);
  if (!wl || !(wl->flags & SM_WL_ENROLLED)) {
    sm_count(SM_CNT_NOT_ENROLLED);
    return SM_TC_ACT_OK;
  }
  if (!sm_is_dns_query(pkt, wl)) {
    sm_count(SM_CNT_PASSED);
    return SM_TC_ACT_OK;
  }
  struct sm_listener_key key = {.ip = pkt->src, .kind = SM_LISTENER_DNS_UDP};
  struct bpf_sock* sk = bpf_map_lookup_elem(&sm_listeners, &key);
  if (!sk) {
    sm_count(SM_CNT_NO_LISTENER);
    return SM_TC_ACT_SHOT;
  }
  long err = bpf_sk_assign(skb, sk, 0);
  bpf_sk_release(sk);
  if (err) {
    sm_last_assign_error = err;
    sm_count(SM_CNT_ASSIGN_FAILED);
    return SM_TC_ACT_SHOT;
  }
  sm_count(SM_CNT_CAPTURED_DNS);
  return SM_TC_ACT_OK;
}

static __always_inline int sm_ingress_bounced(struct __sk_buff* skb, struct sm_packet* pkt) {
  if (pkt->protocol == SM_IPPROTO_UDP) return sm_ingress_bounced_udp(skb, pkt);
  int state = -1;
  if (!sm_tcp_flags_is_syn(pkt->tcp_flags) ||
      sm_flow_is_known(state = sm_known_socket_state(skb, pkt))) {
    /* Keeps SM_MARK_BOUNCED: the fwmark rule delivers it locally. */
    sm_count(SM_CNT_PASSED);
    return SM_TC_ACT_OK;
  }
  struct sm_workload* wl = sm_workload_of(&pkt->src);
  if (!wl || !(wl->flags & SM_WL_ENROLLED)) {
    sm_count(SM_CNT_NOT_ENROLLED);
    return SM_TC_ACT_OK;
  }
  /* The same choice as egress made: the DNS listener when the query has one. */
  __u32 kind = SM_LISTENER_OUTBOUND;
  enum sm_counter captured = SM_CNT_CAPTURED_OUTBOUND;
  if (sm_is_dns_query(pkt, wl) && sm_has_listener(&pkt->src, SM_LISTENER_DNS_TCP)) {
    kind = SM_LISTENER_DNS_TCP;
    captured = SM_CNT_CAPTURED_DNS;
  }
  if (state == BPF_TCP_TIME_WAIT) return sm_pass_to_time_wait(pkt, wl, &pkt->src, kind);
  struct sm_flow_key app_flow;
  sm_sender_flow(pkt, wl, &app_flow);
  return sm_assign_to_listener(skb, &pkt->src, kind, captured, &app_flow);
}

static __always_inline int sm_ingress_from_wire(struct __sk_buff* skb, struct sm_packet* pkt) {
  /* Inbound capture is for TCP; UDP from the wire (answers to uncaptured queries too) passes. */
  if (pkt->protocol != SM_IPPROTO_TCP) {
    sm_count(SM_CNT_PASSED);
    return SM_TC_ACT_OK;
  }
  struct sm_workload* wl = sm_workload_of(&pkt->dst);
  if (!wl || !(wl->flags & SM_WL_ENROLLED)) {
    sm_count(SM_CNT_NOT_ENROLLED);
    return SM_TC_ACT_OK;
  }
  /* Whatever happens to it next, a SYN or SYN-ACK from the wire offers no more than eth0 takes. */
  sm_clamp_mss(skb, pkt);
  if (!(wl->flags & SM_WL_CAPTURE_INBOUND) || sm_is_proxy_port(pkt->dport) ||
      !sm_tcp_flags_is_syn(pkt->tcp_flags)) {
    sm_count(SM_CNT_PASSED);
    return SM_TC_ACT_OK;
  }
  /* The app's own listener is found here too; it is a listener, so the flow is new. */
  int state = sm_known_socket_state(skb, pkt);
  if (sm_flow_is_known(state)) {
    sm_count(SM_CNT_PASSED);
    return SM_TC_ACT_OK;
  }
  /* From the node itself (the kubelet's probes): straight to the app. */
  if (sm_is_node_exempt(&pkt->src)) {
    sm_count(SM_CNT_NODE_EXEMPT);
    return SM_TC_ACT_OK;
  }
  if (state == BPF_TCP_TIME_WAIT) {
    return sm_pass_to_time_wait(pkt, wl, &pkt->dst, SM_LISTENER_INBOUND_PLAIN);
  }
  return sm_assign_to_listener(skb, &pkt->dst, SM_LISTENER_INBOUND_PLAIN, SM_CNT_CAPTURED_INBOUND,
                               NULL);
}

SEC("tc")
int sm_tc_ingress(struct __sk_buff* skb) {
  struct sm_packet pkt = {};
  if (sm_parse_l4(skb, &pkt) < 0) {
    sm_count(SM_CNT_UNPARSED);
    return SM_TC_ACT_OK;
  }
  if (skb->mark & SM_MARK_BOUNCED) return sm_ingress_bounced(skb, &pkt);
  return sm_ingress_from_wire(skb, &pkt);
}
