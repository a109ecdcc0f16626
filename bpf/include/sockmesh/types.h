#pragma once
/* Fixed-width integer types for the kernel ABI headers, the same names in BPF C and in C++.
 *
 * BPF programs include vmlinux.h (generated from the running kernel's BTF) before any of these
 * headers; it already defines __u8 .. __u64. User space gets them from the UAPI header. */
#if defined(__bpf__)
#ifndef __VMLINUX_H__
#error "include vmlinux.h before the sockmesh ABI headers"
#endif
#else
#include <linux/types.h>
#endif

#ifdef __cplusplus
#define SM_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define SM_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
