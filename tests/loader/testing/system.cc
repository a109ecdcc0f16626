#include "testing/system.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

#include "base/log.h"
#include "loader/attach/bpffs.h"
#include "loader/maps/counters.h"
#include "testing/privileged.h"

namespace sockmesh::testing {
namespace {

constexpr char kNetnsPrefix[] = "sm-t";
constexpr char kCgroupPrefix[] = "sockmesh-test";
constexpr char kPinPrefix[] = "sockmesh-test";

// The pid in "<prefix>-<pid>-..." (the first all-digit component), or 0.
pid_t pid_in(const std::string& name) {
  std::stringstream parts(name);
  std::string part;
  while (std::getline(parts, part, '-')) {
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string::npos) {
      return static_cast<pid_t>(std::stol(part));
    }
  }
  return 0;
}

bool process_gone(pid_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

std::vector<std::string> entries(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  closedir(d);
  return out;
}

}  // namespace

CommandResult run_command(const std::vector<std::string>& argv) {
  CommandResult result;
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return result;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) result.output.append(buf, n);
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string must_run(const std::vector<std::string>& argv) {
  CommandResult r = run_command(argv);
  std::string line;
  for (const auto& a : argv) line += a + " ";
  EXPECT_EQ(r.exit_code, 0) << line << "\n" << r.output;
  return r.output;
}

std::string unique_name(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return prefix + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

void sweep_leftovers() {
  for (const auto& name : entries("/run/netns", kNetnsPrefix)) {
    if (process_gone(pid_in(name))) run_command({"ip", "netns", "del", name});
  }
  if (auto cg = loader::find_cgroup2_mount()) {
    for (const auto& name : entries(*cg, kCgroupPrefix)) {
      if (process_gone(pid_in(name))) rmdir((*cg + "/" + name).c_str());
    }
  }
  for (const auto& name : entries("/sys/fs/bpf", kPinPrefix)) {
    if (process_gone(pid_in(name))) (void)loader::uninstall("/sys/fs/bpf/" + name, true);
  }
}

ScopedNetns::ScopedNetns(std::string name) : name_(std::move(name)) {
  must_run({"ip", "netns", "add", name_});
  must_run({"ip", "-n", name_, "link", "set", "lo", "up"});
}

ScopedNetns::~ScopedNetns() { run_command({"ip", "netns", "del", name_}); }

std::string ScopedNetns::ip(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"ip", "-n", name_};
  argv.insert(argv.end(), args.begin(), args.end());
  return must_run(argv);
}

PodTopology::PodTopology()
    : pod(unique_name(std::string(kNetnsPrefix)) + "-pod"),
      peer(unique_name(std::string(kNetnsPrefix)) + "-peer") {
  must_run({"ip", "link", "add", "eth0", "netns", pod.name(), "type", "veth", "peer", "name",
            "eth0", "netns", peer.name()});
  for (auto [ns, v4, v6] : {std::tuple{&pod, "10.200.0.2/24", "fd00:200::2/64"},
                            std::tuple{&peer, "10.200.0.1/24", "fd00:200::1/64"}}) {
    ns->ip({"addr", "add", v4, "dev", "eth0"});
    ns->ip({"addr", "add", v6, "dev", "eth0", "nodad"});
    ns->ip({"link", "set", "eth0", "up"});
  }
}

std::string PodTopology::pod_snapshot() const {
  std::string out;
  out += pod.ip({"rule", "show"});
  out += pod.ip({"-6", "rule", "show"});
  out += pod.ip({"-4", "route", "show", "table", "all"});
  out += pod.ip({"-6", "route", "show", "table", "all"});
  out += must_run({"tc", "-n", pod.name(), "qdisc", "show", "dev", "eth0"});
  out += must_run({"tc", "-n", pod.name(), "filter", "show", "dev", "eth0", "ingress"});
  out += must_run({"tc", "-n", pod.name(), "filter", "show", "dev", "eth0", "egress"});
  out += "accept_local=" + must_run({"ip", "netns", "exec", pod.name(), "cat",
                                     "/proc/sys/net/ipv4/conf/eth0/accept_local"});
  // The kernel adds the link-local address (and its route) whenever its DAD ends: not ours.
  std::stringstream lines(out);
  std::string line, kept;
  while (std::getline(lines, line)) {
    if (line.find("fe80::") == std::string::npos) kept += line + "\n";
  }
  return kept;
}

TestCgroup::TestCgroup() {
  auto mount = loader::find_cgroup2_mount();
  EXPECT_TRUE(mount) << mount.error().message;
  if (!mount) return;
  path_ = *mount + "/" + unique_name(kCgroupPrefix);
  EXPECT_EQ(mkdir(path_.c_str(), 0755), 0) << path_ << ": " << strerror(errno);
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  while (std::getline(self, line)) {
    if (line.rfind("0::", 0) == 0) original_ = *mount + line.substr(3);
  }
  EXPECT_FALSE(original_.empty()) << "no cgroup v2 line in /proc/self/cgroup";
}

void TestCgroup::enter() {
  std::ofstream procs(path_ + "/cgroup.procs");
  procs << "0\n";
  procs.flush();
  EXPECT_TRUE(procs.good()) << "moving the test into " << path_;
  entered_ = procs.good();
}

TestCgroup::~TestCgroup() {
  if (entered_) {
    std::ofstream procs(original_ + "/cgroup.procs");
    procs << "0\n";
  }
  if (!path_.empty()) rmdir(path_.c_str());
}

TestInstall::TestInstall(const std::string& cgroup, bool bypass) {
  options_.pin_root = "/sys/fs/bpf/" + unique_name(kPinPrefix);
  options_.cgroup = cgroup;
  options_.bypass = bypass;
  auto report = loader::install(options_);
  EXPECT_TRUE(report) << report.error().message;
  if (report) report_ = *report;
}

TestInstall::~TestInstall() {
  auto s = loader::uninstall(options_.pin_root, /*force=*/true);
  EXPECT_TRUE(s) << s.error().message;
}

void PrivilegedEnvironment::SetUp() {
  require_root();
  sweep_leftovers();
  log::set_level(log::Level::kWarn);
}

uint64_t datapath_counter(const std::string& pin_root, uint32_t counter) {
  auto reader = maps::CounterReader::open(pin_root);
  EXPECT_TRUE(reader) << (reader ? "" : reader.error().message);
  if (!reader) return 0;
  auto values = reader->read();
  EXPECT_TRUE(values) << (values ? "" : values.error().message);
  return values ? (*values)[counter] : 0;
}

}  // namespace sockmesh::testing
