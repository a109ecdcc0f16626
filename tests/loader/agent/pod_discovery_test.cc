// Finding a running pod's netns from the pod UID in its processes' cgroup paths.
#include "loader/agent/pod_discovery.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace sockmesh::agent {
namespace {

constexpr char kUid[] = "4a1b2c3d-0000-4e5f-8a9b-0123456789ab";

TEST(CgroupNamesPod, BothCgroupDriversAndNothingElse) {
  // cgroupfs driver (cgroup v2 and v1 lines).
  EXPECT_TRUE(cgroup_names_pod(
      "0::/kubepods/besteffort/pod4a1b2c3d-0000-4e5f-8a9b-0123456789ab/0123abcd\n", kUid));
  EXPECT_TRUE(cgroup_names_pod(
      "12:memory:/kubepods/burstable/pod4a1b2c3d-0000-4e5f-8a9b-0123456789ab/abc\n", kUid));
  // systemd driver: dashes become underscores.
  EXPECT_TRUE(
      cgroup_names_pod("0::/kubepods.slice/kubepods-besteffort.slice/"
                       "kubepods-besteffort-pod4a1b2c3d_0000_4e5f_8a9b_0123456789ab.slice/"
                       "cri-containerd-0123.scope\n",
                       kUid));
  // Guaranteed pods sit right under kubepods.
  EXPECT_TRUE(cgroup_names_pod(
      "0::/kubepods.slice/kubepods-pod4a1b2c3d_0000_4e5f_8a9b_0123456789ab.slice/x.scope\n", kUid));
  EXPECT_FALSE(cgroup_names_pod("0::/user.slice/user-0.slice/session-1.scope\n", kUid));
  // Another pod whose UID starts the same.
  EXPECT_FALSE(cgroup_names_pod(
      "0::/kubepods/besteffort/pod4a1b2c3d-0000-4e5f-8a9b-0123456789abff/x\n", kUid));
  EXPECT_FALSE(cgroup_names_pod("0::/kubepods/besteffort/pod/x\n", ""));
}

// "pod<uid>" elsewhere than the pod's place in the kubepods layout is anyone's to make (a
// delegated user cgroup, a container runtime's own slice): it must not pass for the pod.
TEST(CgroupNamesPod, OnlyAtThePodsPlaceInTheKubepodsLayout) {
  const std::string dashed = "pod4a1b2c3d-0000-4e5f-8a9b-0123456789ab";
  const std::string under = "pod4a1b2c3d_0000_4e5f_8a9b_0123456789ab";
  EXPECT_FALSE(cgroup_names_pod("0::/user.slice/user-1000.slice/" + dashed + "/x\n", kUid));
  EXPECT_FALSE(cgroup_names_pod("0::/system.slice/" + dashed + ".service\n", kUid));
  EXPECT_FALSE(cgroup_names_pod("0::/evil/kubepods/x/" + dashed + "/c\n", kUid));
  EXPECT_FALSE(cgroup_names_pod("0::/kubepods/besteffort/pod123/" + dashed + "/c\n", kUid));
  EXPECT_FALSE(cgroup_names_pod("0::/user.slice/kubepods-besteffort-" + under + ".slice/x\n", kUid));
  EXPECT_FALSE(cgroup_names_pod("0::/kubepods.slice/kubepods-besteffort.slice/evil-" + under +
                                    ".slice/x\n",
                                kUid));
  EXPECT_FALSE(cgroup_names_pod("0::/kubepods.slice/kubepods-burstable.slice/"
                                "kubepods-besteffort-" + under + ".slice/x\n",
                                kUid));
  // A controller list that spells the UID is not the path.
  EXPECT_FALSE(cgroup_names_pod("1:name=kubepods/" + dashed + ":/\n", kUid));
  // Still found: guaranteed pods under cgroupfs, and a kubelet cgroup root (kind's
  // /kubelet.slice/kubelet-kubepods.slice/...), and a nested cgroupfs root.
  EXPECT_TRUE(cgroup_names_pod("0::/kubepods/" + dashed + "/c\n", kUid));
  EXPECT_TRUE(cgroup_names_pod("0::/kubelet/kubepods/burstable/" + dashed + "/c\n", kUid));
  EXPECT_TRUE(cgroup_names_pod("0::/kubelet.slice/kubelet-kubepods.slice/"
                               "kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-" +
                                   under + ".slice/cri-containerd-1.scope\n",
                               kUid));
  EXPECT_TRUE(cgroup_names_pod("0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-" +
                                   under + ".slice/x.scope\n",
                               kUid));
}

TEST(ProcPodNetnsFinder, FindsAProcessOfThePodOutsideTheHostNetns) {
  namespace fs = std::filesystem;
  fs::path root = fs::temp_directory_path() / ("sockmesh-proc-" + std::to_string(getpid()));
  auto process = [&](const std::string& pid, const std::string& cgroup, const std::string& netns) {
    fs::create_directories(root / pid / "ns");
    std::ofstream(root / pid / "cgroup") << cgroup;
    std::ofstream(root / pid / "ns" / "net") << netns;  // a stand-in file: only its identity counts
  };
  process("1", "0::/init.scope\n", "host");
  process("200", "0::/kubepods/besteffort/pod" + std::string(kUid) + "/c1\n", "pod");
  process("300", "0::/system.slice/containerd.service\n", "host2");
  // A process that made itself a cgroup named like the pod, outside kubepods: never the pod.
  process("150", "0::/user.slice/pod" + std::string(kUid) + "/x\n", "impostor");
  ProcPodNetnsFinder finder(root.string(), (root / "1" / "ns" / "net").string());
  EXPECT_EQ(finder.find(kUid), (root / "200" / "ns" / "net").string());
  EXPECT_EQ(finder.find("00000000-0000-0000-0000-000000000000"), "");

  // A host-network pod's processes are in the host's netns: not a pod netns to enroll.
  ProcPodNetnsFinder host_pod(root.string(), (root / "200" / "ns" / "net").string());
  EXPECT_EQ(host_pod.find(kUid), "");
  fs::remove_all(root);
}

}  // namespace
}  // namespace sockmesh::agent
