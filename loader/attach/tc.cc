#include "loader/attach/tc.h"

#include <bpf/libbpf.h>

#include <cerrno>
#include <string>

#include "loader/attach/skeleton.h"

namespace sockmesh::loader {
namespace {

bpf_tc_hook hook_for(int ifindex, bpf_tc_attach_point point) {
  bpf_tc_hook hook{};
  hook.sz = sizeof(hook);
  hook.ifindex = ifindex;
  hook.attach_point = point;
  return hook;
}

bpf_tc_opts filter_opts(int prog_fd, uint32_t flags) {
  bpf_tc_opts opts{};
  opts.sz = sizeof(opts);
  opts.handle = kTcHandle;
  opts.priority = kTcPriority;
  opts.prog_fd = prog_fd;
  opts.flags = flags;
  return opts;
}

const char* point_name(bpf_tc_attach_point point) {
  return point == BPF_TC_INGRESS ? "ingress" : "egress";
}

}  // namespace

Result<TcAttachment> attach_capture(int ifindex, int ingress_prog_fd, int egress_prog_fd) {
  route_libbpf_logs();
  TcAttachment out;
  bpf_tc_hook clsact =
      hook_for(ifindex, static_cast<bpf_tc_attach_point>(BPF_TC_INGRESS | BPF_TC_EGRESS));
  int err = bpf_tc_hook_create(&clsact);
  if (err == 0) {
    out.created_clsact = true;
  } else if (err != -EEXIST) {
    if (err == -ENODEV) return Error{ENODEV, "no device #" + std::to_string(ifindex)};
    if (err == -EPERM) {
      return Error{EPERM, "creating the clsact qdisc: permission denied (needs CAP_NET_ADMIN)"};
    }
    return Error::from_errno(err,
                             "creating the clsact qdisc on device #" + std::to_string(ifindex));
  }
  for (auto [point, fd] :
       {std::pair{BPF_TC_INGRESS, ingress_prog_fd}, std::pair{BPF_TC_EGRESS, egress_prog_fd}}) {
    bpf_tc_hook hook = hook_for(ifindex, point);
    bpf_tc_opts opts = filter_opts(fd, BPF_TC_F_REPLACE);
    err = bpf_tc_attach(&hook, &opts);
    if (err != 0) {
      return Error::from_errno(err, std::string("attaching the tc ") + point_name(point) +
                                        " program on device #" + std::to_string(ifindex));
    }
  }
  return out;
}

Status detach_capture(int ifindex, bool remove_clsact) {
  route_libbpf_logs();
  for (auto point : {BPF_TC_INGRESS, BPF_TC_EGRESS}) {
    bpf_tc_hook hook = hook_for(ifindex, point);
    bpf_tc_opts opts = filter_opts(0, 0);
    int err = bpf_tc_detach(&hook, &opts);
    if (err != 0 && err != -ENOENT && err != -EINVAL) {
      return Error::from_errno(err, std::string("detaching the tc ") + point_name(point) +
                                        " program from device #" + std::to_string(ifindex));
    }
  }
  if (remove_clsact) {
    bpf_tc_hook clsact =
        hook_for(ifindex, static_cast<bpf_tc_attach_point>(BPF_TC_INGRESS | BPF_TC_EGRESS));
    int err = bpf_tc_hook_destroy(&clsact);
    if (err != 0 && err != -ENOENT && err != -EINVAL) {
      return Error::from_errno(err,
                               "removing the clsact qdisc from device #" + std::to_string(ifindex));
    }
  }
  return {};
}

Result<TcPrograms> query_capture(int ifindex) {
  route_libbpf_logs();
  TcPrograms out;
  for (auto point : {BPF_TC_INGRESS, BPF_TC_EGRESS}) {
    bpf_tc_hook hook = hook_for(ifindex, point);
    bpf_tc_opts opts = filter_opts(0, 0);
    int err = bpf_tc_query(&hook, &opts);
    if (err == -ENOENT || err == -EINVAL) continue;  // no qdisc or no such filter
    if (err != 0) {
      return Error::from_errno(err, std::string("querying the tc ") + point_name(point) +
                                        " filter of device #" + std::to_string(ifindex));
    }
    (point == BPF_TC_INGRESS ? out.ingress_id : out.egress_id) = opts.prog_id;
  }
  return out;
}

}  // namespace sockmesh::loader
