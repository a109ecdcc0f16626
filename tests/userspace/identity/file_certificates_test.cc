#include "identity/file_certificates.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <future>

#include "identity/builtin_ca.h"
#include "identity/certificate_cache.h"
#include "identity/file_util.h"
#include "identity/verify.h"
#include "test_util.h"

namespace sockmesh::identity {
namespace {

using namespace std::chrono_literals;
using testing::FakeClock;
using testing::TempDir;
using testing::write_file;

const SpiffeId kWeb = *SpiffeId::parse("spiffe://cluster.local/ns/default/sa/web");
const SpiffeId kDb = *SpiffeId::parse("spiffe://cluster.local/ns/data/sa/db");

class FileCertificatesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BuiltinCaOptions options;
    options.clock = clock_.fn();
    auto ca = BuiltinCa::load_or_create(ca_dir_.path(), "cluster.local", options);
    ASSERT_TRUE(ca.ok()) << ca.error().message;
    ca_ = *ca;
    write_file(dir() / "root-cert.pem", to_pem(ca_->root()));
  }

  const std::filesystem::path& dir() const { return certs_dir_.path(); }

  CertifiedKeyPtr mint(const SpiffeId& id) {
    auto c = ca_->issue(id);
    EXPECT_TRUE(c.ok()) << c.error().message;
    return *c;
  }

  // Writes a freshly minted certificate for `id` into `where` and returns it.
  CertifiedKeyPtr install(const SpiffeId& id, const std::filesystem::path& where) {
    CertifiedKeyPtr c = mint(id);
    write_file(where / "cert-chain.pem", c->cert_chain_pem());
    write_file(where / "key.pem", c->private_key_pem());
    return c;
  }

  std::filesystem::path per_id(const SpiffeId& id) const {
    return dir() / id.namespace_name / id.service_account;
  }

  std::shared_ptr<FileCertificates> open() {
    auto fc = FileCertificates::create(dir(), clock_.fn());
    EXPECT_TRUE(fc.ok()) << fc.error().message;
    return fc.ok() ? *fc : nullptr;
  }

  FakeClock clock_;
  TempDir ca_dir_;
  TempDir certs_dir_;
  std::shared_ptr<BuiltinCa> ca_;
};

// A FIFO where a certificate or key is expected: opening it used to wait for a writer forever
// (start-up, or the reload thread, hung). It is refused at once, naming the file.
TEST(FileUtil, ReadRefusesAFifoWithoutBlocking) {
  TempDir tmp;
  auto path = tmp.path() / "cert-chain.pem";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto result = std::async(std::launch::async, [&] { return files::read(path); });
  if (result.wait_for(3s) != std::future_status::ready) {
    int w = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);  // releases the blocked reader
    if (w >= 0) ::close(w);
    result.wait();
    FAIL() << "reading a FIFO as a certificate file blocked for 3 s";
  }
  auto r = result.get();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("not a regular file"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("cert-chain.pem"), std::string::npos) << r.error().message;
}

TEST_F(FileCertificatesTest, ReadsPerIdentityLayout) {
  CertifiedKeyPtr web = install(kWeb, per_id(kWeb));
  CertifiedKeyPtr db = install(kDb, per_id(kDb));
  auto fc = open();
  ASSERT_TRUE(fc);
  EXPECT_EQ(fc->kind(), "files");

  auto got = fc->issue(kWeb);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ((*got)->serial(), web->serial());
  EXPECT_EQ((*got)->identity(), kWeb.to_string());
  EXPECT_EQ(EVP_PKEY_eq((*got)->private_key(), web->private_key()), 1);
  auto got_db = fc->issue(kDb);
  ASSERT_TRUE(got_db.ok()) << got_db.error().message;
  EXPECT_EQ((*got_db)->serial(), db->serial());

  auto roots = fc->trust_roots();
  ASSERT_EQ(roots->size(), 1u);
  EXPECT_EQ(fingerprint_sha256(roots->front().get()), fingerprint_sha256(ca_->root()));
  EXPECT_TRUE(verify_chain((*got)->leaf(), nullptr, *roots, clock_.now()).ok());

  // Unchanged files are not re-read: the same object comes back.
  auto again = fc->issue(kWeb);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *got);
  EXPECT_FALSE(fc->superseded(**got));
}

TEST_F(FileCertificatesTest, FlatLayoutServesTheIdentityItHolds) {
  CertifiedKeyPtr web = install(kWeb, dir());
  auto fc = open();
  ASSERT_TRUE(fc);
  auto got = fc->issue(kWeb);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ((*got)->serial(), web->serial());

  auto other = fc->issue(kDb);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message.find("is for " + kWeb.to_string() + ", not " + kDb.to_string()),
            std::string::npos)
      << other.error().message;
}

TEST_F(FileCertificatesTest, PerIdentityDirectoryWinsOverFlatFiles) {
  install(kWeb, dir());
  CertifiedKeyPtr specific = install(kWeb, per_id(kWeb));
  auto fc = open();
  ASSERT_TRUE(fc);
  auto got = fc->issue(kWeb);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->serial(), specific->serial());
}

TEST_F(FileCertificatesTest, MissingOrMisplacedFiles) {
  auto fc = open();
  ASSERT_TRUE(fc);
  auto missing = fc->issue(kWeb);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find((per_id(kWeb) / "cert-chain.pem").string()),
            std::string::npos)
      << missing.error().message;

  // db's certificate placed in web's directory.
  CertifiedKeyPtr db = mint(kDb);
  write_file(per_id(kWeb) / "cert-chain.pem", db->cert_chain_pem());
  auto no_key = fc->issue(kWeb);
  ASSERT_FALSE(no_key.ok());
  EXPECT_NE(no_key.error().message.find("no private key"), std::string::npos);
  write_file(per_id(kWeb) / "key.pem", db->private_key_pem());
  auto wrong = fc->issue(kWeb);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("is for " + kDb.to_string()), std::string::npos)
      << wrong.error().message;
}

TEST_F(FileCertificatesTest, ReloadsWhenFilesChange) {
  CertifiedKeyPtr v1 = install(kWeb, per_id(kWeb));
  auto fc = open();
  ASSERT_TRUE(fc);
  auto got1 = fc->issue(kWeb);
  ASSERT_TRUE(got1.ok());
  EXPECT_EQ((*got1)->serial(), v1->serial());
  EXPECT_FALSE(fc->superseded(**got1));

  CertifiedKeyPtr v2 = install(kWeb, per_id(kWeb));
  EXPECT_TRUE(fc->superseded(**got1));
  auto got2 = fc->issue(kWeb);
  ASSERT_TRUE(got2.ok()) << got2.error().message;
  EXPECT_EQ((*got2)->serial(), v2->serial());
  EXPECT_NE(*got2, *got1);
  EXPECT_FALSE(fc->superseded(**got2));
  EXPECT_TRUE(fc->superseded(**got1)) << "an older object stays superseded";
}

TEST_F(FileCertificatesTest, InPlaceRewriteIsNoticed) {
  // Some tools truncate and rewrite instead of renaming; the inode stays the same.
  CertifiedKeyPtr v1 = install(kWeb, per_id(kWeb));
  auto fc = open();
  ASSERT_TRUE(fc);
  auto got1 = fc->issue(kWeb);
  ASSERT_TRUE(got1.ok());
  CertifiedKeyPtr v2 = mint(kWeb);
  for (auto [name, text] : {std::pair{"cert-chain.pem", v2->cert_chain_pem()},
                            std::pair{"key.pem", v2->private_key_pem()}}) {
    FILE* f = std::fopen((per_id(kWeb) / name).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  EXPECT_TRUE(fc->superseded(**got1));
  auto got2 = fc->issue(kWeb);
  ASSERT_TRUE(got2.ok()) << got2.error().message;
  EXPECT_EQ((*got2)->serial(), v2->serial());
}

TEST_F(FileCertificatesTest, KubernetesSymlinkSwap) {
  // The atomic-writer layout of a Kubernetes secret volume: visible names are symlinks into
  // "..data", which is itself a symlink that gets replaced in one rename.
  auto publish = [&](const std::string& version, const CertifiedKeyPtr& c) {
    write_file(dir() / version / "cert-chain.pem", c->cert_chain_pem());
    write_file(dir() / version / "key.pem", c->private_key_pem());
    std::filesystem::create_directory_symlink(version, dir() / "..data_tmp");
    std::filesystem::rename(dir() / "..data_tmp", dir() / "..data");
  };
  CertifiedKeyPtr v1 = mint(kWeb);
  publish("..v1", v1);
  std::filesystem::create_symlink("..data/cert-chain.pem", dir() / "cert-chain.pem");
  std::filesystem::create_symlink("..data/key.pem", dir() / "key.pem");
  auto fc = open();
  ASSERT_TRUE(fc);
  auto got1 = fc->issue(kWeb);
  ASSERT_TRUE(got1.ok()) << got1.error().message;
  EXPECT_EQ((*got1)->serial(), v1->serial());

  CertifiedKeyPtr v2 = mint(kWeb);
  publish("..v2", v2);
  EXPECT_TRUE(fc->superseded(**got1));
  auto got2 = fc->issue(kWeb);
  ASSERT_TRUE(got2.ok()) << got2.error().message;
  EXPECT_EQ((*got2)->serial(), v2->serial());
}

TEST_F(FileCertificatesTest, HalfWrittenUpdateIsAnErrorUntilComplete) {
  CertifiedKeyPtr v1 = install(kWeb, per_id(kWeb));
  auto fc = open();
  ASSERT_TRUE(fc);
  ASSERT_TRUE(fc->issue(kWeb).ok());
  CertifiedKeyPtr v2 = mint(kWeb);
  write_file(per_id(kWeb) / "cert-chain.pem", v2->cert_chain_pem());  // key not yet
  auto torn = fc->issue(kWeb);
  ASSERT_FALSE(torn.ok());
  EXPECT_NE(torn.error().message.find("does not match"), std::string::npos) << torn.error().message;
  write_file(per_id(kWeb) / "key.pem", v2->private_key_pem());
  auto done = fc->issue(kWeb);
  ASSERT_TRUE(done.ok()) << done.error().message;
  EXPECT_EQ((*done)->serial(), v2->serial());
}

TEST_F(FileCertificatesTest, ExpiredFilesAreRejected) {
  install(kWeb, per_id(kWeb));
  auto fc = open();
  ASSERT_TRUE(fc);
  clock_.advance(25h);
  auto got = fc->issue(kWeb);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.error().message.find("expired at"), std::string::npos) << got.error().message;
}

TEST_F(FileCertificatesTest, RootsReloadOnRefresh) {
  auto fc = open();
  ASSERT_TRUE(fc);
  TempDir other_dir;
  auto other = BuiltinCa::load_or_create(other_dir.path(), "cluster.local");
  ASSERT_TRUE(other.ok());
  TrustRootsPtr before = fc->trust_roots();

  // Root rotation: the bundle temporarily holds old and new root.
  write_file(dir() / "root-cert.pem", to_pem(ca_->root()) + to_pem((*other)->root()));
  EXPECT_EQ(fc->trust_roots(), before) << "only refresh() reloads";
  fc->refresh();
  TrustRootsPtr after = fc->trust_roots();
  ASSERT_EQ(after->size(), 2u);
  EXPECT_EQ(fingerprint_sha256((*after)[1].get()), fingerprint_sha256((*other)->root()));
  EXPECT_EQ(before->size(), 1u) << "holders of the old bundle keep it unchanged";

  // A damaged bundle is ignored; the last good one stays.
  write_file(dir() / "root-cert.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n");
  fc->refresh();
  EXPECT_EQ(fc->trust_roots(), after);
}

TEST_F(FileCertificatesTest, ABadRootBundleIsWarnedAboutOncePerChange) {
  auto fc = open();
  ASSERT_TRUE(fc);
  TrustRootsPtr good = fc->trust_roots();
  write_file(dir() / "root-cert.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n");
  auto warnings = [&](int refreshes) {
    ::testing::internal::CaptureStderr();
    for (int i = 0; i < refreshes; ++i) fc->refresh();
    std::string err = ::testing::internal::GetCapturedStderr();
    size_t n = 0;
    for (size_t at = err.find("keeping previous trust roots"); at != std::string::npos;
         at = err.find("keeping previous trust roots", at + 1)) {
      ++n;
    }
    return n;
  };
  EXPECT_EQ(warnings(5), 1u) << "the same bad file is reported once, not on every check";
  EXPECT_EQ(fc->trust_roots(), good);
  // Changed again (still bad): reported again, once.
  write_file(dir() / "root-cert.pem", "-----BEGIN CERTIFICATE-----\nBBBBBBBB\n");
  EXPECT_EQ(warnings(3), 1u);
  // A good bundle is taken as before.
  write_file(dir() / "root-cert.pem", to_pem(ca_->root()));
  fc->refresh();
  EXPECT_NE(fc->trust_roots(), good);
  EXPECT_EQ(fc->trust_roots()->size(), 1u);
}

TEST_F(FileCertificatesTest, CreateNeedsRoots) {
  std::filesystem::remove(dir() / "root-cert.pem");
  auto fc = FileCertificates::create(dir());
  ASSERT_FALSE(fc.ok());
  EXPECT_NE(fc.error().message.find("root-cert.pem"), std::string::npos) << fc.error().message;
  write_file(dir() / "root-cert.pem", "not pem");
  fc = FileCertificates::create(dir());
  ASSERT_FALSE(fc.ok());
  EXPECT_NE(fc.error().message.find("no PEM certificate"), std::string::npos) << fc.error().message;
}

TEST_F(FileCertificatesTest, CachePicksUpRotationBeforeHalfLife) {
  CertifiedKeyPtr v1 = install(kWeb, per_id(kWeb));
  auto fc = open();
  ASSERT_TRUE(fc);
  CertificateCacheOptions options;
  options.clock = clock_.fn();
  CertificateCache cache(fc, options);
  CertifiedKeyPtr got1 = cache.get(kWeb.to_string());
  ASSERT_TRUE(got1);
  EXPECT_EQ(got1->serial(), v1->serial());
  EXPECT_EQ(cache.renew_due(), 0u);

  CertifiedKeyPtr v2 = install(kWeb, per_id(kWeb));
  EXPECT_EQ(cache.renew_due(), 1u);
  CertifiedKeyPtr got2 = cache.get(kWeb.to_string());
  ASSERT_TRUE(got2);
  EXPECT_EQ(got2->serial(), v2->serial());
  EXPECT_EQ(cache.renew_due(), 0u);
  EXPECT_EQ(cache.snapshot().issuer, "files");
}

TEST_F(FileCertificatesTest, CacheDoesNotSpinOnStaleFiles) {
  // Nobody rotates the files: past half-life the cache asks again only after a pause.
  install(kWeb, per_id(kWeb));
  auto fc = open();
  ASSERT_TRUE(fc);
  CertificateCacheOptions options;
  options.clock = clock_.fn();
  CertificateCache cache(fc, options);
  CertifiedKeyPtr got1 = cache.get(kWeb.to_string());
  ASSERT_TRUE(got1);
  clock_.advance(13h);
  EXPECT_EQ(cache.get(kWeb.to_string()), got1);
  auto next = cache.next_renewal();
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(*next, clock_.now());
}

}  // namespace
}  // namespace sockmesh::identity
