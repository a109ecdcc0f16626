#include "identity/builtin_ca.h"

#include <gtest/gtest.h>
#include <openssl/ec.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <latch>
#include <set>
#include <thread>

#include "identity/verify.h"
#include "test_util.h"

namespace sockmesh::identity {
namespace {

using namespace std::chrono_literals;
using testing::FakeClock;
using testing::TempDir;

const SpiffeId kWeb = *SpiffeId::parse("spiffe://cluster.local/ns/default/sa/web");

mode_t mode_of(const std::filesystem::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

std::set<std::string> dir_listing(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.insert(e.path().filename().string());
  }
  return names;
}

std::shared_ptr<BuiltinCa> must_load(const std::filesystem::path& dir,
                                     BuiltinCaOptions options = {}) {
  auto ca = BuiltinCa::load_or_create(dir, "cluster.local", std::move(options));
  EXPECT_TRUE(ca.ok()) << ca.error().message;
  return ca.ok() ? *ca : nullptr;
}

TEST(BuiltinCaTest, CreatesRootWithRestrictedFiles) {
  TempDir tmp;
  auto dir = tmp.path() / "state" / "ca";  // parents do not exist yet
  auto ca = must_load(dir);
  ASSERT_TRUE(ca);
  EXPECT_TRUE(ca->created_root());
  EXPECT_EQ(mode_of(dir), 0700u);
  EXPECT_EQ(mode_of(dir / "ca-key.pem"), 0600u);
  EXPECT_EQ(dir_listing(dir), (std::set<std::string>{"ca-key.pem", "ca-cert.pem"}));

  X509* root = ca->root();
  EXPECT_EQ(X509_check_ca(root), 1);
  EXPECT_EQ(subject_string(root), "O=sockmesh");
  EXPECT_EQ(X509_get_key_usage(root) & (KU_KEY_CERT_SIGN), KU_KEY_CERT_SIGN);
  EVP_PKEY* pub = X509_get0_pubkey(root);
  EXPECT_EQ(EVP_PKEY_get_id(pub), EVP_PKEY_EC);
  char group[64] = {};
  size_t len = 0;
  ASSERT_EQ(EVP_PKEY_get_group_name(pub, group, sizeof(group), &len), 1);
  EXPECT_STREQ(group, "prime256v1");
  auto nb = *to_time_point(X509_get0_notBefore(root));
  auto na = *to_time_point(X509_get0_notAfter(root));
  EXPECT_GT(na - nb, 24h * 3650);
  EXPECT_LT(na - nb, 24h * 3660);

  auto roots = ca->trust_roots();
  ASSERT_EQ(roots->size(), 1u);
  EXPECT_EQ(roots->front().get(), root);
}

TEST(BuiltinCaTest, LoadsTheSameRootTwice) {
  TempDir tmp;
  auto first = must_load(tmp.path());
  ASSERT_TRUE(first);
  std::string key_before = testing::read_file(tmp.path() / "ca-key.pem");
  auto second = must_load(tmp.path());
  ASSERT_TRUE(second);
  EXPECT_TRUE(first->created_root());
  EXPECT_FALSE(second->created_root());
  EXPECT_EQ(fingerprint_sha256(first->root()), fingerprint_sha256(second->root()));
  EXPECT_EQ(testing::read_file(tmp.path() / "ca-key.pem"), key_before);

  // Certificates from one verify against the other's roots: that is how two proxies sharing a
  // state directory trust each other.
  auto cert = first->issue(kWeb);
  ASSERT_TRUE(cert.ok()) << cert.error().message;
  auto chain = to_stack((*cert)->chain());
  auto st = verify_chain((*cert)->leaf(), chain.get(), *second->trust_roots(),
                         std::chrono::system_clock::now());
  EXPECT_TRUE(st.ok()) << st.error().message;
}

TEST(BuiltinCaTest, IssuesWorkloadCertificate) {
  TempDir tmp;
  auto ca = must_load(tmp.path());
  ASSERT_TRUE(ca);
  const auto before = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
  auto issued = ca->issue(kWeb);
  const auto after = std::chrono::system_clock::now();
  ASSERT_TRUE(issued.ok()) << issued.error().message;
  const CertifiedKey& ck = **issued;

  EXPECT_EQ(ck.identity(), "spiffe://cluster.local/ns/default/sa/web");
  EXPECT_EQ(ck.spiffe_id(), kWeb);
  EXPECT_TRUE(ck.chain().empty()) << "root must not be sent as an intermediate";

  // Exactly one SAN entry, the URI, marked critical (the subject is empty).
  int crit = 0;
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(ck.leaf(), NID_subject_alt_name, &crit, nullptr));
  ASSERT_NE(names, nullptr);
  EXPECT_EQ(crit, 1);
  ASSERT_EQ(sk_GENERAL_NAME_num(names), 1);
  const GENERAL_NAME* gn = sk_GENERAL_NAME_value(names, 0);
  ASSERT_EQ(gn->type, GEN_URI);
  std::string uri(reinterpret_cast<const char*>(ASN1_STRING_get0_data(gn->d.ia5)),
                  ASN1_STRING_length(gn->d.ia5));
  EXPECT_EQ(uri, "spiffe://cluster.local/ns/default/sa/web");
  GENERAL_NAMES_free(names);
  EXPECT_EQ(X509_NAME_entry_count(X509_get_subject_name(ck.leaf())), 0);

  // 24 h of validity starting a few minutes in the past.
  EXPECT_EQ(ck.not_after() - ck.not_before(), 24h + 5min);
  EXPECT_GE(ck.not_before(), before - 5min);
  EXPECT_LE(ck.not_before(), after - 5min);
  EXPECT_GE(ck.not_after(), before + 24h);
  EXPECT_LE(ck.not_after(), after + 24h);

  // Key: ECDSA P-256, matching the certificate.
  EXPECT_EQ(EVP_PKEY_get_id(ck.private_key()), EVP_PKEY_EC);
  char group[64] = {};
  size_t len = 0;
  ASSERT_EQ(EVP_PKEY_get_group_name(ck.private_key(), group, sizeof(group), &len), 1);
  EXPECT_STREQ(group, "prime256v1");
  EXPECT_EQ(X509_check_private_key(ck.leaf(), ck.private_key()), 1);

  // Usages.
  EXPECT_EQ(X509_check_ca(ck.leaf()), 0);
  uint32_t ku = X509_get_key_usage(ck.leaf());
  EXPECT_EQ(ku, static_cast<uint32_t>(KU_DIGITAL_SIGNATURE | KU_KEY_ENCIPHERMENT));
  uint32_t eku = X509_get_extended_key_usage(ck.leaf());
  EXPECT_EQ(eku, static_cast<uint32_t>(XKU_SSL_SERVER | XKU_SSL_CLIENT));

  // Signed by the root; a 16-byte serial.
  EXPECT_EQ(X509_check_issued(ca->root(), ck.leaf()), X509_V_OK);
  EXPECT_EQ(ck.serial().size(), 32u);
  auto st = verify_chain(ck.leaf(), nullptr, *ca->trust_roots(), std::chrono::system_clock::now(),
                         PeerRole::kServer);
  EXPECT_TRUE(st.ok()) << st.error().message;
  st = verify_chain(ck.leaf(), nullptr, *ca->trust_roots(), std::chrono::system_clock::now(),
                    PeerRole::kClient);
  EXPECT_TRUE(st.ok()) << st.error().message;
}

TEST(BuiltinCaTest, SerialsAndKeysDifferPerIssuance) {
  TempDir tmp;
  auto ca = must_load(tmp.path());
  ASSERT_TRUE(ca);
  auto a = ca->issue(kWeb);
  auto b = ca->issue(kWeb);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->serial(), (*b)->serial());
  EXPECT_NE(EVP_PKEY_eq((*a)->private_key(), (*b)->private_key()), 1);
}

TEST(BuiltinCaTest, LifetimeAndSkewAreConfigurable) {
  TempDir tmp;
  FakeClock clock;
  BuiltinCaOptions options;
  options.workload_lifetime = 1h;
  options.clock_skew = 30s;
  options.clock = clock.fn();
  auto ca = must_load(tmp.path(), options);
  ASSERT_TRUE(ca);
  auto cert = ca->issue(kWeb);
  ASSERT_TRUE(cert.ok());
  EXPECT_EQ((*cert)->not_before(), clock.now() - 30s);
  EXPECT_EQ((*cert)->not_after(), clock.now() + 1h);
}

TEST(BuiltinCaTest, RefusesOtherTrustDomain) {
  TempDir tmp;
  auto ca = must_load(tmp.path());
  ASSERT_TRUE(ca);
  auto cert = ca->issue(*SpiffeId::parse("spiffe://evil.org/ns/default/sa/web"));
  ASSERT_FALSE(cert.ok());
  EXPECT_NE(cert.error().message.find("evil.org"), std::string::npos) << cert.error().message;
}

TEST(BuiltinCaTest, RejectsBadConfiguration) {
  TempDir tmp;
  auto bad_td = BuiltinCa::load_or_create(tmp.path(), "Cluster.Local");
  ASSERT_FALSE(bad_td.ok());
  EXPECT_NE(bad_td.error().message.find("trust domain"), std::string::npos);

  BuiltinCaOptions zero;
  zero.workload_lifetime = 0s;
  EXPECT_FALSE(BuiltinCa::load_or_create(tmp.path(), "td", zero).ok());

  auto not_dir = tmp.path() / "file";
  testing::write_file(not_dir, "x");
  auto r = BuiltinCa::load_or_create(not_dir, "td");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("not a directory"), std::string::npos) << r.error().message;
}

TEST(BuiltinCaTest, TightensOwnDirectoryMode) {
  TempDir tmp;
  auto dir = tmp.path() / "open";
  std::filesystem::create_directory(dir);
  ::chmod(dir.c_str(), 0777);
  ASSERT_TRUE(must_load(dir));
  EXPECT_EQ(mode_of(dir), 0700u);
}

// Whoever can write the state directory can put their own CA key there for us to load.
TEST(BuiltinCaTest, RefusesADirectoryOwnedBySomeoneElse) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the directory to another uid";
  TempDir tmp;
  auto dir = tmp.path() / "theirs";
  std::filesystem::create_directory(dir);
  ::chmod(dir.c_str(), 0700);
  ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
  auto r = BuiltinCa::load_or_create(dir, "cluster.local");
  ASSERT_FALSE(r.ok()) << "a CA was kept in a directory owned by uid 65534";
  EXPECT_NE(r.error().message.find("owned by uid 65534"), std::string::npos) << r.error().message;
  EXPECT_TRUE(dir_listing(dir).empty());
}

TEST(BuiltinCaTest, RefusesAWritableDirectoryThatAlreadyHoldsFiles) {
  TempDir tmp;
  auto dir = tmp.path() / "open";
  ASSERT_TRUE(must_load(dir));  // a real CA: the files are valid, only the mode is wrong
  ::chmod(dir.c_str(), 0777);   // ...and someone else could have replaced them meanwhile
  auto r = BuiltinCa::load_or_create(dir, "cluster.local");
  ASSERT_FALSE(r.ok()) << "loaded a CA key from a world-writable directory";
  EXPECT_NE(r.error().message.find("writable by group or others"), std::string::npos)
      << r.error().message;
  EXPECT_EQ(mode_of(dir), 0777u);  // left for the operator to check, not silently fixed
}

TEST(BuiltinCaTest, DamagedFilesAreErrorsNotOverwritten) {
  TempDir tmp;
  ASSERT_TRUE(must_load(tmp.path()));
  testing::write_file(tmp.path() / "ca-key.pem", "-----BEGIN PRIVATE KEY-----\ngarbage\n");
  auto r = BuiltinCa::load_or_create(tmp.path(), "cluster.local");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("ca-key.pem"), std::string::npos) << r.error().message;
  EXPECT_EQ(testing::read_file(tmp.path() / "ca-key.pem"),
            "-----BEGIN PRIVATE KEY-----\ngarbage\n");
}

TEST(BuiltinCaTest, KeyFromAnotherCaIsRejected) {
  TempDir a, b;
  ASSERT_TRUE(must_load(a.path()));
  ASSERT_TRUE(must_load(b.path()));
  testing::write_file(a.path() / "ca-key.pem", testing::read_file(b.path() / "ca-key.pem"));
  auto r = BuiltinCa::load_or_create(a.path(), "cluster.local");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("does not belong"), std::string::npos) << r.error().message;
}

TEST(BuiltinCaTest, LostKeyIsAnErrorAndNoNewKeyIsWritten) {
  TempDir tmp;
  ASSERT_TRUE(must_load(tmp.path()));
  std::string cert = testing::read_file(tmp.path() / "ca-cert.pem");
  std::filesystem::remove(tmp.path() / "ca-key.pem");
  auto r = BuiltinCa::load_or_create(tmp.path(), "cluster.local");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("ca-key.pem is missing"), std::string::npos)
      << r.error().message;
  EXPECT_EQ(dir_listing(tmp.path()), std::set<std::string>{"ca-cert.pem"});
  EXPECT_EQ(testing::read_file(tmp.path() / "ca-cert.pem"), cert);
}

TEST(BuiltinCaTest, RecoversFromKeyWithoutCertificate) {
  // A process that died between writing the key and the certificate leaves only the key.
  TempDir tmp;
  auto key = testing::make_p256_key();
  testing::write_file(tmp.path() / "ca-key.pem", private_key_to_pem(key.get()));
  ::chmod((tmp.path() / "ca-key.pem").c_str(), 0600);
  auto ca = must_load(tmp.path());
  ASSERT_TRUE(ca);
  EXPECT_EQ(EVP_PKEY_eq(X509_get0_pubkey(ca->root()), key.get()), 1);
}

TEST(BuiltinCaTest, RacingThreadsEndWithOneRoot) {
  constexpr int kThreads = 8;
  for (int round = 0; round < 10; ++round) {
    TempDir tmp;
    std::latch start(kThreads);
    std::vector<std::string> fingerprints(kThreads);
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    threads.reserve(kThreads);
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        start.arrive_and_wait();
        auto ca = BuiltinCa::load_or_create(tmp.path(), "cluster.local");
        if (ca.ok()) {
          fingerprints[i] = fingerprint_sha256((*ca)->root());
        } else {
          errors[i] = ca.error().message;
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < kThreads; ++i) ASSERT_EQ(errors[i], "") << "thread " << i;
    std::set<std::string> distinct(fingerprints.begin(), fingerprints.end());
    ASSERT_EQ(distinct.size(), 1u) << "round " << round;
    // The root on disk is the one everybody uses, and no temporary files are left behind.
    auto on_disk = certificates_from_pem(testing::read_file(tmp.path() / "ca-cert.pem"));
    ASSERT_TRUE(on_disk.ok());
    EXPECT_EQ(fingerprint_sha256(on_disk->front().get()), *distinct.begin());
    EXPECT_EQ(dir_listing(tmp.path()), (std::set<std::string>{"ca-key.pem", "ca-cert.pem"}));
  }
}

TEST(BuiltinCaTest, RacingProcessesEndWithOneRoot) {
  constexpr int kProcs = 4;
  for (int round = 0; round < 5; ++round) {
    TempDir tmp;
    int go[2];
    ASSERT_EQ(::pipe(go), 0);
    std::vector<pid_t> pids;
    std::vector<int> results;
    pids.reserve(kProcs);
    results.reserve(kProcs);
    for (int i = 0; i < kProcs; ++i) {
      int out[2];
      ASSERT_EQ(::pipe(out), 0);
      pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::close(go[1]);
        ::close(out[0]);
        char c;
        // Everyone blocks here until the parent closes the pipe, then all start together.
        while (::read(go[0], &c, 1) > 0) {
        }
        auto ca = BuiltinCa::load_or_create(tmp.path(), "cluster.local");
        std::string msg = ca.ok() ? fingerprint_sha256((*ca)->root()) : "ERR " + ca.error().message;
        ssize_t n = ::write(out[1], msg.data(), msg.size());
        ::_exit(n == static_cast<ssize_t>(msg.size()) ? 0 : 1);
      }
      ::close(out[1]);
      pids.push_back(pid);
      results.push_back(out[0]);
    }
    ::close(go[0]);
    ::close(go[1]);
    std::set<std::string> distinct;
    for (int i = 0; i < kProcs; ++i) {
      std::string msg;
      char buf[512];
      ssize_t n;
      while ((n = ::read(results[i], buf, sizeof(buf))) > 0) msg.append(buf, n);
      ::close(results[i]);
      int status = 0;
      ASSERT_EQ(::waitpid(pids[i], &status, 0), pids[i]);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      EXPECT_EQ(msg.rfind("ERR", 0), std::string::npos) << msg;
      distinct.insert(msg);
    }
    ASSERT_EQ(distinct.size(), 1u) << "round " << round;
    auto here = must_load(tmp.path());
    ASSERT_TRUE(here);
    EXPECT_EQ(fingerprint_sha256(here->root()), *distinct.begin());
    EXPECT_EQ(mode_of(tmp.path() / "ca-key.pem"), 0600u);
  }
}

TEST(BuiltinCaTest, ConcurrentIssuance) {
  TempDir tmp;
  auto ca = must_load(tmp.path());
  ASSERT_TRUE(ca);
  std::vector<std::thread> threads;
  threads.reserve(4);
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 25; ++j) {
        auto c = ca->issue(kWeb);
        if (c.ok() && verify_chain((*c)->leaf(), nullptr, *ca->trust_roots(),
                                   std::chrono::system_clock::now())
                          .ok()) {
          ++ok;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 100);
}

}  // namespace
}  // namespace sockmesh::identity
