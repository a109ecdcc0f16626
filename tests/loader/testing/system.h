#pragma once
#include <gtest/gtest.h>
// Test scaffolding that touches the system: commands, network namespaces, veth pairs, cgroups
// and sockmesh installs made by the test under unique names and removed by destructors, so that
// a failing test (an ASSERT returning early) leaves nothing behind.
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "loader/attach/node.h"

namespace sockmesh::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs argv[0] (found on PATH) without a shell.
CommandResult run_command(const std::vector<std::string>& argv);
// Same, failing the current test when the exit code is not 0.
std::string must_run(const std::vector<std::string>& argv);

// "sm-<pid>-<n>": unique within this machine while the test runs; the pid lets a later run tell
// leftovers of a crashed run (sweep_leftovers()).
std::string unique_name(const std::string& prefix);

// Removes namespaces, cgroups and pin roots of test processes that no longer exist.
void sweep_leftovers();

// The global environment of a privileged test: root, or a loud skip (exit 77); leftovers of
// crashed runs swept; the project's logs at warn. Tests with more needs derive and add them.
class PrivilegedEnvironment : public ::testing::Environment {
 public:
  void SetUp() override;
};

class ScopedNetns {
 public:
  explicit ScopedNetns(std::string name);
  ~ScopedNetns();
  ScopedNetns(const ScopedNetns&) = delete;
  ScopedNetns& operator=(const ScopedNetns&) = delete;
  const std::string& name() const { return name_; }
  std::string path() const { return "/run/netns/" + name_; }
  // Runs `ip -n <name> <args...>`.
  std::string ip(const std::vector<std::string>& args) const;

 private:
  std::string name_;
};

// A pod and a peer namespace joined by a veth pair named eth0 on both sides:
//   pod  eth0 10.200.0.2/24 fd00:200::2/64
//   peer eth0 10.200.0.1/24 fd00:200::1/64
class PodTopology {
 public:
  PodTopology();
  ScopedNetns pod;
  ScopedNetns peer;
  IpAddress pod_v4 = *IpAddress::parse("10.200.0.2");
  IpAddress peer_v4 = *IpAddress::parse("10.200.0.1");
  IpAddress pod_v6 = *IpAddress::parse("fd00:200::2");
  IpAddress peer_v6 = *IpAddress::parse("fd00:200::1");

  // What unenroll must restore: rules, routes, qdiscs, filters and accept_local of the pod
  // (link-local addresses left out: the kernel adds them on its own schedule).
  std::string pod_snapshot() const;
};

// A cgroup v2 directory of the test's own; enter() moves this process into it (sockets created
// afterwards belong to it), the destructor moves it back and removes the cgroup.
class TestCgroup {
 public:
  TestCgroup();
  ~TestCgroup();
  TestCgroup(const TestCgroup&) = delete;
  TestCgroup& operator=(const TestCgroup&) = delete;
  const std::string& path() const { return path_; }
  void enter();

 private:
  std::string path_;
  std::string original_;
  bool entered_ = false;
};

// sockmesh installed under a unique pin root on the given cgroup; uninstalled (forcibly, after
// unenrolling nothing: pods go with their namespaces) by the destructor.
class TestInstall {
 public:
  explicit TestInstall(const std::string& cgroup, bool bypass = true);
  ~TestInstall();
  TestInstall(const TestInstall&) = delete;
  TestInstall& operator=(const TestInstall&) = delete;
  const std::string& root() const { return options_.pin_root; }
  const loader::InstallOptions& options() const { return options_; }
  const loader::InstallReport& first_report() const { return report_; }

 private:
  loader::InstallOptions options_;
  loader::InstallReport report_;
};

// The summed value of one kernel counter of the datapath installed at pin_root; 0 (with a test
// failure recorded) when it cannot be read.
uint64_t datapath_counter(const std::string& pin_root, uint32_t counter);

}  // namespace sockmesh::testing
