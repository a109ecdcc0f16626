// The loader's node and pod operations on the real kernel: install is idempotent and instances
// with other pin roots and cgroups stay apart, uninstall leaves nothing, enroll/unenroll errors
// name what is missing, the pinned maps dump with field names, and the CLI drives it all.
#include <bpf/bpf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>

#include "base/log.h"
#include "loader/attach/node.h"
#include "loader/attach/pod.h"
#include "loader/maps/listener_map.h"
#include "loader/maps/workload_map.h"
#include "testing/privileged.h"
#include "testing/system.h"

namespace sockmesh {
namespace {

using testing::must_run;
using testing::run_command;

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new testing::PrivilegedEnvironment);

bool exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

loader::PodSpec pod_spec(const testing::PodTopology& topo) {
  loader::PodSpec pod;
  pod.netns_path = topo.pod.path();
  pod.ips = {topo.pod_v4, topo.pod_v6};
  pod.identity.uid = "0b8f0f6e-pod-a";
  pod.identity.namespace_name = "shop";
  pod.identity.service_account = "checkout";
  pod.identity.trust_domain = "example.org";
  return pod;
}

std::string loader_binary() {
  const char* dir = std::getenv("SOCKMESH_BUILD_DIR");
  return std::string(dir ? dir : ".") + "/loader/sockmesh-loader";
}

TEST(Install, TwiceChangesNothingTheSecondTime) {
  testing::TestCgroup cgroup;
  testing::TestInstall first(cgroup.path());
  EXPECT_FALSE(first.first_report().changes.empty());
  auto status_before = loader::node_status(first.root());
  ASSERT_TRUE(status_before);

  auto again = loader::install(first.options());
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_TRUE(again->changes.empty()) << again->changes.front();

  auto status_after = loader::node_status(first.root());
  ASSERT_TRUE(status_after);
  ASSERT_EQ(status_before->programs.size(), 4u);
  for (size_t i = 0; i < status_before->programs.size(); ++i) {
    EXPECT_EQ(status_after->programs[i].id, status_before->programs[i].id)
        << status_before->programs[i].name << " must stay the pinned instance";
  }
  EXPECT_EQ(status_after->sockops_link_id, status_before->sockops_link_id);
  EXPECT_EQ(status_after->sockops_cgroup_id, loader::cgroup_id_of(cgroup.path()).value());
  EXPECT_TRUE(status_after->sk_msg_attached);
}

TEST(Install, ChangedKnobReplacesTheProgramInPlace) {
  testing::TestCgroup cgroup;
  testing::TestInstall first(cgroup.path());
  auto before = loader::node_status(first.root());
  ASSERT_TRUE(before);

  loader::InstallOptions other = first.options();
  other.bypass = false;
  auto report = loader::install(other);
  ASSERT_TRUE(report) << report.error().message;
  auto after = loader::node_status(first.root());
  ASSERT_TRUE(after);
  for (size_t i = 0; i < after->programs.size(); ++i) {
    bool bypass_program = after->programs[i].name == loader::kProgSockops ||
                          after->programs[i].name == loader::kProgSkMsg;
    EXPECT_EQ(after->programs[i].id != before->programs[i].id, bypass_program)
        << after->programs[i].name;
  }
  EXPECT_EQ(after->sockops_link_id, before->sockops_link_id) << "the link is updated, not re-made";
}

TEST(Install, SecondInstanceWithAnotherRootAndCgroupLeavesTheFirstAlone) {
  testing::TestCgroup cgroup_a;
  testing::TestCgroup cgroup_b;
  testing::TestInstall a(cgroup_a.path());
  auto before = loader::node_status(a.root());
  ASSERT_TRUE(before);
  {
    testing::TestInstall b(cgroup_b.path());
    auto status_b = loader::node_status(b.root());
    ASSERT_TRUE(status_b);
    EXPECT_NE(status_b->programs[0].id, before->programs[0].id);
    EXPECT_EQ(status_b->sockops_cgroup_id, loader::cgroup_id_of(cgroup_b.path()).value());
  }  // b uninstalled here
  auto after = loader::node_status(a.root());
  ASSERT_TRUE(after);
  EXPECT_EQ(after->programs.size(), 4u);
  EXPECT_EQ(after->sockops_link_id, before->sockops_link_id);
  EXPECT_EQ(after->sockops_cgroup_id, before->sockops_cgroup_id);
  EXPECT_TRUE(after->sk_msg_attached);
}

TEST(Install, SameRootOnAnotherCgroupIsRefused) {
  testing::TestCgroup cgroup_a;
  testing::TestCgroup cgroup_b;
  testing::TestInstall a(cgroup_a.path());
  loader::InstallOptions other = a.options();
  other.cgroup = cgroup_b.path();
  auto report = loader::install(other);
  ASSERT_FALSE(report);
  EXPECT_NE(report.error().message.find("uninstall first"), std::string::npos)
      << report.error().message;
}

TEST(Install, ACgroupThatIsNotCgroupV2IsRefusedBeforeAnythingIsPinned) {
  loader::InstallOptions options;
  options.pin_root = "/sys/fs/bpf/" + testing::unique_name("sockmesh-test");
  options.cgroup = "/tmp";  // a directory, but not of a cgroup v2 hierarchy
  auto report = loader::install(options);
  ASSERT_FALSE(report);
  EXPECT_NE(report.error().message.find("is not on cgroup v2"), std::string::npos)
      << report.error().message;
  struct stat st {};
  EXPECT_NE(stat(options.pin_root.c_str(), &st), 0) << "nothing may be pinned";
}

TEST(Install, ABypassTheKernelRefusesLeavesCaptureInstalledAndSaysSo) {
  testing::TestCgroup cgroup;
  loader::InstallOptions options;
  options.pin_root = "/sys/fs/bpf/" + testing::unique_name("sockmesh-test");
  options.cgroup = cgroup.path();
  options.refuse_bypass_for_test = true;
  auto report = loader::install(options);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_NE(report->bypass_unavailable.find("refused"), std::string::npos);
  bool said = false;
  for (const auto& c : report->changes) {
    said = said || c.find("bypass unavailable") != std::string::npos;
  }
  EXPECT_TRUE(said) << "the report must say the bypass is off";
  auto status = loader::node_status(options.pin_root);
  ASSERT_TRUE(status) << status.error().message;
  EXPECT_FALSE(status->sockops_cgroup_id) << "no sockops link may be left attached";
  EXPECT_FALSE(status->sk_msg_attached);
  bool tc_pinned = false;
  for (const auto& p : status->programs) {
    tc_pinned = tc_pinned || p.name == loader::kProgTcIngress;
    EXPECT_NE(p.name, loader::kProgSockops) << "no bypass program may stay pinned";
  }
  EXPECT_TRUE(tc_pinned) << "capture is installed";
  struct stat st {};
  EXPECT_NE(stat((options.pin_root + "/" SM_PIN_LINKS_DIR "/" SM_PIN_LINK_SOCKOPS).c_str(), &st),
            0);
  // A later install on a kernel that allows it adds the bypass.
  options.refuse_bypass_for_test = false;
  auto again = loader::install(options);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_TRUE(again->bypass_unavailable.empty());
  status = loader::node_status(options.pin_root);
  ASSERT_TRUE(status);
  EXPECT_TRUE(status->sockops_cgroup_id);
  EXPECT_TRUE(loader::uninstall(options.pin_root, true));
}

TEST(Uninstall, RemovesEveryPinAndDetaches) {
  testing::TestCgroup cgroup;
  loader::InstallOptions options;
  options.pin_root = "/sys/fs/bpf/" + testing::unique_name("sockmesh-test");
  options.cgroup = cgroup.path();
  ASSERT_TRUE(loader::install(options));
  auto status = loader::node_status(options.pin_root);
  ASSERT_TRUE(status);
  uint32_t sockops_prog = 0;
  for (const auto& p : status->programs) {
    if (p.name == loader::kProgSockops) sockops_prog = p.id;
  }
  ASSERT_NE(sockops_prog, 0u);

  ASSERT_TRUE(loader::uninstall(options.pin_root, false));
  EXPECT_FALSE(exists(options.pin_root));
  // Nothing holds the programs any more: the kernel frees them.
  int fd = -1;
  for (int i = 0; i < 50 && (fd = bpf_prog_get_fd_by_id(sockops_prog)) >= 0; ++i) {
    close(fd);
    usleep(20000);
  }
  EXPECT_LT(fd, 0) << "the sockops program is still loaded";
  EXPECT_TRUE(loader::uninstall(options.pin_root, false)) << "uninstall twice is fine";
}

TEST(Uninstall, RefusesWhileWorkloadsAreEnrolled) {
  testing::TestCgroup cgroup;
  testing::TestInstall install(cgroup.path());
  testing::PodTopology topo;
  ASSERT_TRUE(loader::enroll(install.root(), pod_spec(topo)));
  auto refused = loader::uninstall(install.root(), false);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("unenroll them first"), std::string::npos);
  ASSERT_TRUE(loader::unenroll(install.root(), topo.pod.path(), "eth0", {}));
}

TEST(Enroll, TwiceChangesNothingAndRecordsTheIdentity) {
  testing::TestCgroup cgroup;
  testing::TestInstall install(cgroup.path());
  testing::PodTopology topo;
  auto first = loader::enroll(install.root(), pod_spec(topo));
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_FALSE(first->changes.empty());
  std::string enrolled = topo.pod_snapshot();
  auto second = loader::enroll(install.root(), pod_spec(topo));
  ASSERT_TRUE(second) << second.error().message;
  EXPECT_TRUE(second->changes.empty()) << second->changes.front();
  EXPECT_EQ(topo.pod_snapshot(), enrolled);

  auto reader = maps::WorkloadMapReader::open(install.root());
  ASSERT_TRUE(reader) << reader.error().message;
  for (const auto& ip : {topo.pod_v4, topo.pod_v6}) {
    auto record = reader->lookup(ip);
    ASSERT_TRUE(record) << ip.to_string();
    EXPECT_EQ(record->spiffe_id(), "spiffe://example.org/ns/shop/sa/checkout");
    EXPECT_EQ(record->uid, "0b8f0f6e-pod-a");
    EXPECT_TRUE(record->enrolled);
    EXPECT_TRUE(record->capture_inbound);
    EXPECT_EQ(record->ifindex, static_cast<uint32_t>(first->ifindex));
    EXPECT_EQ(record->netns_cookie, first->netns_cookie);
    EXPECT_NE(record->loader_flags & SM_WL_MADE_CLSACT, 0u) << "the second enroll keeps the note";
  }
  EXPECT_FALSE(reader->lookup(topo.peer_v4));

  auto report = loader::unenroll(install.root(), topo.pod.path(), "eth0", {});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->removed_ips.size(), 2u);
}

TEST(Enroll, ExistingClsactAndAcceptLocalAreLeftAsFound) {
  testing::TestCgroup cgroup;
  testing::TestInstall install(cgroup.path());
  testing::PodTopology topo;
  must_run({"tc", "-n", topo.pod.name(), "qdisc", "add", "dev", "eth0", "clsact"});
  must_run({"ip", "netns", "exec", topo.pod.name(), "sysctl", "-qw",
            "net.ipv4.conf.eth0.accept_local=1"});
  std::string before = topo.pod_snapshot();
  ASSERT_TRUE(loader::enroll(install.root(), pod_spec(topo)));
  ASSERT_TRUE(loader::unenroll(install.root(), topo.pod.path(), "eth0", {}));
  EXPECT_EQ(topo.pod_snapshot(), before);
}

TEST(Enroll, ErrorsNameWhatIsMissing) {
  testing::TestCgroup cgroup;
  testing::TestInstall install(cgroup.path());
  testing::PodTopology topo;

  auto spec = pod_spec(topo);
  spec.netns_path = "/run/netns/sm-t-does-not-exist";
  auto no_netns = loader::enroll(install.root(), spec);
  ASSERT_FALSE(no_netns);
  EXPECT_NE(no_netns.error().message.find("does not exist"), std::string::npos)
      << no_netns.error().message;

  spec = pod_spec(topo);
  spec.ifname = "eth9";
  auto no_if = loader::enroll(install.root(), spec);
  ASSERT_FALSE(no_if);
  EXPECT_NE(no_if.error().message.find("no interface eth9"), std::string::npos)
      << no_if.error().message;

  auto not_installed = loader::enroll("/sys/fs/bpf/sockmesh-test-nowhere", pod_spec(topo));
  ASSERT_FALSE(not_installed);
  EXPECT_NE(not_installed.error().message.find("not pinned"), std::string::npos)
      << not_installed.error().message;

  spec = pod_spec(topo);
  spec.identity.namespace_name = std::string(100, 'x');
  auto too_long = loader::enroll(install.root(), spec);
  ASSERT_FALSE(too_long);
  EXPECT_NE(too_long.error().message.find("namespace"), std::string::npos);
  // A failed enroll after routing was set must not have switched capture on.
  auto reader = maps::WorkloadMapReader::open(install.root());
  ASSERT_TRUE(reader);
  EXPECT_FALSE(reader->lookup(topo.pod_v4));
  ASSERT_TRUE(loader::unenroll(install.root(), topo.pod.path(), "eth0", {}));
}

TEST(Unenroll, OfAVanishedNetnsRemovesTheRecords) {
  testing::TestCgroup cgroup;
  testing::TestInstall install(cgroup.path());
  std::vector<IpAddress> ips;
  {
    testing::PodTopology topo;
    ips = {topo.pod_v4, topo.pod_v6};
    ASSERT_TRUE(loader::enroll(install.root(), pod_spec(topo)));
  }  // the pod is gone
  auto report = loader::unenroll(install.root(), "/run/netns/sm-t-gone", "eth0", ips);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->netns_gone);
  EXPECT_EQ(report->removed_ips.size(), 2u);
}

TEST(Maps, BpftoolDumpShowsTheWorkloadFieldsByName) {
  testing::TestCgroup cgroup;
  testing::TestInstall install(cgroup.path());
  testing::PodTopology topo;
  ASSERT_TRUE(loader::enroll(install.root(), pod_spec(topo)));
  std::string dump =
      must_run({"bpftool", "map", "dump", "pinned", install.root() + "/" + SM_MAP_WORKLOADS});
  for (const char* field :
       {"\"uid\": \"0b8f0f6e-pod-a\"", "\"namespace_name\": \"shop\"",
        "\"service_account\": \"checkout\"", "\"trust_domain\": \"example.org\"",
        "\"flags\":", "\"ifindex\":", "\"netns_cookie\":", "\"addr\":"}) {
    EXPECT_NE(dump.find(field), std::string::npos) << field << " in\n" << dump;
  }
  std::string counters =
      must_run({"bpftool", "map", "dump", "pinned", install.root() + "/" + SM_MAP_COUNTERS});
  EXPECT_NE(counters.find("\"values\""), std::string::npos) << counters;
  ASSERT_TRUE(loader::unenroll(install.root(), topo.pod.path(), "eth0", {}));
}

TEST(Cli, InstallEnrollStatusUnenrollUninstall) {
  testing::TestCgroup cgroup;
  testing::PodTopology topo;
  std::string root = "/sys/fs/bpf/" + testing::unique_name("sockmesh-test");
  std::string bin = loader_binary();
  auto loader = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {bin, "--pin-root", root});
    return run_command(args);
  };

  auto install = loader({"install", "--cgroup", cgroup.path()});
  ASSERT_EQ(install.exit_code, 0) << install.output;
  auto again = loader({"install", "--cgroup", cgroup.path()});
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_NE(again.output.find("nothing changed"), std::string::npos) << again.output;

  auto enroll = loader({"enroll", "--netns", topo.pod.path(), "--ifname", "eth0", "--ip",
                        topo.pod_v4.to_string(), "--ip", topo.pod_v6.to_string(), "--uid", "u1",
                        "--namespace", "shop", "--service-account", "checkout"});
  EXPECT_EQ(enroll.exit_code, 0) << enroll.output;
  auto status = loader({"status"});
  EXPECT_EQ(status.exit_code, 0);
  for (const char* expect :
       {"installed", "sockops: attached to cgroup id", "sk_msg: attached", "workloads (2)",
        "spiffe://cluster.local/ns/shop/sa/checkout", "captured_outbound", "bypass_misses",
        "enrolled,capture-inbound,capture-dns", "captured_dns"}) {
    EXPECT_NE(status.output.find(expect), std::string::npos) << expect << " in\n" << status.output;
  }
  // enroll --no-capture-dns: the flag is off in the record (status shows no capture-dns).
  auto no_dns =
      loader({"enroll", "--netns", topo.pod.path(), "--ifname", "eth0", "--ip",
              topo.pod_v4.to_string(), "--ip", topo.pod_v6.to_string(), "--uid", "u1",
              "--namespace", "shop", "--service-account", "checkout", "--no-capture-dns"});
  EXPECT_EQ(no_dns.exit_code, 0) << no_dns.output;
  status = loader({"status"});
  EXPECT_EQ(status.output.find(",capture-dns"), std::string::npos) << status.output;
  EXPECT_NE(status.output.find("enrolled,capture-inbound,"), std::string::npos) << status.output;
  auto refused = loader({"uninstall"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.output.find("still enrolled"), std::string::npos) << refused.output;

  auto unenroll = loader({"unenroll", "--netns", topo.pod.path(), "--ifname", "eth0"});
  EXPECT_EQ(unenroll.exit_code, 0) << unenroll.output;
  auto bad = loader({"enroll", "--netns", topo.pod.path()});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  auto uninstall = loader({"uninstall"});
  EXPECT_EQ(uninstall.exit_code, 0) << uninstall.output;
  EXPECT_FALSE(exists(root));
  if (exists(root)) (void)loader::uninstall(root, true);
}

}  // namespace
}  // namespace sockmesh
