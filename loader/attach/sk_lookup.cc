#include "loader/attach/sk_lookup.h"

#include <bpf/bpf.h>
#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "loader/attach/node.h"
#include "loader/attach/program_identity.h"
#include "loader/attach/skeleton.h"
#include "loader/maps/unique_fd.h"
#include "lookup.skel.h"

namespace sockmesh::loader {
namespace {

using maps::UniqueFd;

constexpr char kPrefix[] = "sk_lookup_";

std::string link_path(const std::string& pin_root, uint64_t cookie) {
  char name[64];
  snprintf(name, sizeof name, "%s%" PRIu64, kPrefix, cookie);
  return link_pin(pin_root, name);
}

}  // namespace

Result<bool> attach_pod_lookup(const std::string& pin_root, int netns_fd, uint64_t cookie) {
  auto skel = BpfSkeleton<lookup_bpf>::open("lookup", pin_root);
  if (!skel) return skel.error();
  skel.value()->rodata->cfg_netns_cookie = cookie;
  // A pinned map another build made is install's to replace, not enroll's.
  if (auto s = skel->load(); !s) return s.error();
  int prog = bpf_program__fd(skel.value()->progs.sm_sk_lookup);
  std::string path = link_path(pin_root, cookie);
  if (UniqueFd link(bpf_obj_get(path.c_str())); link) {
    bpf_link_info info{};
    uint32_t len = sizeof info;
    if (bpf_obj_get_info_by_fd(link.get(), &info, &len) != 0) {
      return Error::from_errno(errno, "reading " + path);
    }
    if (info.netns.netns_ino != 0) {
      // The same instructions, knob and maps (an install may have replaced a map): keep it.
      UniqueFd current(bpf_prog_get_fd_by_id(info.prog_id));
      auto fresh = identity_of(prog);
      if (!fresh) return fresh.error();
      if (current) {
        auto now = identity_of(current.get());
        if (now && *now == *fresh) return false;
      }
      if (bpf_link_update(link.get(), prog, nullptr) != 0) {
        return Error::from_errno(errno, "moving " + path + " to the new sk_lookup program");
      }
      return true;
    }
    unlink(path.c_str());  // its netns is gone; a new one happens to have the same cookie
  }
  UniqueFd link(bpf_link_create(prog, netns_fd, BPF_SK_LOOKUP, nullptr));
  if (!link) return Error::from_errno(errno, "attaching sk_lookup to the pod's netns");
  if (bpf_obj_pin(link.get(), path.c_str()) != 0)
    return Error::from_errno(errno, "pinning " + path);
  return true;
}

Result<bool> detach_pod_lookup(const std::string& pin_root, uint64_t cookie) {
  std::string path = link_path(pin_root, cookie);
  if (unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  return Error::from_errno(errno, "removing " + path);
}

Status remove_pod_lookup_links(const std::string& pin_root) {
  std::string dir = pin_root + "/" SM_PIN_LINKS_DIR;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return {};
    return Error::from_errno(errno, "listing " + dir);
  }
  Status result{};
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, kPrefix, sizeof kPrefix - 1) != 0) continue;
    std::string path = dir + "/" + e->d_name;
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      result = Error::from_errno(errno, "removing " + path);
    }
  }
  closedir(d);
  return result;
}

}  // namespace sockmesh::loader
