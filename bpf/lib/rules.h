/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
#pragma once
/* Which connections capture leaves alone: the rules that tc (capture.bpf.c) and the listener
 * lookup (lookup.bpf.c) must apply alike. */
#include "lib/maps.h"

/* The proxy's own ports in a pod: never captured. */
static __always_inline bool sm_is_proxy_port(__u16 port) {
  return port == SM_PORT_HBONE || port == SM_PORT_OUTBOUND || port == SM_PORT_INBOUND_PLAIN;
}

/* Connections from the node itself (the kubelet's probes) reach the app uncaptured. */
static __always_inline bool sm_is_node_exempt(const struct sm_ip* ip) {
  __u32* node = bpf_map_lookup_elem(&sm_node_addrs, ip);
  return node && (*node & SM_NODE_ADDR_EXEMPT);
}
