/* The ABI header compiled as C (as the BPF programs see it, minus vmlinux.h): reports its layout
 * so that abi_test.cc can compare it with the C++ view. */
#include <stddef.h>

#include "sockmesh/maps.h"

size_t sm_abi_c_layout(int what);

size_t sm_abi_c_layout(int what) {
  switch (what) {
    case 0:
      return sizeof(struct sm_ip);
    case 1:
      return sizeof(struct sm_workload);
    case 2:
      return offsetof(struct sm_workload, flags);
    case 3:
      return offsetof(struct sm_workload, ifindex);
    case 4:
      return offsetof(struct sm_workload, netns_cookie);
    case 5:
      return sizeof(struct sm_listener_key);
    case 6:
      return offsetof(struct sm_listener_key, kind);
    case 7:
      return sizeof(struct sm_flow_key);
    case 8:
      return offsetof(struct sm_flow_key, local_port);
    case 9:
      return SM_CNT_COUNT;
    default:
      return 0;
  }
}
