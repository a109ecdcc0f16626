#pragma once
// The capture programs on a pod's device: a clsact qdisc (reused when present) with one filter on
// each of ingress and egress, at a fixed handle and priority so that attaching again replaces
// ours and leaves other filters alone. Works in the calling thread's network namespace.
#include <cstdint>

#include "loader/maps/result.h"

namespace sockmesh::loader {

using maps::Error;
using maps::Result;
using maps::Status;

constexpr uint32_t kTcHandle = 0x534d;  // "SM"
constexpr uint32_t kTcPriority = 1;

struct TcAttachment {
  bool created_clsact = false;  // no clsact existed before: detaching may remove it again
};

Result<TcAttachment> attach_capture(int ifindex, int ingress_prog_fd, int egress_prog_fd);

// Removes our filters; with `remove_clsact`, the qdisc too (only when we created it).
Status detach_capture(int ifindex, bool remove_clsact);

// The program ids our filters run, 0 where none is attached.
struct TcPrograms {
  uint32_t ingress_id = 0;
  uint32_t egress_id = 0;
};
Result<TcPrograms> query_capture(int ifindex);

}  // namespace sockmesh::loader
