#include "loader/attach/node.h"

#include <bpf/bpf.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/log.h"
#include "bypass.skel.h"
#include "capture.skel.h"
#include "loader/attach/bpffs.h"
#include "loader/attach/map_upgrade.h"
#include "loader/attach/preflight.h"
#include "loader/attach/program_identity.h"
#include "loader/attach/sk_lookup.h"
#include "loader/attach/skeleton.h"
#include "loader/maps/unique_fd.h"
#include "loader/maps/workload_map.h"

namespace sockmesh::loader {
namespace {

using maps::UniqueFd;

constexpr const char* kMapNames[] = {SM_MAP_WORKLOADS,  SM_MAP_LISTENERS,    SM_MAP_COUNTERS,
                                     SM_MAP_BYPASS,     SM_MAP_BYPASS_PROXY, SM_MAP_STACK_FLOWS,
                                     SM_MAP_AWAIT_PEER, SM_MAP_NODE_ADDRS,   SM_MAP_TIME_WAIT_SYNS,
                                     SM_MAP_PROXY_SYNS};
constexpr const char* kProgramNames[] = {kProgTcEgress, kProgTcIngress, kProgSockops, kProgSkMsg};

// Pins `prog_fd` at `path` unless an identical program is pinned there already. Replacing goes
// through a temporary pin and rename(), so the path never disappears.
Result<bool> pin_program(int prog_fd, const std::string& path) {
  auto fresh = identity_of(prog_fd);
  if (!fresh) return fresh.error();
  if (pin_exists(path)) {
    UniqueFd pinned(bpf_obj_get(path.c_str()));
    if (pinned) {
      auto old = identity_of(pinned.get());
      if (old && old.value() == fresh.value()) return false;
    }
    std::string tmp = path + "_next";  // bpffs refuses names with a dot
    unlink(tmp.c_str());
    if (bpf_obj_pin(prog_fd, tmp.c_str()) != 0) return Error::from_errno(errno, "pinning " + tmp);
    if (rename(tmp.c_str(), path.c_str()) != 0) {
      int err = errno;
      unlink(tmp.c_str());
      return Error::from_errno(err, "replacing " + path);
    }
    return true;
  }
  if (bpf_obj_pin(prog_fd, path.c_str()) != 0) return Error::from_errno(errno, "pinning " + path);
  return true;
}

Result<UniqueFd> open_pin(const std::string& path, const char* what) {
  UniqueFd fd(bpf_obj_get(path.c_str()));
  if (!fd) {
    int err = errno;
    if (err == ENOENT) return Error{err, std::string(what) + " is not pinned at " + path};
    return Error::from_errno(err, "opening " + path);
  }
  return fd;
}

Status attach_sockops(const std::string& pin_root, const std::string& cgroup_dir, int prog_fd,
                      InstallReport* report) {
  auto want_id = cgroup_id_of(cgroup_dir);
  if (!want_id) return want_id.error();
  auto prog = identity_of(prog_fd);
  if (!prog) return prog.error();
  std::string path = link_pin(pin_root, kLinkSockops);

  if (pin_exists(path)) {
    auto link = open_pin(path, "the sockops link");
    if (!link) return link.error();
    bpf_link_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(link->get(), &info, &len) != 0) {
      return Error::from_errno(errno, "reading " + path);
    }
    if (info.cgroup.cgroup_id == 0) {
      // Its cgroup was removed; the link is dead weight.
      unlink(path.c_str());
      report->changes.push_back("dropped the sockops link of a removed cgroup");
    } else if (info.cgroup.cgroup_id != *want_id) {
      return Error{EEXIST, "sockops of pin root " + pin_root + " is attached to cgroup id " +
                               std::to_string(info.cgroup.cgroup_id) + ", not to " + cgroup_dir +
                               " (id " + std::to_string(*want_id) +
                               "): uninstall first, or install with the same --cgroup"};
    } else {
      if (info.prog_id != prog->id) {
        if (bpf_link_update(link->get(), prog_fd, nullptr) != 0) {
          return Error::from_errno(errno, "moving the sockops link to the new program");
        }
        report->changes.push_back("sockops link now runs program id " + std::to_string(prog->id));
      }
      return {};
    }
  }

  UniqueFd cgroup(::open(cgroup_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cgroup) return Error::from_errno(errno, "opening cgroup " + cgroup_dir);
  UniqueFd link(bpf_link_create(prog_fd, cgroup.get(), BPF_CGROUP_SOCK_OPS, nullptr));
  if (!link) return Error::from_errno(errno, "attaching sockops to cgroup " + cgroup_dir);
  if (bpf_obj_pin(link.get(), path.c_str()) != 0)
    return Error::from_errno(errno, "pinning " + path);
  report->changes.push_back("attached sockops to cgroup " + cgroup_dir);
  return {};
}

Result<uint32_t> attached_sk_msg(int map_fd) {
  uint32_t ids[4] = {};
  uint32_t count = 4;
  uint32_t flags = 0;
  if (bpf_prog_query(map_fd, BPF_SK_MSG_VERDICT, 0, &flags, ids, &count) != 0) {
    return Error::from_errno(errno, "querying the sk_msg program of " SM_MAP_BYPASS);
  }
  return count > 0 ? ids[0] : 0u;
}

Status attach_sk_msg(const std::string& pin_root, int prog_fd, InstallReport* report) {
  auto map = open_pin(pin_root + "/" + SM_MAP_BYPASS, "the bypass map");
  if (!map) return map.error();
  auto prog = identity_of(prog_fd);
  if (!prog) return prog.error();
  auto current = attached_sk_msg(map->get());
  if (current && *current == prog->id) return {};
  if (bpf_prog_attach(prog_fd, map->get(), BPF_SK_MSG_VERDICT, 0) != 0) {
    return Error::from_errno(errno, "attaching sk_msg to " SM_MAP_BYPASS);
  }
  report->changes.push_back("attached sk_msg (program id " + std::to_string(prog->id) + ") to " +
                            SM_MAP_BYPASS);
  return {};
}

template <typename Skel>
Status pin_programs(const BpfSkeleton<Skel>& skel, const std::string& pin_root,
                    InstallReport* report) {
  bpf_program* prog = nullptr;
  bpf_object__for_each_program(prog, skel->obj) {
    std::string name = bpf_program__name(prog);
    auto changed = pin_program(bpf_program__fd(prog), program_pin(pin_root, name));
    if (!changed) return changed.error();
    if (*changed) report->changes.push_back("pinned program " + name);
  }
  return {};
}

}  // namespace

std::string program_pin(const std::string& pin_root, const std::string& program) {
  return pin_root + "/" SM_PIN_PROGS_DIR "/" + program;
}

std::string link_pin(const std::string& pin_root, const std::string& link) {
  return pin_root + "/" SM_PIN_LINKS_DIR "/" + link;
}

Result<uint64_t> cgroup_id_of(const std::string& cgroup_dir) {
  struct stat st {};
  if (stat(cgroup_dir.c_str(), &st) != 0) {
    return Error::from_errno(errno, "cgroup " + cgroup_dir);
  }
  if (!S_ISDIR(st.st_mode)) return Error{ENOTDIR, "cgroup " + cgroup_dir + " is not a directory"};
  return static_cast<uint64_t>(st.st_ino);
}

// sockops + sk_msg: load, pin, attach (the pinned program may be an identical older instance).
Status install_bypass(const InstallOptions& options, const std::string& root,
                      const std::string& cgroup, InstallReport* report) {
  if (options.refuse_bypass_for_test) return Error{ENOTSUP, "refused for the test"};
  if (auto missing = probe_bypass_features(); !missing.empty()) {
    return Error{ENOTSUP, "the kernel lacks: " + missing};
  }
  auto bypass = BpfSkeleton<bypass_bpf>::open("bypass", root);
  if (!bypass) return bypass.error();
  bypass.value()->rodata->cfg_bypass = options.bypass;
  bypass.value()->rodata->cfg_app_route = options.app_route;
  if (auto s = bypass->load(&report->changes, MapChanges::kReplace); !s) return s.error();
  if (auto s = pin_programs(*bypass, root, report); !s) return s.error();
  auto sockops = open_pin(program_pin(root, kProgSockops), "the sockops program");
  if (!sockops) return sockops.error();
  if (auto s = attach_sockops(root, cgroup, sockops->get(), report); !s) return s.error();
  auto sk_msg = open_pin(program_pin(root, kProgSkMsg), "the sk_msg program");
  if (!sk_msg) return sk_msg.error();
  return attach_sk_msg(root, sk_msg->get(), report);
}

// Takes away whatever install_bypass() got as far as pinning or attaching.
void remove_bypass(const std::string& root) {
  std::string link_path = link_pin(root, kLinkSockops);
  if (UniqueFd link(bpf_obj_get(link_path.c_str())); link) bpf_link_detach(link.get());
  for (const std::string& path : {link_path, program_pin(root, kProgSockops),
                                  program_pin(root, kProgSkMsg)}) {
    unlink(path.c_str());
  }
}

Result<InstallReport> install(const InstallOptions& options) {
  InstallReport report;
  if (auto s = require_capabilities(
          {Capability::kBpf, Capability::kNetAdmin, Capability::kSysAdmin}, "install");
      !s) {
    return s.error();
  }
  if (auto s = probe_kernel_features(); !s) return s.error();

  std::string cgroup = options.cgroup;
  if (cgroup.empty()) {
    auto found = find_cgroup2_mount();
    if (!found) return found.error();
    cgroup = *found;
  }
  if (auto s = require_cgroup2_dir(cgroup); !s) return s.error();

  const std::string& root = options.pin_root;
  bool fresh = !pin_exists(root + "/" + SM_MAP_WORKLOADS);
  if (auto s = ensure_bpffs_dir(root); !s) return s.error();
  for (const char* sub : {SM_PIN_PROGS_DIR, SM_PIN_LINKS_DIR}) {
    if (auto s = make_dirs(root + "/" + sub, 0700); !s) return s.error();
  }

  // Loading creates the maps, or reuses the pinned ones (libbpf checks their shape).
  auto capture = BpfSkeleton<capture_bpf>::open("capture", root);
  if (!capture) return capture.error();
  capture.value()->rodata->cfg_fail_open = options.fail_open;
  if (auto s = capture->load(&report.changes, MapChanges::kReplace); !s) return s.error();
  if (fresh) report.changes.push_back("created and pinned the maps under " + root);
  if (auto s = pin_programs(*capture, root, &report); !s) return s.error();

  // The bypass is an acceleration: when the kernel refuses any part of it, capture still works
  // and app <-> proxy bytes take the TCP/IP stack. Say so, and leave none of it half attached.
  if (auto s = install_bypass(options, root, cgroup, &report); !s) {
    // A conflict with what is installed is the operator's to resolve, not a kernel refusal.
    if (s.error().code == EEXIST) return s.error();
    report.bypass_unavailable = s.error().message;
    report.changes.push_back("sockmap bypass unavailable (" + s.error().message +
                             "): app <-> proxy traffic takes the TCP/IP stack");
    remove_bypass(root);
  }

  for (const auto& c : report.changes) {
    if (!report.bypass_unavailable.empty() && c.rfind("sockmap bypass unavailable", 0) == 0) {
      SM_WARN("loader") << "install: " << c;
    } else {
      SM_INFO("loader") << "install: " << c;
    }
  }
  return report;
}

Status uninstall(const std::string& pin_root, bool force) {
  if (auto s = require_capabilities({Capability::kBpf, Capability::kNetAdmin}, "uninstall"); !s) {
    return s;
  }
  if (!pin_exists(pin_root)) return {};
  if (auto workloads = maps::WorkloadMapReader::open(pin_root)) {
    auto listed = workloads->list();
    if (listed && !listed->empty() && !force) {
      return Error{EBUSY, std::to_string(listed->size()) +
                              " workload IPs are still enrolled under " + pin_root +
                              ": unenroll them first (or uninstall --force)"};
    }
  }

  std::string link_path = link_pin(pin_root, kLinkSockops);
  if (pin_exists(link_path)) {
    if (UniqueFd link(bpf_obj_get(link_path.c_str())); link) {
      // Detach now, even if something else still holds the link open.
      if (bpf_link_detach(link.get()) != 0 && errno != EINVAL && errno != ENOLINK) {
        return Error::from_errno(errno, "detaching the sockops link");
      }
    }
  }
  {
    UniqueFd map(bpf_obj_get((pin_root + "/" + SM_MAP_BYPASS).c_str()));
    UniqueFd prog(bpf_obj_get(program_pin(pin_root, kProgSkMsg).c_str()));
    if (map && prog) bpf_prog_detach2(prog.get(), map.get(), BPF_SK_MSG_VERDICT);
  }

  auto remove = [](const std::string& path) -> Status {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Error::from_errno(errno, "removing " + path);
    }
    return {};
  };
  if (auto s = remove(link_path); !s) return s;
  // The pods' sk_lookup links (enroll pins one per pod netns); unpinned, each detaches.
  if (auto s = remove_pod_lookup_links(pin_root); !s) return s;
  for (const char* p : kProgramNames) {
    if (auto s = remove(program_pin(pin_root, p)); !s) return s;
    if (auto s = remove(program_pin(pin_root, p) + "_next"); !s) return s;
  }
  for (const char* m : kMapNames) {
    if (auto s = remove(pin_root + "/" + m); !s) return s;
    // An old map an interrupted install left aside (map_upgrade.h).
    if (auto s = remove(replaced_pin_path(pin_root + "/" + m)); !s) return s;
  }
  for (const char* sub : {SM_PIN_PROGS_DIR, SM_PIN_LINKS_DIR}) {
    std::string dir = pin_root + "/" + sub;
    if (rmdir(dir.c_str()) != 0 && errno != ENOENT) {
      return Error::from_errno(errno, "removing " + dir + " (unknown pins left in it?)");
    }
  }
  // A bpffs that install mounted at the pin root itself (outside /sys/fs/bpf) goes as well.
  std::string parent = pin_root.substr(0, pin_root.find_last_of('/'));
  if (is_on_bpffs(pin_root) && !is_on_bpffs(parent.empty() ? "/" : parent)) {
    if (umount2(pin_root.c_str(), MNT_DETACH) != 0) {
      return Error::from_errno(errno, "unmounting the bpffs at " + pin_root);
    }
  }
  if (rmdir(pin_root.c_str()) != 0 && errno != ENOENT) {
    return Error::from_errno(errno, "removing " + pin_root + " (unknown pins left in it?)");
  }
  SM_INFO("loader") << "uninstall: removed everything under " << pin_root;
  return {};
}

Result<NodeStatus> node_status(const std::string& pin_root) {
  NodeStatus out;
  for (const char* m : kMapNames) {
    if (pin_exists(pin_root + "/" + m)) out.map_names.emplace_back(m);
  }
  out.installed = !out.map_names.empty();
  for (const char* p : kProgramNames) {
    UniqueFd fd(bpf_obj_get(program_pin(pin_root, p).c_str()));
    if (!fd) continue;
    auto id = identity_of(fd.get());
    if (id) out.programs.push_back({p, id->id, id->tag});
  }
  if (UniqueFd link(bpf_obj_get(link_pin(pin_root, kLinkSockops).c_str())); link) {
    bpf_link_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(link.get(), &info, &len) == 0) {
      out.sockops_link_id = info.id;
      if (info.cgroup.cgroup_id != 0) out.sockops_cgroup_id = info.cgroup.cgroup_id;
    }
  }
  if (UniqueFd map(bpf_obj_get((pin_root + "/" + SM_MAP_BYPASS).c_str())); map) {
    auto id = attached_sk_msg(map.get());
    out.sk_msg_attached = id && *id != 0;
  }
  return out;
}

}  // namespace sockmesh::loader
