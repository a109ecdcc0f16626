/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
#pragma once
/* What every sockmesh BPF program needs: vmlinux.h, libbpf's helpers, the shared ABI, and the
 * few UAPI macros that BTF cannot carry (they are #defines, not types). */
#include "vmlinux.h"

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "sockmesh/consts.h"
#include "sockmesh/maps.h"

#define SM_AF_INET 2
#define SM_AF_INET6 10

#define SM_ETH_ALEN 6
#define SM_ETH_P_IP 0x0800
#define SM_ETH_P_IPV6 0x86DD
#define SM_IPPROTO_TCP 6
#define SM_IPPROTO_UDP 17
/* IPv6 extension headers that sm_parse_l4 steps over. */
#define SM_IPPROTO_HOPOPTS 0
#define SM_IPPROTO_ROUTING 43
#define SM_IPPROTO_DSTOPTS 60
#define SM_SOL_SOCKET 1
#define SM_SO_MARK 36

#define SM_TC_ACT_OK 0
#define SM_TC_ACT_SHOT 2

#define SM_TCP_FIN 0x01
#define SM_TCP_SYN 0x02
#define SM_TCP_RST 0x04
#define SM_TCP_ACK 0x10

#define SM_IP_OFFSET_MASK 0x1fff /* fragment offset bits of iphdr.frag_off (host order) */

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif
