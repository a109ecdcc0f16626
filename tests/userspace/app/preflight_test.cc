// The proxy's start-up capability checks: the pure decision for each configuration, and the real
// binary refusing in-pod mode without CAP_SYS_ADMIN (when this test runs as root, setpriv drops
// it; otherwise that case says why it did not run).
#include "app/preflight.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace sockmesh::app {
namespace {

constexpr uint64_t bit(int cap) { return uint64_t{1} << cap; }
constexpr uint64_t kAll = ~uint64_t{0};

proxy::ProxyConfig in_pod() {
  proxy::ProxyConfig c;
  c.zds_socket = "/run/sockmesh/zds.sock";
  c.bpf_pin_root = "off";
  return c;
}

TEST(Preflight, EverythingPresentFindsNothing) {
  EXPECT_TRUE(check_capabilities(in_pod(), kAll).empty());
}

TEST(Preflight, InPodModeWithoutSysAdminIsFatalAndNamesIt) {
  auto f = check_capabilities(in_pod(), kAll & ~bit(CAP_SYS_ADMIN));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_TRUE(f[0].fatal);
  EXPECT_NE(f[0].message.find("CAP_SYS_ADMIN"), std::string::npos) << f[0].message;
  EXPECT_EQ(f[0].message.find("CAP_NET_ADMIN"), std::string::npos) << f[0].message;
}

TEST(Preflight, InPodModeWithoutEitherNamesBoth) {
  auto f = check_capabilities(in_pod(), 0);
  ASSERT_FALSE(f.empty());
  EXPECT_TRUE(f[0].fatal);
  EXPECT_NE(f[0].message.find("CAP_SYS_ADMIN"), std::string::npos);
  EXPECT_NE(f[0].message.find("CAP_NET_ADMIN"), std::string::npos);
}

TEST(Preflight, TransparentListenersNeedNetAdmin) {
  proxy::ProxyConfig c;
  c.bpf_pin_root = "off";
  c.outbound = Endpoint{*IpAddress::parse("0.0.0.0"), 15001};
  auto f = check_capabilities(c, kAll & ~bit(CAP_NET_ADMIN));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_TRUE(f[0].fatal);
  EXPECT_NE(f[0].message.find("IP_TRANSPARENT"), std::string::npos);
}

TEST(Preflight, SourceIpPreservationWithoutNetAdminOnlyWarns) {
  proxy::ProxyConfig c;  // no transparent listener, no in-pod mode
  c.bpf_pin_root = "off";
  auto f = check_capabilities(c, 0);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0].fatal);
  EXPECT_NE(f[0].message.find("source IP"), std::string::npos);
  c.preserve_source_ip = false;
  EXPECT_TRUE(check_capabilities(c, 0).empty());
}

TEST(Preflight, AnUnreadablePinnedMapOnlyWarns) {
  proxy::ProxyConfig c;
  c.preserve_source_ip = false;
  c.bpf_pin_root = "/";  // exists
  auto f = check_capabilities(c, 0);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0].fatal);
  EXPECT_NE(f[0].message.find("CAP_BPF"), std::string::npos);
  EXPECT_TRUE(check_capabilities(c, bit(39)).empty()) << "CAP_BPF is enough";
  c.bpf_pin_root = "/nonexistent-pin-root";
  EXPECT_TRUE(check_capabilities(c, 0).empty()) << "no map, nothing to read";
}

TEST(Preflight, TheRealProxyRefusesInPodModeWithoutSysAdmin) {
  if (geteuid() != 0 || (effective_capabilities() & bit(CAP_SYS_ADMIN)) == 0) {
    GTEST_SKIP() << "needs root with CAP_SYS_ADMIN to drop it (the pure checks above still ran)";
  }
  const char* build = std::getenv("SOCKMESH_BUILD_DIR");
  ASSERT_NE(build, nullptr);
  std::string cmd = std::string("setpriv --inh-caps=-sys_admin --bounding-set=-sys_admin ") +
                    build +
                    "/userspace/sockmesh-proxy --zds-socket /tmp/sm-preflight-never.sock "
                    "--admin off --metrics 127.0.0.1:0 --readiness 127.0.0.1:0 "
                    "--state-dir /tmp/sm-preflight-state 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  ASSERT_TRUE(p);
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p.get()) != nullptr) out += buf.data();
  int status = pclose(p.release());
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_NE(out.find("cannot start: in-pod mode (--zds-socket) needs CAP_SYS_ADMIN"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace sockmesh::app
