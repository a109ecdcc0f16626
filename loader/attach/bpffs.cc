#include "loader/attach/bpffs.h"

#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#include <cerrno>
#include <fstream>
#include <sstream>

namespace sockmesh::loader {
namespace {

constexpr long kBpfFsMagic = 0xcafe4a11;  // BPF_FS_MAGIC
constexpr char kDefaultBpffs[] = "/sys/fs/bpf";

std::string parent_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos || slash == 0) return "/";
  return path.substr(0, slash);
}

bool is_below(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

std::string unescape_mount_field(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const char* d = field.c_str() + i + 1;
      if (d[0] >= '0' && d[0] <= '7' && d[1] >= '0' && d[1] <= '7' && d[2] >= '0' && d[2] <= '7') {
        out.push_back(static_cast<char>((d[0] - '0') * 64 + (d[1] - '0') * 8 + (d[2] - '0')));
        i += 3;
        continue;
      }
    }
    out.push_back(field[i]);
  }
  return out;
}

}  // namespace

bool pin_exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

bool is_on_bpffs(const std::string& path) {
  struct statfs st {};
  return statfs(path.c_str(), &st) == 0 && st.f_type == kBpfFsMagic;
}

Status make_dirs(const std::string& dir, unsigned mode) {
  if (dir.empty()) return {};
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return {};
    return Error{ENOTDIR, dir + " exists and is not a directory"};
  }
  if (auto s = make_dirs(parent_of(dir), mode); !s) return s;
  if (mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
    return Error::from_errno(errno, "creating directory " + dir);
  }
  return {};
}

Status ensure_bpffs_dir(const std::string& dir) {
  if (dir.empty() || dir[0] != '/') return Error{EINVAL, "pin root must be absolute: " + dir};
  // The closest existing ancestor tells whether we are on a bpffs already.
  std::string existing = dir;
  struct stat st {};
  while (stat(existing.c_str(), &st) != 0) existing = parent_of(existing);
  if (!is_on_bpffs(existing)) {
    std::string mount_at =
        (dir == kDefaultBpffs || is_below(dir, kDefaultBpffs)) ? kDefaultBpffs : dir;
    if (auto s = make_dirs(mount_at, 0700); !s) return s;
    if (!is_on_bpffs(mount_at) && mount("bpf", mount_at.c_str(), "bpf", 0, "mode=0700") != 0) {
      int err = errno;
      if (err == EPERM) {
        return Error{err, "mounting bpffs at " + mount_at +
                              ": permission denied (needs "
                              "CAP_SYS_ADMIN in the initial mount namespace)"};
      }
      return Error::from_errno(err, "mounting bpffs at " + mount_at);
    }
  }
  if (auto s = make_dirs(dir, 0700); !s) return s;
  if (!is_on_bpffs(dir)) return Error{EINVAL, dir + " is not on a bpffs"};
  return {};
}

std::vector<MountEntry> parse_mounts(const std::string& text) {
  std::vector<MountEntry> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    MountEntry e;
    if (fields >> e.source >> e.mount_point >> e.fs_type) {
      e.source = unescape_mount_field(e.source);
      e.mount_point = unescape_mount_field(e.mount_point);
      out.push_back(std::move(e));
    }
  }
  return out;
}

Result<std::string> find_cgroup2_mount(const std::string& proc_mounts) {
  std::ifstream in(proc_mounts);
  if (!in) return Error::from_errno(errno, "reading " + proc_mounts);
  std::stringstream text;
  text << in.rdbuf();
  std::string found;
  for (const auto& e : parse_mounts(text.str())) {
    if (e.fs_type != "cgroup2") continue;
    if (e.mount_point == "/sys/fs/cgroup") return e.mount_point;  // unified layout
    if (found.empty()) found = e.mount_point;                     // hybrid: .../unified
  }
  if (found.empty()) {
    return Error{ENOENT,
                 "no cgroup2 mount in " + proc_mounts +
                     ": sockops needs cgroup v2 (mount -t cgroup2 none /sys/fs/cgroup/unified)"};
  }
  return found;
}

}  // namespace sockmesh::loader
