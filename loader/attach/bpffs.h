#pragma once
// bpffs and cgroup v2 discovery: where pins live and where sockops attaches.
#include <string>
#include <vector>

#include "loader/maps/result.h"

namespace sockmesh::loader {

using maps::Error;
using maps::Result;
using maps::Status;

// Whether something (a pin, a directory) is at `path`; a symbolic link is not followed.
bool pin_exists(const std::string& path);

// Whether `path` lies on a bpffs instance.
bool is_on_bpffs(const std::string& path);

// Makes `dir` (and its parents) exist on a bpffs. If no ancestor is a bpffs, mounts one: at
// /sys/fs/bpf when `dir` is below it (the conventional place), else at `dir` itself.
Status ensure_bpffs_dir(const std::string& dir);

struct MountEntry {
  std::string source;
  std::string mount_point;
  std::string fs_type;
};

// Parses /proc/mounts-style text (octal escapes such as \040 undone).
std::vector<MountEntry> parse_mounts(const std::string& text);

// The mount point of the cgroup v2 hierarchy, from /proc/mounts: /sys/fs/cgroup on a unified
// system, /sys/fs/cgroup/unified on a hybrid one.
Result<std::string> find_cgroup2_mount(const std::string& proc_mounts = "/proc/mounts");

// mkdir -p; fine if it exists.
Status make_dirs(const std::string& dir, unsigned mode = 0755);

}  // namespace sockmesh::loader
