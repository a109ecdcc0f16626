/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
#pragma once
/* Parsing of the Ethernet + IPv4/IPv6 + TCP/UDP headers that the capture programs decide on. */
#include "lib/maps.h"

struct sm_packet {
  struct sm_ip src;
  struct sm_ip dst;
  struct bpf_sock_tuple tuple; /* as the packet carries it: the lookup's "remote" is src */
  __u32 payload_len;
  __u16 l4_offset; /* of the TCP or UDP header, from the start of the frame */
  __u16 sport; /* host order */
  __u16 dport;
  __u8 tcp_flags; /* 0 for UDP */
  __u8 is_v6;
  __u8 protocol; /* SM_IPPROTO_TCP or SM_IPPROTO_UDP */
};

/* IPv6 extension headers before TCP or UDP: at most this many, of at most this many bytes in all.
 * The one that matters is Hop-by-Hop: the stack puts one with a jumbo payload option on an IPv6
 * GSO packet whose payload passes 64 KiB (BIG TCP). TCP builds such packets for a socket whose
 * route MTU is lo's (two segments at the least, tcp_min_tso_segs), as an enrolled app's route to
 * its proxy is (SM_MARK_APP_ROUTE); a packet the parser gave up on would go to the wire. */
#define SM_IPV6_EXT_MAX 3
#define SM_IPV6_EXT_BYTES 64

/* Enough for Ethernet, an IPv4 header with options or an IPv6 header with extension headers, and
 * TCP with options (UDP's header is shorter). */
#define SM_HEADERS_MAX (14 + 40 + SM_IPV6_EXT_BYTES + 60)

static __always_inline int sm_tcp_flags_is_syn(__u8 flags) {
  return (flags & (SM_TCP_SYN | SM_TCP_ACK | SM_TCP_RST)) == SM_TCP_SYN;
}

/* sm_parse_headers' answer when a header it needs lies past the skb's linear data. */
#define SM_PARSE_SHORT (-2)

/* Fills *pkt from the headers in the skb's linear data: 0 for TCP or UDP it parses, -1 for a packet
 * it does not (see sm_parse_l4), SM_PARSE_SHORT when a header it reads directly is not all in the
 * linear data. IPv6 extension headers are read with bpf_skb_load_bytes, wherever they are. */
static __always_inline int sm_parse_headers(struct __sk_buff* skb, struct sm_packet* pkt) {
  void* data = (void*)(long)skb->data;
  void* data_end = (void*)(long)skb->data_end;

  struct ethhdr* eth = data;
  if ((void*)(eth + 1) > data_end) return SM_PARSE_SHORT;

  struct udphdr* l4; /* the ports of either protocol */
  __u32 l4_offset;
  __u8 protocol;
  if (eth->h_proto == bpf_htons(SM_ETH_P_IP)) {
    struct iphdr* ip = (void*)(eth + 1);
    if ((void*)(ip + 1) > data_end) return SM_PARSE_SHORT;
    protocol = ip->protocol;
    if (protocol != SM_IPPROTO_TCP && protocol != SM_IPPROTO_UDP) return -1;
    if (ip->frag_off & bpf_htons(SM_IP_OFFSET_MASK)) return -1;
    __u32 ihl = ip->ihl * 4;
    if (ihl < sizeof(*ip)) return -1;
    l4 = (void*)ip + ihl;
    if ((void*)(l4 + 1) > data_end) return SM_PARSE_SHORT;
    l4_offset = sizeof(*eth) + ihl;
    sm_ip_from_v4(&pkt->src, ip->saddr);
    sm_ip_from_v4(&pkt->dst, ip->daddr);
    pkt->tuple.ipv4.saddr = ip->saddr;
    pkt->tuple.ipv4.daddr = ip->daddr;
    pkt->tuple.ipv4.sport = l4->source;
    pkt->tuple.ipv4.dport = l4->dest;
    pkt->is_v6 = 0;
  } else if (eth->h_proto == bpf_htons(SM_ETH_P_IPV6)) {
    struct ipv6hdr* ip6 = (void*)(eth + 1);
    if ((void*)(ip6 + 1) > data_end) return SM_PARSE_SHORT;
    protocol = ip6->nexthdr;
    l4_offset = sizeof(*eth) + sizeof(*ip6);
    for (int i = 0; i < SM_IPV6_EXT_MAX; i++) {
      if (protocol != SM_IPPROTO_HOPOPTS && protocol != SM_IPPROTO_ROUTING &&
          protocol != SM_IPPROTO_DSTOPTS) {
        break;
      }
      /* next header, length in 8-byte units not counting the first 8; a routing header's type
       * and segments left */
      __u8 ext[4];
      if (bpf_skb_load_bytes(skb, l4_offset, ext, sizeof(ext)) < 0) return -1;
      /* With segments left, the destination address is a waypoint, not the socket's peer: the
       * tuple would be wrong, so such a packet is not parsed (let through, as before). */
      if (protocol == SM_IPPROTO_ROUTING && ext[3] != 0) return -1;
      protocol = ext[0];
      l4_offset += ((__u32)ext[1] + 1) * 8;
      if (l4_offset > sizeof(*eth) + sizeof(*ip6) + SM_IPV6_EXT_BYTES) return -1;
    }
    if (protocol != SM_IPPROTO_TCP && protocol != SM_IPPROTO_UDP) return -1;
    /* Bounded above for the verifier (the loop's check does it at run time). */
    if (l4_offset > sizeof(*eth) + sizeof(*ip6) + SM_IPV6_EXT_BYTES) return -1;
    l4 = data + l4_offset;
    if ((void*)(l4 + 1) > data_end) return SM_PARSE_SHORT;
    sm_ip_from_v6(&pkt->src, ip6->saddr.in6_u.u6_addr32);
    sm_ip_from_v6(&pkt->dst, ip6->daddr.in6_u.u6_addr32);
    __builtin_memcpy(pkt->tuple.ipv6.saddr, ip6->saddr.in6_u.u6_addr32, 16);
    __builtin_memcpy(pkt->tuple.ipv6.daddr, ip6->daddr.in6_u.u6_addr32, 16);
    pkt->tuple.ipv6.sport = l4->source;
    pkt->tuple.ipv6.dport = l4->dest;
    pkt->is_v6 = 1;
  } else {
    return -1;
  }

  pkt->protocol = protocol;
  pkt->l4_offset = (__u16)l4_offset;
  pkt->sport = bpf_ntohs(l4->source);
  pkt->dport = bpf_ntohs(l4->dest);
  __u32 headers = l4_offset + sizeof(struct udphdr);
  if (protocol == SM_IPPROTO_TCP) {
    struct tcphdr* tcp = (void*)l4;
    if ((void*)(tcp + 1) > data_end) return SM_PARSE_SHORT;
    pkt->tcp_flags = ((__u8*)tcp)[13];
    headers = l4_offset + tcp->doff * 4;
  }
  pkt->payload_len = skb->len > headers ? skb->len - headers : 0;
  return 0;
}

/* Fills *pkt from a TCP or UDP packet. Returns 0 for TCP or UDP over IPv4 (first fragment) or IPv6
 * (behind Hop-by-Hop, destination options and spent routing headers, see SM_IPV6_EXT_MAX), -1 for
 * anything else, which the programs let through and count (SM_CNT_UNPARSED). The ports sit at the
 * same offsets in both headers; only TCP has flags and a variable header length.
 *
 * The headers are parsed where they are; only when one is past the linear data are they pulled
 * in. A TCP segment the stack builds has its headers linear and its payload in pages: pulling a
 * fixed SM_HEADERS_MAX bytes would copy payload into a new head for every such segment (the
 * pull reallocates the head of TCP's clone), which cost about as much as the rest of the egress
 * program (bench/hbone_profile.py lists the programs' time per round trip). */
static __always_inline int sm_parse_l4(struct __sk_buff* skb, struct sm_packet* pkt) {
  int rv = sm_parse_headers(skb, pkt);
  if (rv != SM_PARSE_SHORT) return rv;
  __u32 linear = (__u32)((long)skb->data_end - (long)skb->data);
  if (skb->len <= linear) return -1; /* truncated: there is nothing more to pull */
  __u32 want = skb->len < SM_HEADERS_MAX ? skb->len : SM_HEADERS_MAX;
  if (bpf_skb_pull_data(skb, want) < 0) return -1;
  return sm_parse_headers(skb, pkt) == 0 ? 0 : -1;
}
