#include "identity/csr.h"

#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "test_util.h"

namespace sockmesh::identity {
namespace {

using namespace std::chrono_literals;
using testing::FakeClock;
using testing::LeafSpec;

const SpiffeId kWeb = *SpiffeId::parse("spiffe://cluster.local/ns/default/sa/web");
const SpiffeId kDb = *SpiffeId::parse("spiffe://cluster.local/ns/data/sa/db");

struct ReqFree {
  void operator()(X509_REQ* p) const { X509_REQ_free(p); }
};

// A CA (self-signed, or under `parent`) as a remote CA would hold it.
struct TestCa {
  EvpPkeyPtr key = testing::make_p256_key();
  X509Ptr cert;
  TestCa(const std::string& name, FakeClock& clock, const TestCa* parent = nullptr) {
    LeafSpec spec;
    spec.is_ca = true;
    spec.organization = name;
    spec.ext_key_usage = "";
    spec.not_before = clock.now() - 1h;
    spec.not_after = clock.now() + 48h;
    cert = testing::make_cert(spec, key.get(), parent ? parent->cert.get() : nullptr,
                              parent ? parent->key.get() : key.get());
  }
  // What the CA would return for `csr_key`: a leaf naming `uri`.
  std::string sign(EVP_PKEY* subject_key, const std::string& uri, FakeClock& clock,
                   std::chrono::seconds ttl = 1h) const {
    LeafSpec spec;
    spec.uris = {uri};
    spec.not_before = clock.now();
    spec.not_after = clock.now() + ttl;
    return to_pem(testing::make_cert(spec, subject_key, cert.get(), key.get()).get());
  }
  std::string pem() const { return to_pem(cert.get()); }
  X509List roots() const {
    X509List l;
    l.push_back(share(cert.get()));
    return l;
  }
};

class CsrTest : public ::testing::Test {
 protected:
  CertificateRequest request(const SpiffeId& id = kWeb) {
    auto r = make_certificate_request(id);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return std::move(r).value();
  }
  FakeClock clock_;
  TestCa root_{"root", clock_};
};

TEST_F(CsrTest, RequestIsP256Sha256WithTheSpiffeIdAsOnlySan) {
  CertificateRequest r = request();
  BioPtr bio(BIO_new_mem_buf(r.csr_pem.data(), static_cast<int>(r.csr_pem.size())));
  std::unique_ptr<X509_REQ, ReqFree> req(
      PEM_read_bio_X509_REQ(bio.get(), nullptr, nullptr, nullptr));
  ASSERT_TRUE(req);
  EVP_PKEY* pub = X509_REQ_get0_pubkey(req.get());
  ASSERT_NE(pub, nullptr);
  EXPECT_EQ(X509_REQ_verify(req.get(), pub), 1) << "self-signature";
  EXPECT_EQ(EVP_PKEY_eq(pub, r.key.get()), 1) << "the CSR carries our key";
  char group[64] = {};
  size_t len = 0;
  ASSERT_EQ(EVP_PKEY_get_group_name(pub, group, sizeof(group), &len), 1);
  EXPECT_STREQ(group, "prime256v1");
  EXPECT_EQ(X509_REQ_get_signature_nid(req.get()), NID_ecdsa_with_SHA256);
  EXPECT_EQ(X509_NAME_entry_count(X509_REQ_get_subject_name(req.get())), 0);

  STACK_OF(X509_EXTENSION)* exts = X509_REQ_get_extensions(req.get());
  ASSERT_NE(exts, nullptr);
  int idx = X509v3_get_ext_by_NID(exts, NID_subject_alt_name, -1);
  ASSERT_GE(idx, 0);
  X509_EXTENSION* ext = X509v3_get_ext(exts, idx);
  EXPECT_EQ(X509_EXTENSION_get_critical(ext), 1);
  auto* names = static_cast<GENERAL_NAMES*>(X509V3_EXT_d2i(ext));
  ASSERT_NE(names, nullptr);
  ASSERT_EQ(sk_GENERAL_NAME_num(names), 1);
  GENERAL_NAME* n = sk_GENERAL_NAME_value(names, 0);
  ASSERT_EQ(n->type, GEN_URI);
  std::string uri(
      reinterpret_cast<const char*>(ASN1_STRING_get0_data(n->d.uniformResourceIdentifier)),
      ASN1_STRING_length(n->d.uniformResourceIdentifier));
  EXPECT_EQ(uri, kWeb.to_string());
  GENERAL_NAMES_free(names);
  sk_X509_EXTENSION_pop_free(exts, X509_EXTENSION_free);
}

TEST_F(CsrTest, EveryRequestHasAFreshKey) {
  CertificateRequest a = request();
  CertificateRequest b = request();
  EXPECT_NE(EVP_PKEY_eq(a.key.get(), b.key.get()), 1);
  EXPECT_NE(a.csr_pem, b.csr_pem);
}

TEST_F(CsrTest, AcceptsLeafAndRootAndDropsTheRoot) {
  CertificateRequest r = request();
  std::string leaf = root_.sign(r.key.get(), kWeb.to_string(), clock_);
  auto ck =
      accept_issued_chain({leaf, root_.pem()}, std::move(r.key), kWeb, root_.roots(), clock_.now());
  ASSERT_TRUE(ck.ok()) << ck.error().message;
  EXPECT_EQ((*ck)->identity(), kWeb.to_string());
  EXPECT_TRUE((*ck)->chain().empty()) << "the root is trusted from the bundle, not carried";
}

TEST_F(CsrTest, KeepsIntermediates) {
  TestCa inter("intermediate", clock_, &root_);
  CertificateRequest r = request();
  std::string leaf = inter.sign(r.key.get(), kWeb.to_string(), clock_);
  auto ck = accept_issued_chain({leaf, inter.pem(), root_.pem()}, std::move(r.key), kWeb,
                                root_.roots(), clock_.now());
  ASSERT_TRUE(ck.ok()) << ck.error().message;
  ASSERT_EQ((*ck)->chain().size(), 1u);
  EXPECT_EQ(serial_hex((*ck)->chain()[0].get()), serial_hex(inter.cert.get()));
  // Without the intermediate the leaf does not lead to the root.
  CertificateRequest r2 = request();
  std::string leaf2 = inter.sign(r2.key.get(), kWeb.to_string(), clock_);
  auto missing = accept_issued_chain({leaf2}, std::move(r2.key), kWeb, root_.roots(), clock_.now());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("does not chain to the configured root"),
            std::string::npos)
      << missing.error().message;
}

TEST_F(CsrTest, RejectsAnotherIdentity) {
  CertificateRequest r = request(kWeb);
  std::string leaf = root_.sign(r.key.get(), kDb.to_string(), clock_);
  auto ck =
      accept_issued_chain({leaf, root_.pem()}, std::move(r.key), kWeb, root_.roots(), clock_.now());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.error().message,
            "the CA issued a certificate for " + kDb.to_string() + ", not for " + kWeb.to_string());
}

TEST_F(CsrTest, RejectsAnUnrelatedRoot) {
  TestCa other("other", clock_);
  CertificateRequest r = request();
  std::string leaf = other.sign(r.key.get(), kWeb.to_string(), clock_);
  // The response even carries the unrelated root: it must not be trusted for being there.
  auto ck =
      accept_issued_chain({leaf, other.pem()}, std::move(r.key), kWeb, root_.roots(), clock_.now());
  ASSERT_FALSE(ck.ok());
  EXPECT_NE(ck.error().message.find("does not chain to the configured root"), std::string::npos)
      << ck.error().message;
}

TEST_F(CsrTest, RejectsALeafForAnotherKey) {
  CertificateRequest r = request();
  EvpPkeyPtr stranger = testing::make_p256_key();
  std::string leaf = root_.sign(stranger.get(), kWeb.to_string(), clock_);
  auto ck = accept_issued_chain({leaf}, std::move(r.key), kWeb, root_.roots(), clock_.now());
  ASSERT_FALSE(ck.ok());
  EXPECT_NE(ck.error().message.find("private key does not match"), std::string::npos)
      << ck.error().message;
}

TEST_F(CsrTest, RejectsExpiredEmptyAndGarbage) {
  CertificateRequest r = request();
  // A 20 s certificate checked a minute later.
  std::string leaf = root_.sign(r.key.get(), kWeb.to_string(), clock_, 20s);
  auto late =
      accept_issued_chain({leaf}, std::move(r.key), kWeb, root_.roots(), clock_.now() + 1min);
  ASSERT_FALSE(late.ok());
  EXPECT_NE(late.error().message.find("does not chain to the configured root"), std::string::npos)
      << late.error().message;

  auto empty = accept_issued_chain({}, request().key, kWeb, root_.roots(), clock_.now());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().message,
            "the CA returned an empty certificate chain for " + kWeb.to_string());
  auto garbage =
      accept_issued_chain({"not a certificate"}, request().key, kWeb, root_.roots(), clock_.now());
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.error().message.find("element 0"), std::string::npos)
      << garbage.error().message;
}

}  // namespace
}  // namespace sockmesh::identity
