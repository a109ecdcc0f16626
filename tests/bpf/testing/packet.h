#pragma once
// Crafted Ethernet frames for BPF_PROG_TEST_RUN: IPv4/IPv6 + TCP or UDP, and ARP.
#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <netinet/in.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/ip_address.h"

namespace sockmesh::testing {

inline constexpr std::array<uint8_t, 6> kPodMac = {0x02, 0x00, 0x00, 0x00, 0x00, 0x02};
inline constexpr std::array<uint8_t, 6> kGatewayMac = {0x02, 0x00, 0x00, 0x00, 0x00, 0x01};

enum TcpFlag : uint8_t { kFin = 0x01, kSyn = 0x02, kRst = 0x04, kPsh = 0x08, kAck = 0x10 };

// A frame from `src` to `dst` as the pod's device would carry it (source MAC = the pod's).
inline std::vector<uint8_t> tcp_frame(const Endpoint& src, const Endpoint& dst, uint8_t flags,
                                      size_t payload = 0, int protocol = IPPROTO_TCP) {
  bool v4 = src.ip.is_v4();
  size_t l3 = v4 ? sizeof(iphdr) : sizeof(ipv6hdr);
  size_t l4 = protocol == IPPROTO_TCP ? sizeof(tcphdr) : sizeof(udphdr);
  std::vector<uint8_t> frame(sizeof(ethhdr) + l3 + l4 + payload, 0);
  auto* eth = reinterpret_cast<ethhdr*>(frame.data());
  std::memcpy(eth->h_dest, kGatewayMac.data(), 6);
  std::memcpy(eth->h_source, kPodMac.data(), 6);
  eth->h_proto = htons(v4 ? ETH_P_IP : ETH_P_IPV6);
  uint8_t* l3p = frame.data() + sizeof(ethhdr);
  if (v4) {
    auto* ip = reinterpret_cast<iphdr*>(l3p);
    ip->version = 4;
    ip->ihl = 5;
    ip->ttl = 64;
    ip->protocol = static_cast<uint8_t>(protocol);
    ip->tot_len = htons(static_cast<uint16_t>(l3 + l4 + payload));
    ip->saddr = src.ip.v4_network_order();
    ip->daddr = dst.ip.v4_network_order();
  } else {
    auto* ip6 = reinterpret_cast<ipv6hdr*>(l3p);
    ip6->version = 6;
    ip6->hop_limit = 64;
    ip6->nexthdr = static_cast<uint8_t>(protocol);
    ip6->payload_len = htons(static_cast<uint16_t>(l4 + payload));
    std::memcpy(&ip6->saddr, src.ip.bytes16().data(), 16);
    std::memcpy(&ip6->daddr, dst.ip.bytes16().data(), 16);
  }
  uint8_t* l4p = l3p + l3;
  if (protocol == IPPROTO_TCP) {
    auto* tcp = reinterpret_cast<tcphdr*>(l4p);
    tcp->source = htons(src.port);
    tcp->dest = htons(dst.port);
    tcp->doff = 5;
    tcp->window = htons(65535);
    l4p[13] = flags;
  } else {
    auto* udp = reinterpret_cast<udphdr*>(l4p);
    udp->source = htons(src.port);
    udp->dest = htons(dst.port);
    udp->len = htons(static_cast<uint16_t>(l4 + payload));
  }
  return frame;
}

// Offset of the TCP (or UDP) header in a frame of tcp_frame(), after any IPv6 extension headers
// of with_ipv6_extension() (Hop-by-Hop, routing, destination options).
inline size_t l4_offset(const std::vector<uint8_t>& frame) {
  uint16_t proto = static_cast<uint16_t>(frame[12] << 8 | frame[13]);
  if (proto == ETH_P_IP) return sizeof(ethhdr) + (frame[sizeof(ethhdr)] & 0x0f) * 4u;
  size_t at = sizeof(ethhdr) + sizeof(ipv6hdr);
  uint8_t next = reinterpret_cast<const ipv6hdr*>(frame.data() + sizeof(ethhdr))->nexthdr;
  while ((next == 0 || next == 43 || next == 60) && at + 2 <= frame.size()) {
    next = frame[at];
    at += (frame[at + 1] + 1u) * 8;
  }
  return at;
}

// An IPv6 frame of tcp_frame() with an 8-byte extension header of `type` (0 Hop-by-Hop, 43
// routing, 60 destination options) right after the IPv6 header; `body` fills its bytes 2 to 7.
inline std::vector<uint8_t> with_ipv6_extension(std::vector<uint8_t> frame, uint8_t type,
                                                const std::array<uint8_t, 6>& body) {
  size_t l3 = sizeof(ethhdr);
  auto* ip6 = reinterpret_cast<ipv6hdr*>(frame.data() + l3);
  std::vector<uint8_t> ext = {ip6->nexthdr, 0};  // next header, 8 bytes long
  ext.insert(ext.end(), body.begin(), body.end());
  ip6->nexthdr = type;
  ip6->payload_len = htons(static_cast<uint16_t>(ntohs(ip6->payload_len) + ext.size()));
  frame.insert(frame.begin() + static_cast<std::ptrdiff_t>(l3 + sizeof(ipv6hdr)), ext.begin(),
               ext.end());
  return frame;
}

// As the stack hands a BIG TCP packet (a GSO packet whose payload passes 64 KiB) to the device: a
// Hop-by-Hop header with the jumbo payload option, and the IPv6 payload length 0. The option
// carries the frame's own payload length; the programs only need the header chain.
inline std::vector<uint8_t> with_jumbo_hop_by_hop(std::vector<uint8_t> frame) {
  uint32_t jumbo = htonl(static_cast<uint32_t>(frame.size() - sizeof(ethhdr) - sizeof(ipv6hdr) + 8));
  std::array<uint8_t, 6> option = {0xc2, 4, 0, 0, 0, 0};  // jumbo payload, 4 bytes
  std::memcpy(option.data() + 2, &jumbo, 4);
  frame = with_ipv6_extension(std::move(frame), 0, option);
  reinterpret_cast<ipv6hdr*>(frame.data() + sizeof(ethhdr))->payload_len = 0;
  return frame;
}

// The frame with TCP options after its TCP header (a multiple of 4 bytes), lengths fixed up.
inline std::vector<uint8_t> with_tcp_options(std::vector<uint8_t> frame,
                                             const std::vector<uint8_t>& options) {
  size_t tcp = l4_offset(frame);
  frame.insert(frame.begin() + static_cast<std::ptrdiff_t>(tcp + sizeof(tcphdr)), options.begin(),
               options.end());
  auto* th = reinterpret_cast<tcphdr*>(frame.data() + tcp);
  th->doff = static_cast<uint16_t>((sizeof(tcphdr) + options.size()) / 4);
  uint8_t* l3 = frame.data() + sizeof(ethhdr);
  if ((l3[0] >> 4) == 6) {
    auto* ip6 = reinterpret_cast<ipv6hdr*>(l3);
    ip6->payload_len =
        htons(static_cast<uint16_t>(frame.size() - sizeof(ethhdr) - sizeof(ipv6hdr)));
  } else {
    auto* ip = reinterpret_cast<iphdr*>(l3);
    ip->tot_len = htons(static_cast<uint16_t>(frame.size() - sizeof(ethhdr)));
  }
  return frame;
}

// The TCP checksum over the pseudo-header and segment, as a receiver checks it: 0 when the
// checksum field is right.
inline uint16_t tcp_checksum_residue(const std::vector<uint8_t>& frame) {
  size_t tcp = l4_offset(frame);
  const uint8_t* l3 = frame.data() + sizeof(ethhdr);
  uint32_t sum = 0;
  auto add = [&sum](const uint8_t* p, size_t n) {
    for (size_t i = 0; i + 1 < n; i += 2) sum += static_cast<uint32_t>(p[i] << 8 | p[i + 1]);
    if (n % 2) sum += static_cast<uint32_t>(p[n - 1] << 8);
  };
  size_t len = frame.size() - tcp;
  if ((l3[0] >> 4) == 4) {
    add(l3 + 12, 8);  // source and destination addresses
  } else {
    add(l3 + 8, 32);
  }
  sum += IPPROTO_TCP;
  sum += static_cast<uint32_t>(len);
  add(frame.data() + tcp, len);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum & 0xffff);
}

// Sets the TCP checksum field so that tcp_checksum_residue() is 0.
inline void set_tcp_checksum(std::vector<uint8_t>& frame) {
  size_t at = l4_offset(frame) + 16;
  frame[at] = frame[at + 1] = 0;
  uint16_t c = tcp_checksum_residue(frame);
  frame[at] = static_cast<uint8_t>(c >> 8);
  frame[at + 1] = static_cast<uint8_t>(c & 0xff);
}

// The MSS option's value when it is the segment's first option, else 0.
inline uint16_t first_option_mss(const std::vector<uint8_t>& frame) {
  size_t opt = l4_offset(frame) + sizeof(tcphdr);
  if (frame.size() < opt + 4 || frame[opt] != 2 || frame[opt + 1] != 4) return 0;
  return static_cast<uint16_t>(frame[opt + 2] << 8 | frame[opt + 3]);
}

inline std::vector<uint8_t> arp_frame() {
  std::vector<uint8_t> frame(sizeof(ethhdr) + 28, 0);
  auto* eth = reinterpret_cast<ethhdr*>(frame.data());
  std::memset(eth->h_dest, 0xff, 6);
  std::memcpy(eth->h_source, kPodMac.data(), 6);
  eth->h_proto = htons(ETH_P_ARP);
  return frame;
}

}  // namespace sockmesh::testing
