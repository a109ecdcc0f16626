#include "identity/verify.h"

#include <gtest/gtest.h>

#include <set>

#include "identity/builtin_ca.h"
#include "test_util.h"

namespace sockmesh::identity {
namespace {

using namespace std::chrono_literals;
using testing::FakeClock;
using testing::LeafSpec;
using testing::TempDir;

const SpiffeId kWeb = *SpiffeId::parse("spiffe://cluster.local/ns/default/sa/web");

class VerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BuiltinCaOptions options;
    options.clock = clock_.fn();
    auto ca = BuiltinCa::load_or_create(dir_.path(), "cluster.local", options);
    ASSERT_TRUE(ca.ok()) << ca.error().message;
    ca_ = *ca;
    auto key = private_key_from_pem(testing::read_file(dir_.path() / "ca-key.pem"));
    ASSERT_TRUE(key.ok());
    ca_key_ = std::move(key).value();
  }

  CertifiedKeyPtr issue(const SpiffeId& id = kWeb) {
    auto c = ca_->issue(id);
    EXPECT_TRUE(c.ok()) << c.error().message;
    return c.ok() ? *c : nullptr;
  }

  // A leaf the built-in CA would never produce, signed by the same root.
  X509Ptr custom_leaf(LeafSpec spec) {
    if (spec.not_before == TimePoint{}) spec.not_before = clock_.now() - 1min;
    if (spec.not_after == TimePoint{}) spec.not_after = clock_.now() + 1h;
    return testing::make_cert(spec, leaf_key_.get(), ca_->root(), ca_key_.get());
  }

  VerifyStatus verify(X509* leaf, TimePoint at, PeerRole role = PeerRole::kAny) {
    return verify_chain(leaf, nullptr, *ca_->trust_roots(), at, role);
  }

  FakeClock clock_;
  TempDir dir_;
  std::shared_ptr<BuiltinCa> ca_;
  EvpPkeyPtr ca_key_;
  EvpPkeyPtr leaf_key_ = testing::make_p256_key();
};

TEST_F(VerifyTest, AcceptsCertificateFromTheRoot) {
  auto cert = issue();
  ASSERT_TRUE(cert);
  auto st = verify(cert->leaf(), clock_.now());
  EXPECT_TRUE(st.ok()) << st.error().message;
  auto peer = verify_peer(cert->leaf(), nullptr, *ca_->trust_roots(), "cluster.local", clock_.now(),
                          PeerRole::kServer);
  ASSERT_TRUE(peer.ok()) << peer.error().message;
  EXPECT_EQ(*peer, kWeb);
}

TEST_F(VerifyTest, RejectsCertificateFromAnotherCa) {
  TempDir other_dir;
  auto other = BuiltinCa::load_or_create(other_dir.path(), "cluster.local");
  ASSERT_TRUE(other.ok());
  // Same subject (O=sockmesh) as our root, different key: must not be confused.
  ASSERT_EQ(subject_string((*other)->root()), subject_string(ca_->root()));
  auto cert = (*other)->issue(kWeb);
  ASSERT_TRUE(cert.ok());
  auto st = verify((*cert)->leaf(), clock_.now());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, VerifyError::kUntrustedIssuer) << st.error().message;
  EXPECT_NE(st.error().message.find("trusted root"), std::string::npos) << st.error().message;

  // Sending the other root along as an "intermediate" does not help.
  X509List extra;
  extra.push_back(share((*other)->root()));
  auto chain = to_stack(extra);
  st = verify_chain((*cert)->leaf(), chain.get(), *ca_->trust_roots(), clock_.now());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, VerifyError::kUntrustedIssuer) << st.error().message;
}

TEST_F(VerifyTest, RejectsSelfSignedLeaf) {
  LeafSpec spec;
  spec.uris = {kWeb.to_string()};
  spec.not_before = clock_.now() - 1min;
  spec.not_after = clock_.now() + 1h;
  auto cert = testing::make_cert(spec, leaf_key_.get(), nullptr, leaf_key_.get());
  auto st = verify(cert.get(), clock_.now());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, VerifyError::kUntrustedIssuer) << st.error().message;
}

TEST_F(VerifyTest, RejectsExpiredCertificate) {
  auto cert = issue();
  ASSERT_TRUE(cert);
  auto st = verify(cert->leaf(), cert->not_after() + 1s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, VerifyError::kExpired) << st.error().message;
  EXPECT_NE(st.error().message.find("leaf certificate expired at " + format_utc(cert->not_after())),
            std::string::npos)
      << st.error().message;
  // One second before expiry it is still fine.
  EXPECT_TRUE(verify(cert->leaf(), cert->not_after() - 1s).ok());
}

TEST_F(VerifyTest, RejectsCertificateIssuedInThePast) {
  // Issued 30 hours ago with a 24 hour lifetime: expired now, root still valid.
  clock_.advance(-30h);
  auto cert = issue();
  clock_.advance(30h);
  ASSERT_TRUE(cert);
  auto st = verify(cert->leaf(), clock_.now());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, VerifyError::kExpired) << st.error().message;
}

TEST_F(VerifyTest, RejectsNotYetValidCertificate) {
  clock_.advance(2h);
  auto cert = issue();  // not_before = now + 2h - 5min
  clock_.advance(-2h);
  ASSERT_TRUE(cert);
  auto st = verify(cert->leaf(), clock_.now());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, VerifyError::kNotYetValid) << st.error().message;
  EXPECT_NE(st.error().message.find("not valid before " + format_utc(cert->not_before())),
            std::string::npos)
      << st.error().message;
}

TEST_F(VerifyTest, ChecksExtendedKeyUsageForRole) {
  LeafSpec spec;
  spec.uris = {kWeb.to_string()};
  spec.ext_key_usage = "serverAuth";
  auto cert = custom_leaf(spec);
  EXPECT_TRUE(verify(cert.get(), clock_.now(), PeerRole::kServer).ok());
  auto st = verify(cert.get(), clock_.now(), PeerRole::kClient);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, VerifyError::kInvalidChain) << st.error().message;
}

TEST_F(VerifyTest, RejectsWrongTrustDomain) {
  LeafSpec spec;
  spec.uris = {"spiffe://other.domain/ns/default/sa/web"};
  auto cert = custom_leaf(spec);
  ASSERT_TRUE(verify(cert.get(), clock_.now()).ok());  // the chain itself is fine
  auto id = check_trust_domain(cert.get(), "cluster.local");
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code, VerifyError::kWrongTrustDomain);
  EXPECT_NE(id.error().message.find("\"other.domain\", expected \"cluster.local\""),
            std::string::npos)
      << id.error().message;
  auto peer = verify_peer(cert.get(), nullptr, *ca_->trust_roots(), "cluster.local", clock_.now());
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.error().code, VerifyError::kWrongTrustDomain);
}

TEST_F(VerifyTest, RejectsCertificateWithoutSpiffeId) {
  LeafSpec spec;
  spec.dns = {"web.default.svc.cluster.local"};
  auto cert = custom_leaf(spec);
  auto peer = verify_peer(cert.get(), nullptr, *ca_->trust_roots(), "cluster.local", clock_.now());
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.error().code, VerifyError::kNoSpiffeId) << peer.error().message;

  LeafSpec two;
  two.uris = {"spiffe://cluster.local/ns/a/sa/x", "spiffe://cluster.local/ns/a/sa/y"};
  auto cert2 = custom_leaf(two);
  peer = verify_peer(cert2.get(), nullptr, *ca_->trust_roots(), "cluster.local", clock_.now());
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.error().code, VerifyError::kInvalidSpiffeId) << peer.error().message;
}

TEST_F(VerifyTest, ErrorsAreDistinct) {
  // One message per failure class, so an operator can tell them apart in a log line.
  auto cert = issue();
  ASSERT_TRUE(cert);
  TempDir other_dir;
  auto other = BuiltinCa::load_or_create(other_dir.path(), "cluster.local");
  ASSERT_TRUE(other.ok());
  auto foreign = (*other)->issue(kWeb);
  ASSERT_TRUE(foreign.ok());
  LeafSpec no_san;
  auto bare = custom_leaf(no_san);
  LeafSpec wrong_td;
  wrong_td.uris = {"spiffe://other.domain/ns/a/sa/b"};
  auto wrong = custom_leaf(wrong_td);

  const auto& roots = *ca_->trust_roots();
  std::vector<VerifyFailure> failures;
  auto collect = [&](X509* leaf, TimePoint at) {
    auto r = verify_peer(leaf, nullptr, roots, "cluster.local", at);
    EXPECT_FALSE(r.ok());
    if (!r.ok()) failures.push_back(r.error());
  };
  collect(cert->leaf(), cert->not_after() + 1h);
  collect(cert->leaf(), cert->not_before() - 1s);
  collect((*foreign)->leaf(), clock_.now());
  collect(bare.get(), clock_.now());
  collect(wrong.get(), clock_.now());
  ASSERT_EQ(failures.size(), 5u);
  std::set<VerifyError> codes;
  std::set<std::string> messages;
  for (const auto& f : failures) {
    codes.insert(f.code);
    messages.insert(f.message);
    EXPECT_FALSE(f.message.empty());
  }
  EXPECT_EQ(codes, (std::set<VerifyError>{VerifyError::kExpired, VerifyError::kNotYetValid,
                                          VerifyError::kUntrustedIssuer, VerifyError::kNoSpiffeId,
                                          VerifyError::kWrongTrustDomain}));
  EXPECT_EQ(messages.size(), 5u);
}

TEST_F(VerifyTest, NoLeafOrNoRoots) {
  auto st = verify_chain(nullptr, nullptr, *ca_->trust_roots(), clock_.now());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, VerifyError::kMalformed);
  auto cert = issue();
  ASSERT_TRUE(cert);
  st = verify_chain(cert->leaf(), nullptr, X509List{}, clock_.now());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, VerifyError::kNoTrustRoots);
}

TEST_F(VerifyTest, VerifiesThroughAnIntermediate) {
  // Istio deployments with a plugged-in CA: root -> intermediate -> workload.
  auto inter_key = testing::make_p256_key();
  LeafSpec inter_spec;
  inter_spec.is_ca = true;
  inter_spec.organization = "intermediate";
  inter_spec.not_before = clock_.now() - 1h;
  inter_spec.not_after = clock_.now() + 48h;
  auto inter = testing::make_cert(inter_spec, inter_key.get(), ca_->root(), ca_key_.get());
  LeafSpec leaf_spec;
  leaf_spec.uris = {kWeb.to_string()};
  leaf_spec.not_before = clock_.now() - 1min;
  leaf_spec.not_after = clock_.now() + 72h;
  auto leaf = testing::make_cert(leaf_spec, leaf_key_.get(), inter.get(), inter_key.get());

  EXPECT_EQ(verify(leaf.get(), clock_.now()).error().code, VerifyError::kUntrustedIssuer)
      << "without the intermediate the chain is incomplete";
  X509List chain_list;
  chain_list.push_back(share(inter.get()));
  auto chain = to_stack(chain_list);
  auto st = verify_chain(leaf.get(), chain.get(), *ca_->trust_roots(), clock_.now());
  EXPECT_TRUE(st.ok()) << st.error().message;
  // An expired intermediate is reported as such, naming the CA certificate.
  st = verify_chain(leaf.get(), chain.get(), *ca_->trust_roots(), clock_.now() + 50h);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, VerifyError::kExpired);
  EXPECT_NE(st.error().message.find("CA certificate at depth 1"), std::string::npos)
      << st.error().message;
}

}  // namespace
}  // namespace sockmesh::identity
