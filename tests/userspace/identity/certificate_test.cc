#include "identity/certificate.h"

#include <gtest/gtest.h>
#include <openssl/pem.h>

#include "identity/builtin_ca.h"
#include "test_util.h"

namespace sockmesh::identity {
namespace {

using namespace std::chrono_literals;
using testing::LeafSpec;
using testing::TempDir;

const SpiffeId kWeb = *SpiffeId::parse("spiffe://cluster.local/ns/default/sa/web");

class CertificateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ca = BuiltinCa::load_or_create(dir_.path(), "cluster.local");
    ASSERT_TRUE(ca.ok()) << ca.error().message;
    ca_ = *ca;
    auto c = ca_->issue(kWeb);
    ASSERT_TRUE(c.ok()) << c.error().message;
    cert_ = *c;
  }
  TempDir dir_;
  std::shared_ptr<BuiltinCa> ca_;
  CertifiedKeyPtr cert_;
};

TEST_F(CertificateTest, PemRoundTrip) {
  std::string chain_pem = cert_->cert_chain_pem();
  std::string key_pem = cert_->private_key_pem();
  EXPECT_EQ(chain_pem.rfind("-----BEGIN CERTIFICATE-----", 0), 0u);
  EXPECT_EQ(key_pem.rfind("-----BEGIN PRIVATE KEY-----", 0), 0u);
  auto back = CertifiedKey::from_pem(chain_pem, key_pem);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ((*back)->identity(), cert_->identity());
  EXPECT_EQ((*back)->serial(), cert_->serial());
  EXPECT_EQ((*back)->not_before(), cert_->not_before());
  EXPECT_EQ((*back)->not_after(), cert_->not_after());
  EXPECT_EQ(X509_cmp((*back)->leaf(), cert_->leaf()), 0);
  EXPECT_EQ(EVP_PKEY_eq((*back)->private_key(), cert_->private_key()), 1);
  EXPECT_TRUE((*back)->chain().empty());
}

TEST_F(CertificateTest, ChainKeepsOrder) {
  // leaf + two more certificates: the chain holds them in file order, without the leaf.
  TempDir other;
  auto ca2 = BuiltinCa::load_or_create(other.path(), "cluster.local");
  ASSERT_TRUE(ca2.ok());
  std::string pem = cert_->cert_chain_pem() + to_pem(ca_->root()) + to_pem((*ca2)->root());
  auto back = CertifiedKey::from_pem(pem, cert_->private_key_pem());
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_EQ((*back)->chain().size(), 2u);
  EXPECT_EQ(X509_cmp((*back)->chain()[0].get(), ca_->root()), 0);
  EXPECT_EQ(X509_cmp((*back)->chain()[1].get(), (*ca2)->root()), 0);
  EXPECT_EQ((*back)->cert_chain_pem(), pem);
}

TEST_F(CertificateTest, RejectsMismatchedKey) {
  auto other = ca_->issue(kWeb);
  ASSERT_TRUE(other.ok());
  auto r = CertifiedKey::from_pem(cert_->cert_chain_pem(), (*other)->private_key_pem());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("does not match"), std::string::npos) << r.error().message;
}

TEST_F(CertificateTest, RejectsCertificateWithoutIdentity) {
  auto key = testing::make_p256_key();
  LeafSpec spec;
  spec.dns = {"example.com"};
  spec.not_before = std::chrono::system_clock::now() - 1h;
  spec.not_after = std::chrono::system_clock::now() + 1h;
  auto cert = testing::make_cert(spec, key.get(), nullptr, key.get());
  auto r = CertifiedKey::create(std::move(cert), {}, std::move(key));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no workload identity"), std::string::npos) << r.error().message;
}

TEST_F(CertificateTest, DamagedPemIsAnErrorNotAShorterChain) {
  std::string pem = cert_->cert_chain_pem() + to_pem(ca_->root());
  // Cut the second certificate in half, as a reader racing a writer might see it.
  std::string truncated = pem.substr(0, pem.size() - 200);
  auto r = certificates_from_pem(truncated);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("malformed"), std::string::npos) << r.error().message;

  EXPECT_FALSE(certificates_from_pem("").ok());
  EXPECT_FALSE(certificates_from_pem("hello").ok());
  auto two = certificates_from_pem(pem);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->size(), 2u);
}

TEST_F(CertificateTest, EncryptedKeyIsRejectedWithoutPrompting) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  char pass[] = "secret";
  ASSERT_EQ(PEM_write_bio_PrivateKey(bio.get(), cert_->private_key(), EVP_aes_128_cbc(), nullptr, 0,
                                     nullptr, pass),
            1);
  char* data = nullptr;
  long len = BIO_get_mem_data(bio.get(), &data);
  auto r = private_key_from_pem(std::string_view(data, len));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("encrypted"), std::string::npos) << r.error().message;
}

TEST_F(CertificateTest, RefreshAtAndValidity) {
  auto lifetime = cert_->not_after() - cert_->not_before();
  EXPECT_EQ(cert_->refresh_at(0.5), cert_->not_before() + lifetime / 2);
  EXPECT_EQ(cert_->refresh_at(1.0), cert_->not_after());
  EXPECT_TRUE(cert_->valid_at(cert_->not_before()));
  EXPECT_FALSE(cert_->valid_at(cert_->not_before() - 1s));
  EXPECT_FALSE(cert_->valid_at(cert_->not_after()));
}

TEST(FormatTest, Utc) {
  EXPECT_EQ(format_utc(std::chrono::system_clock::from_time_t(0)), "1970-01-01T00:00:00Z");
  EXPECT_EQ(format_utc(std::chrono::system_clock::from_time_t(1700000000)), "2023-11-14T22:13:20Z");
}

}  // namespace
}  // namespace sockmesh::identity
