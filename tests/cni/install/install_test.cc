// sockmesh-install-cni against network configs as Debian's docs, containerd, podman, flannel,
// calico, kind and cilium write them (testdata/<case>/before), compared byte for byte with the
// expected result (testdata/<case>/after). SOCKMESH_UPDATE_GOLDEN=1 rewrites the after/ files
// from what the installer does; review the diff before committing it.
#include "cni/install/installer.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "cni/install/files.h"
#include "common/fifo.h"
#include "loader/agent/kube/cluster_access.h"

namespace sockmesh::cni::install {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using Files = std::map<std::string, std::string>;  // name -> content

fs::path testdata() {
  const char* src = std::getenv("SOCKMESH_SOURCE_DIR");
  return fs::path(src ? src : ".") / "tests/cni/install/testdata";
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The visible files of a directory (libcni's view; our hidden state file is left out).
Files files_of(const fs::path& dir) {
  Files out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name[0] == '.') continue;
    out[name] = slurp(e.path());
  }
  return out;
}

void put_files(const fs::path& dir, const Files& files) {
  fs::create_directories(dir);
  for (const auto& [name, content] : files) std::ofstream(dir / name, std::ios::binary) << content;
}

class InstallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : test) c = c == '/' ? '_' : c;  // parameterized names have a '/'
    root_ =
        fs::temp_directory_path() / ("sockmesh-install-" + std::to_string(getpid()) + "-" + test);
    fs::remove_all(root_);
    fs::create_directories(conf_dir());
    fs::create_directories(bin_dir());
    std::ofstream(root_ / "sockmesh-cni") << "#!fake plugin binary\n";
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path conf_dir() const { return root_ / "net.d"; }
  fs::path bin_dir() const { return root_ / "bin"; }
  fs::path sa_dir() const { return root_ / "serviceaccount"; }

  InstallerOptions options() const {
    InstallerOptions o;
    o.cni_bin_dir = bin_dir().string();
    o.cni_conf_dir = conf_dir().string();
    o.plugin_binary = (root_ / "sockmesh-cni").string();
    o.service_account_dir = sa_dir().string();
    return o;
  }

  fs::path root_;
};

class GoldenTest : public InstallTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(GoldenTest, InsertsOnceRepairsAndUninstallRestoresTheOriginal) {
  const fs::path dir = testdata() / GetParam();
  const Files before = files_of(dir / "before");
  ASSERT_FALSE(before.empty()) << "no testdata in " << dir;
  put_files(conf_dir(), before);
  Installer installer(options());

  // 1. Insertion (or conversion).
  Report first = installer.sync();
  EXPECT_TRUE(first.problems.empty()) << first.problems.front();
  EXPECT_FALSE(first.changes.empty());
  Files after = files_of(conf_dir());
  if (std::getenv("SOCKMESH_UPDATE_GOLDEN") != nullptr) {
    fs::remove_all(dir / "after");
    put_files(dir / "after", after);
  }
  EXPECT_EQ(after, files_of(dir / "after")) << "differs from the golden files in " << dir;
  EXPECT_TRUE(fs::exists(bin_dir() / "sockmesh-cni"));
  EXPECT_TRUE(fs::exists(conf_dir() / kStateFileName));

  // 2. A second run changes nothing.
  std::string state = slurp(conf_dir() / kStateFileName);
  Report second = installer.sync();
  EXPECT_TRUE(second.changes.empty()) << second.changes.front();
  EXPECT_EQ(files_of(conf_dir()), after);
  EXPECT_EQ(slurp(conf_dir() / kStateFileName), state);

  // 3. The network plugin rewrites its config (as it does when its pod restarts): repaired.
  for (const auto& [name, content] : before) {
    std::string error;
    ASSERT_TRUE(write_file_atomic((conf_dir() / name).string(), content, 0644, &error)) << error;
  }
  Report repair = installer.sync();
  EXPECT_FALSE(repair.changes.empty());
  EXPECT_EQ(files_of(conf_dir()), after) << "the repair gives the same result as the install";

  // 4. Uninstall gives back the original bytes and takes everything of ours away.
  Report removed = installer.uninstall();
  EXPECT_TRUE(removed.problems.empty()) << removed.problems.front();
  EXPECT_EQ(files_of(conf_dir()), before);
  EXPECT_FALSE(fs::exists(conf_dir() / kStateFileName));
  EXPECT_TRUE(fs::is_empty(bin_dir()));
  // Nothing left behind by the atomic writes either.
  for (const auto& e : fs::directory_iterator(conf_dir())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
}

INSTANTIATE_TEST_SUITE_P(RealConfigs, GoldenTest,
                         ::testing::Values("debian-bridge-conf", "containerd", "podman", "flannel",
                                           "calico", "kindnet", "cilium-first"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = std::isalnum(c) ? c : '_';
                           return name;
                         });

TEST_F(InstallTest, WaitsForTheNetworkPluginsConfig) {
  Installer installer(options());
  Report empty = installer.sync();
  EXPECT_TRUE(empty.waiting_for_config);
  put_files(conf_dir(), files_of(testdata() / "flannel/before"));
  Report now = installer.sync();
  EXPECT_FALSE(now.waiting_for_config);
  EXPECT_TRUE(has_plugin(slurp(conf_dir() / "10-flannel.conflist")));
}

TEST_F(InstallTest, FollowsTheConfigThatSortsFirstAndLeavesTheOldOneAsItWas) {
  Files flannel = files_of(testdata() / "flannel/before");
  put_files(conf_dir(), flannel);
  Installer installer(options());
  installer.sync();
  ASSERT_TRUE(has_plugin(slurp(conf_dir() / "10-flannel.conflist")));
  // Cilium is installed next and writes 05-cilium.conflist: that is the runtime's config now.
  Files cilium = files_of(testdata() / "cilium-first/before");
  put_files(conf_dir(), {{"05-cilium.conflist", cilium.at("05-cilium.conflist")}});
  Report moved = installer.sync();
  EXPECT_EQ(slurp(conf_dir() / "10-flannel.conflist"), flannel.at("10-flannel.conflist"))
      << "the config no longer used gets its original bytes back";
  EXPECT_TRUE(has_plugin(slurp(conf_dir() / "05-cilium.conflist")));
  installer.uninstall();
  EXPECT_EQ(files_of(conf_dir()),
            (Files{{"05-cilium.conflist", cilium.at("05-cilium.conflist")},
                   {"10-flannel.conflist", flannel.at("10-flannel.conflist")}}));
}

TEST_F(InstallTest, ChangedSettingsUpdateTheEntryInPlaceAndEditsByOthersAreKept) {
  Files containerd = files_of(testdata() / "containerd/before");
  put_files(conf_dir(), containerd);
  Installer(options()).sync();
  InstallerOptions changed = options();
  changed.exclude_namespaces = {"kube-system", "monitoring"};
  changed.agent_timeout_ms = 20000;
  Installer installer(changed);
  Report update = installer.sync();
  ASSERT_EQ(update.changes.size(), 1u);
  EXPECT_NE(update.changes[0].find("updated"), std::string::npos) << update.changes[0];
  std::string text = slurp(conf_dir() / "10-containerd-net.conflist");
  EXPECT_NE(text.find("monitoring"), std::string::npos);
  EXPECT_EQ(text.find("sockmesh-cni"), text.rfind("sockmesh-cni")) << "one entry, not two";

  // Someone edits the file after us (adds a plugin): uninstall takes out our entry only.
  std::string edited = text;
  edited.replace(edited.find("\"plugins\": ["), 12,
                 "\"plugins\": [\n    {\"type\": \"tuning\", \"sysctl\": {}},");
  std::string error;
  ASSERT_TRUE(write_file_atomic((conf_dir() / "10-containerd-net.conflist").string(), edited, 0644,
                                &error));
  installer.uninstall();
  std::string left = slurp(conf_dir() / "10-containerd-net.conflist");
  EXPECT_EQ(left.find("sockmesh-cni"), std::string::npos);
  EXPECT_NE(left.find("tuning"), std::string::npos);
}

TEST_F(InstallTest, RefusesAConfigVersionThePluginDoesNotSpeak) {
  std::string v110 = R"({"cniVersion": "1.1.0", "name": "net", "plugins": [{"type": "ptp"}]})";
  put_files(conf_dir(), {{"10-net.conflist", v110}});
  Report r = Installer(options()).sync();
  ASSERT_FALSE(r.problems.empty());
  EXPECT_NE(r.problems[0].find("1.1.0"), std::string::npos) << r.problems[0];
  EXPECT_EQ(slurp(conf_dir() / "10-net.conflist"), v110) << "left alone";
}

TEST_F(InstallTest, LeavesABrokenConfigAloneAndRetries) {
  put_files(conf_dir(), {{"10-net.conflist", "{\"plugins\": ["}});
  Installer installer(options());
  Report r = installer.sync();
  ASSERT_FALSE(r.problems.empty());
  EXPECT_EQ(slurp(conf_dir() / "10-net.conflist"), "{\"plugins\": [");
  put_files(conf_dir(), files_of(testdata() / "flannel/before"));
  fs::remove(conf_dir() / "10-net.conflist");
  EXPECT_TRUE(installer.sync().problems.empty());
}

TEST_F(InstallTest, WritesAKubeconfigFromTheServiceAccountAndFollowsTokenRotation) {
  fs::create_directories(sa_dir());
  std::ofstream(sa_dir() / "token") << "token-one\n";
  std::ofstream(sa_dir() / "ca.crt")
      << "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  put_files(conf_dir(), files_of(testdata() / "flannel/before"));
  InstallerOptions o = options();
  o.kubernetes_host = "10.96.0.1";
  o.kubernetes_port = "443";
  Installer installer(o);
  installer.sync();
  fs::path kubeconfig = conf_dir() / "ZZZ-sockmesh-cni-kubeconfig";
  ASSERT_TRUE(fs::exists(kubeconfig));
  EXPECT_EQ(fs::status(kubeconfig).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  // The Kubernetes client reads it back.
  auto access = agent::kube::load_kubeconfig(kubeconfig.string());
  ASSERT_TRUE(access) << access.error().message;
  EXPECT_EQ(access->server, "https://10.96.0.1:443");
  EXPECT_EQ(access->bearer_token(), "token-one");
  EXPECT_EQ(access->ca_data, slurp(sa_dir() / "ca.crt"));
  EXPECT_NE(slurp(conf_dir() / "10-flannel.conflist").find(kubeconfig.string()), std::string::npos)
      << "the plugin's entry names it";

  std::ofstream(sa_dir() / "token") << "token-two\n";
  Report rotated = installer.sync();
  ASSERT_EQ(rotated.changes.size(), 1u);
  EXPECT_EQ(agent::kube::load_kubeconfig(kubeconfig.string())->bearer_token(), "token-two");

  installer.uninstall();
  EXPECT_FALSE(fs::exists(kubeconfig));
  EXPECT_EQ(files_of(conf_dir()), files_of(testdata() / "flannel/before"));
}

TEST_F(InstallTest, UninstallWithoutNotesRemovesOnlyOurEntry) {
  put_files(conf_dir(), files_of(testdata() / "flannel/before"));
  Installer installer(options());
  installer.sync();
  fs::remove(conf_dir() / kStateFileName);  // notes lost
  installer.uninstall();
  std::string left = slurp(conf_dir() / "10-flannel.conflist");
  EXPECT_FALSE(has_plugin(left));
  EXPECT_NE(left.find("flannel"), std::string::npos);
}

// The binary in its daemon mode: inotify sees another CNI's rewrite and puts the plugin back.
TEST_F(InstallTest, TheDaemonRepairsARewriteAndStaysInstalledOnSigterm) {
  const char* build = std::getenv("SOCKMESH_BUILD_DIR");
  std::string program = std::string(build ? build : ".") + "/cni/sockmesh-install-cni";
  Files calico = files_of(testdata() / "calico/before");
  put_files(conf_dir(), calico);
  fs::path conflist = conf_dir() / "10-calico.conflist";
  auto args = std::vector<std::string>{program,
                                       "--cni-bin-dir=" + bin_dir().string(),
                                       "--cni-conf-dir=" + conf_dir().string(),
                                       "--plugin=" + (root_ / "sockmesh-cni").string(),
                                       "--service-account-dir=" + sa_dir().string(),
                                       "--poll-interval-ms=60000"};
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  auto eventually = [](auto condition) {
    for (int i = 0; i < 300 && !condition(); ++i) std::this_thread::sleep_for(10ms);
    return condition();
  };
  ASSERT_TRUE(eventually([&] { return has_plugin(slurp(conflist)); }));
  auto start = std::chrono::steady_clock::now();
  std::string error;
  ASSERT_TRUE(write_file_atomic(conflist.string(), calico.at("10-calico.conflist"), 0644, &error));
  EXPECT_TRUE(eventually([&] { return has_plugin(slurp(conflist)); })) << "not repaired within 3 s";
  std::cout << "repaired after "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - start)
                   .count()
            << " ms\n";
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(has_plugin(slurp(conflist))) << "still installed after SIGTERM";

  pid = fork();
  if (pid == 0) {
    execl(program.c_str(), program.c_str(), ("--cni-bin-dir=" + bin_dir().string()).c_str(),
          ("--cni-conf-dir=" + conf_dir().string()).c_str(), "--uninstall", nullptr);
    _exit(127);
  }
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(files_of(conf_dir()), calico) << "uninstall gives back calico's file";
}

// A name planted where the installer writes its temporary file (here a link to a file it must
// not touch) neither redirects the write nor stops it.
TEST(InstallFiles, WriteFileAtomicNeverFollowsAPlantedTemporaryName) {
  fs::path dir = fs::temp_directory_path() / ("sockmesh-install-tmp-" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::path victim = dir / "victim";
  std::ofstream(victim) << "keep me";
  // The name the installer used to pick: dir/.<base>.<pid>.tmp
  fs::create_symlink(victim, dir / (".conf." + std::to_string(getpid()) + ".tmp"));
  std::string error;
  EXPECT_TRUE(write_file_atomic((dir / "conf").string(), "new", 0600, &error)) << error;
  std::stringstream kept;
  kept << std::ifstream(victim).rdbuf();
  EXPECT_EQ(kept.str(), "keep me");
  std::stringstream written;
  written << std::ifstream(dir / "conf").rdbuf();
  EXPECT_EQ(written.str(), "new");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir / "conf")));
  fs::remove_all(dir);
}

// A FIFO where the installer reads a CNI config must not hang it.
TEST(InstallFiles, ReadFileRefusesAFifoAtOnce) {
  fs::path dir = fs::temp_directory_path() / ("sockmesh-install-fifo-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string fifo = (dir / "10-bridge.conflist").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  int err = 0;
  auto r = ::sockmesh::testing::read_of_fifo(fifo, [&] { return read_file(fifo, &err); });
  fs::remove_all(dir);
  ASSERT_TRUE(r.has_value()) << "reading a FIFO as a CNI config blocked for 3 s";
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ(err, EINVAL);
}

}  // namespace
}  // namespace sockmesh::cni::install
