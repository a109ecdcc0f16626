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

inline std::vector<uint8_t> arp_frame() {
  std::vector<uint8_t> frame(sizeof(ethhdr) + 28, 0);
  auto* eth = reinterpret_cast<ethhdr*>(frame.data());
  std::memset(eth->h_dest, 0xff, 6);
  std::memcpy(eth->h_source, kPodMac.data(), 6);
  eth->h_proto = htons(ETH_P_ARP);
  return frame;
}

}  // namespace sockmesh::testing
