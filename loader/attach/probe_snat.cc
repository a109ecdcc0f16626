#include "loader/attach/probe_snat.h"

#include <fcntl.h>
#include <mntent.h>
#include <sched.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "loader/maps/unique_fd.h"

extern char** environ;

namespace sockmesh::loader {
namespace {

using maps::Error;
using maps::UniqueFd;

struct Outcome {
  int status = -1;     // the exit status, -1: did not run
  std::string output;  // stdout and stderr
};

// Runs argv (PATH searched) with `input` on its stdin; waits for it.
maps::Result<Outcome> run_tool(const std::vector<std::string>& argv, const std::string& input) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return Error::from_errno(errno, "pipe");
  UniqueFd in_r(in[0]), in_w(in[1]);
  if (pipe2(out, O_CLOEXEC) != 0) return Error::from_errno(errno, "pipe");
  UniqueFd out_r(out[0]), out_w(out[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_r.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, out_w.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, out_w.get(), 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int err = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return Error::from_errno(err, "running " + argv[0]);
  in_r.reset();
  out_w.reset();
  // The inputs are a few KiB at most, below a pipe's buffer: write all, then read to the end.
  size_t done = 0;
  while (done < input.size()) {
    ssize_t n = write(in_w.get(), input.data() + done, input.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  in_w.reset();
  Outcome outcome;
  char buf[4096];
  for (;;) {
    ssize_t n = read(out_r.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (outcome.output.size() < 64 * 1024) outcome.output.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Error::from_errno(errno, "waiting for " + argv[0]);
  }
  outcome.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  while (!outcome.output.empty() && outcome.output.back() == '\n') outcome.output.pop_back();
  return outcome;
}

maps::Status apply_family(const std::string& cgroup, const std::set<IpAddress>& pods, bool v6) {
  const std::string tables = v6 ? "ip6tables" : "iptables";
  // Whether POSTROUTING already jumps to the chain (-C fails when it, or the chain, is missing).
  auto check =
      run_tool({tables, "-w", "-t", "nat", "-C", "POSTROUTING", "-j", kProbeChain}, std::string());
  if (!check) return check.error();
  if (check->status == 127 || check->status == 126) {
    return Error{ENOENT, tables + " cannot run: " + check->output};
  }
  auto restore = run_tool({tables + "-restore", "-w", "--noflush"},
                          probe_snat_rules(cgroup, pods, v6, check->status != 0));
  if (!restore) return restore.error();
  if (restore->status != 0) {
    return Error{0, tables + "-restore failed (exit " + std::to_string(restore->status) +
                        "): " + restore->output};
  }
  return {};
}

}  // namespace

IpAddress probe_snat_v4() { return *IpAddress::parse("169.254.7.127"); }
IpAddress probe_snat_v6() { return *IpAddress::parse("fd16:9254:7127:1337:ffff:ffff:ffff:ffff"); }

std::string probe_snat_rules(const std::string& cgroup, const std::set<IpAddress>& pods, bool v6,
                             bool add_jump) {
  const std::string to = (v6 ? probe_snat_v6() : probe_snat_v4()).to_string();
  const std::string host = v6 ? "/128" : "/32";
  std::string out = "*nat\n";
  out += ":" + std::string(kProbeChain) + " - [0:0]\n";
  out += "-F " + std::string(kProbeChain) + "\n";
  for (const auto& ip : pods) {
    if (ip.is_v4() == v6) continue;
    out += "-A " + std::string(kProbeChain) + " -d " + ip.to_string() + host +
           " -p tcp -m cgroup --path " + cgroup + " -j SNAT --to-source " + to + "\n";
  }
  if (add_jump) out += "-I POSTROUTING 1 -j " + std::string(kProbeChain) + "\n";
  out += "COMMIT\n";
  return out;
}

maps::Result<bool> join_host_cgroup_namespace(const std::string& init_ns) {
  struct stat host {}, self {};
  if (stat(init_ns.c_str(), &host) != 0) return false;  // no host /proc/1 to join
  if (stat("/proc/self/ns/cgroup", &self) != 0) {
    return Error::from_errno(errno, "reading /proc/self/ns/cgroup");
  }
  if (host.st_ino == self.st_ino && host.st_dev == self.st_dev) return false;
  UniqueFd fd(open(init_ns.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::from_errno(errno, "opening " + init_ns);
  if (setns(fd.get(), CLONE_NEWCGROUP) != 0) {
    return Error::from_errno(errno, "entering the host's cgroup namespace (" + init_ns + ")");
  }
  return true;
}

maps::Result<uint64_t> cgroup_id(const std::string& cgroup, const std::string& inside) {
  // The cgroup2 mount that holds `inside` (the longest mount point that is a prefix of it), or
  // the first one: a container may have its own at /sys/fs/cgroup and the host's elsewhere.
  FILE* mounts = setmntent("/proc/self/mounts", "re");
  if (mounts == nullptr) return Error::from_errno(errno, "reading /proc/self/mounts");
  std::string first, holding;
  while (mntent* m = getmntent(mounts)) {
    if (std::string(m->mnt_type) != "cgroup2") continue;
    const std::string dir = m->mnt_dir;
    if (first.empty()) first = dir;
    bool holds = !inside.empty() && (inside == dir || inside.rfind(dir + "/", 0) == 0);
    if (holds && dir.size() > holding.size()) holding = dir;
  }
  const std::string root = holding.empty() ? first : holding;
  endmntent(mounts);
  if (root.empty()) return Error{ENOENT, "cgroup v2 is not mounted (no cgroup2 in /proc/mounts)"};
  const std::string path = root + "/" + cgroup;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Error::from_errno(errno, "the probe cgroup " + path);
  if (!S_ISDIR(st.st_mode)) return Error{ENOTDIR, "the probe cgroup " + path + " is no cgroup"};
  return static_cast<uint64_t>(st.st_ino);
}

maps::Status apply_probe_snat(const std::string& cgroup, const std::set<IpAddress>& pods) {
  if (cgroup.empty() || cgroup.find('\n') != std::string::npos ||
      cgroup.find(' ') != std::string::npos) {
    return Error{EINVAL, "the probe cgroup '" + cgroup + "' is empty or has white space"};
  }
  if (auto v4 = apply_family(cgroup, pods, false); !v4) return v4;
  bool any_v6 = false;
  for (const auto& ip : pods) any_v6 = any_v6 || !ip.is_v4();
  auto v6 = apply_family(cgroup, pods, true);
  // A node without IPv6 NAT is fine as long as no pod has an IPv6 address.
  if (!v6 && any_v6) return v6;
  return {};
}

}  // namespace sockmesh::loader
