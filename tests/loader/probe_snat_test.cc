// The kubelet-probe SNAT rules (loader/attach/probe_snat.h) as text: what iptables-restore gets.
// tests/e2e/test_cluster_flows.py runs them in a node netns.
#include "loader/attach/probe_snat.h"

#include <gtest/gtest.h>

namespace sockmesh::loader {
namespace {

TEST(ProbeSnatRules, OneRulePerPodOfTheFamilyFromTheCgroupOnly) {
  std::set<IpAddress> pods = {*IpAddress::parse("10.244.1.11"), *IpAddress::parse("10.244.1.12"),
                              *IpAddress::parse("fd00::5")};
  std::string v4 = probe_snat_rules("system.slice/kubelet.service", pods, false, true);
  EXPECT_EQ(v4,
            "*nat\n"
            ":SOCKMESH-PROBES - [0:0]\n"
            "-F SOCKMESH-PROBES\n"
            "-A SOCKMESH-PROBES -d 10.244.1.11/32 -p tcp -m cgroup --path "
            "system.slice/kubelet.service -j SNAT --to-source 169.254.7.127\n"
            "-A SOCKMESH-PROBES -d 10.244.1.12/32 -p tcp -m cgroup --path "
            "system.slice/kubelet.service -j SNAT --to-source 169.254.7.127\n"
            "-I POSTROUTING 1 -j SOCKMESH-PROBES\n"
            "COMMIT\n");
  std::string v6 = probe_snat_rules("k", pods, true, false);
  EXPECT_NE(v6.find("-A SOCKMESH-PROBES -d fd00::5/128 -p tcp -m cgroup --path k -j SNAT "
                    "--to-source fd16:9254:7127:1337:ffff:ffff:ffff:ffff\n"),
            std::string::npos)
      << v6;
  EXPECT_EQ(v6.find("10.244"), std::string::npos) << v6;
  EXPECT_EQ(v6.find("POSTROUTING"), std::string::npos) << "the jump exists already: " << v6;
}

TEST(ProbeSnatRules, NoPodsLeavesTheChainEmpty) {
  std::string v4 = probe_snat_rules("k", {}, false, false);
  EXPECT_EQ(v4, "*nat\n:SOCKMESH-PROBES - [0:0]\n-F SOCKMESH-PROBES\nCOMMIT\n");
}

TEST(ProbeSnatRules, RefusesACgroupWithWhiteSpaceBeforeRunningAnything) {
  auto applied = apply_probe_snat("a b\n-A POSTROUTING -j ACCEPT", {});
  ASSERT_FALSE(applied);
  EXPECT_NE(applied.error().message.find("white space"), std::string::npos);
}

TEST(ProbeSnatCgroup, AMissingCgroupIsAnErrorNamingIt) {
  auto id = cgroup_id("sockmesh-no-such-cgroup-for-tests");
  ASSERT_FALSE(id);
  EXPECT_NE(id.error().message.find("sockmesh-no-such-cgroup-for-tests"), std::string::npos)
      << id.error().message;
}

}  // namespace
}  // namespace sockmesh::loader
