#include "identity/spiffe.h"

#include <gtest/gtest.h>

#include <string>
#include <unordered_set>

#include "test_util.h"

namespace sockmesh::identity {
namespace {

using std::chrono::hours;
using testing::LeafSpec;

struct Valid {
  std::string text;
  std::string td, ns, sa;
};

TEST(SpiffeIdTest, ParsesWorkloadIds) {
  const Valid cases[] = {
      {"spiffe://cluster.local/ns/default/sa/default", "cluster.local", "default", "default"},
      {"spiffe://example.org/ns/my-ns/sa/my_sa.v1", "example.org", "my-ns", "my_sa.v1"},
      // Path segments may be mixed case; only the trust domain must be lowercase.
      {"spiffe://td/ns/Prod/sa/WebFrontend", "td", "Prod", "WebFrontend"},
      {"spiffe://a-b_c.9/ns/x/sa/y", "a-b_c.9", "x", "y"},
      {"spiffe://td/ns/ns/sa/sa", "td", "ns", "sa"},
      {"spiffe://td/ns/.hidden/sa/a..b", "td", ".hidden", "a..b"},
      {"spiffe://" + std::string(255, 'a') + "/ns/n/sa/s", std::string(255, 'a'), "n", "s"},
  };
  for (const auto& c : cases) {
    auto id = SpiffeId::parse(c.text);
    ASSERT_TRUE(id.has_value()) << c.text;
    EXPECT_EQ(id->trust_domain, c.td) << c.text;
    EXPECT_EQ(id->namespace_name, c.ns) << c.text;
    EXPECT_EQ(id->service_account, c.sa) << c.text;
    EXPECT_EQ(id->to_string(), c.text) << "round trip";
  }
}

TEST(SpiffeIdTest, RejectsEverythingElse) {
  const std::string long_sa(2048, 's');
  const std::string cases[] = {
      "",
      "spiffe://",
      "spiffe:///ns/a/sa/b",    // empty trust domain
      "SPIFFE://td/ns/a/sa/b",  // scheme is lowercase only
      "Spiffe://td/ns/a/sa/b",  //
      "https://td/ns/a/sa/b",   // wrong scheme
      "spiffe:/td/ns/a/sa/b",   // missing slash
      "spiffe:td/ns/a/sa/b",    //
      "//td/ns/a/sa/b",         // no scheme
      "spiffe://TD/ns/a/sa/b",  // uppercase trust domain
      "spiffe://Cluster.Local/ns/a/sa/b",
      "spiffe://td:443/ns/a/sa/b",                         // port
      "spiffe://user@td/ns/a/sa/b",                        // userinfo
      "spiffe://t%64/ns/a/sa/b",                           // percent-encoding
      "spiffe://tö/ns/a/sa/b",                             // non-ASCII
      "spiffe://td",                                       // no path
      "spiffe://td/",                                      //
      "spiffe://td/ns/a/sa/b/",                            // trailing slash
      "spiffe://td/ns/a/sa/b/c",                           // extra segment
      "spiffe://td/ns/a/sa/b/c/d",                         //
      "spiffe://td/x/ns/a/sa/b",                           // extra leading segment
      "spiffe://td/ns/a/sa",                               // missing service account
      "spiffe://td/ns/a",                                  //
      "spiffe://td/ns//sa/b",                              // empty namespace
      "spiffe://td/ns/a/sa/",                              // empty service account
      "spiffe://td//ns/a/sa/b",                            // empty segment
      "spiffe://td/NS/a/sa/b",                             // keywords are lowercase
      "spiffe://td/ns/a/SA/b",                             //
      "spiffe://td/sa/b/ns/a",                             // wrong order
      "spiffe://td/ns/a/sa/b?x=1",                         // query
      "spiffe://td/ns/a/sa/b#frag",                        // fragment
      "spiffe://td/ns/a%20b/sa/b",                         // percent-encoding in the path
      "spiffe://td/ns/a b/sa/b",                           // space
      "spiffe://td/ns/../sa/b",                            // dot segments
      "spiffe://td/ns/./sa/b",                             //
      "spiffe://td/ns/a/sa/..",                            //
      " spiffe://td/ns/a/sa/b",                            // surrounding whitespace
      "spiffe://td/ns/a/sa/b ",                            //
      "spiffe://td/ns/a/sa/b\n",                           //
      std::string("spiffe://td/ns/a/sa/b\0", 22),          // embedded NUL
      "spiffe://" + std::string(256, 'a') + "/ns/n/sa/s",  // trust domain over 255 bytes
      "spiffe://td/ns/n/sa/" + long_sa,                    // whole ID over 2048 bytes
  };
  for (const auto& c : cases) {
    EXPECT_FALSE(SpiffeId::parse(c).has_value()) << "accepted: \"" << c << "\"";
  }
}

TEST(SpiffeIdTest, MakeValidatesParts) {
  auto id = SpiffeId::make("cluster.local", "default", "bookinfo-productpage");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->to_string(), "spiffe://cluster.local/ns/default/sa/bookinfo-productpage");
  EXPECT_FALSE(SpiffeId::make("Cluster.local", "a", "b"));
  EXPECT_FALSE(SpiffeId::make("td", "a/b", "c"));
  EXPECT_FALSE(SpiffeId::make("td", "a", ""));
  EXPECT_FALSE(SpiffeId::make("", "a", "b"));
  EXPECT_FALSE(SpiffeId::make("td", "..", "b"));
}

TEST(SpiffeIdTest, TrustDomainCharacters) {
  EXPECT_TRUE(valid_trust_domain("cluster.local"));
  EXPECT_TRUE(valid_trust_domain("a_b-c.0"));
  EXPECT_FALSE(valid_trust_domain(""));
  EXPECT_FALSE(valid_trust_domain("Upper"));
  EXPECT_FALSE(valid_trust_domain("a:1"));
  EXPECT_FALSE(valid_trust_domain("a/b"));
  EXPECT_FALSE(valid_trust_domain(std::string(256, 'a')));
}

TEST(SpiffeIdTest, HashAndCompare) {
  auto a = *SpiffeId::parse("spiffe://td/ns/a/sa/b");
  auto b = *SpiffeId::parse("spiffe://td/ns/a/sa/b");
  auto c = *SpiffeId::parse("spiffe://td/ns/a/sa/c");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_LT(a, c);
  std::unordered_set<SpiffeId> set{a, b, c};
  EXPECT_EQ(set.size(), 2u);
}

// ---- extraction from certificates ----

class SanTest : public ::testing::Test {
 protected:
  X509Ptr cert_with(std::vector<std::string> uris, std::vector<std::string> dns = {}) {
    LeafSpec spec;
    spec.uris = std::move(uris);
    spec.dns = std::move(dns);
    spec.not_before = std::chrono::system_clock::now() - hours(1);
    spec.not_after = std::chrono::system_clock::now() + hours(1);
    return testing::make_cert(spec, key_.get(), nullptr, key_.get());
  }
  EvpPkeyPtr key_ = testing::make_p256_key();
};

TEST_F(SanTest, SingleSpiffeUri) {
  auto cert = cert_with({"spiffe://cluster.local/ns/default/sa/web"}, {"web.default.svc"});
  auto id = spiffe_id_of(cert.get());
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_EQ(id->to_string(), "spiffe://cluster.local/ns/default/sa/web");
}

TEST_F(SanTest, NoSanExtension) {
  auto cert = cert_with({});
  auto id = spiffe_id_of(cert.get());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code, SanError::kNoUriSan);
  EXPECT_NE(id.error().message.find("no subjectAltName"), std::string::npos) << id.error().message;
}

TEST_F(SanTest, OnlyDnsSans) {
  auto cert = cert_with({}, {"web.default.svc"});
  auto id = spiffe_id_of(cert.get());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code, SanError::kNoUriSan);
  EXPECT_NE(id.error().message.find("no URI"), std::string::npos) << id.error().message;
}

TEST_F(SanTest, TwoUrisAreRejectedEvenIfBothValid) {
  auto cert = cert_with({"spiffe://td/ns/a/sa/x", "spiffe://td/ns/a/sa/y"});
  auto id = spiffe_id_of(cert.get());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code, SanError::kMultipleUriSans);
  EXPECT_NE(id.error().message.find("2 URI"), std::string::npos) << id.error().message;
}

TEST_F(SanTest, NonSpiffeUri) {
  auto cert = cert_with({"https://td/ns/a/sa/x"});
  auto id = spiffe_id_of(cert.get());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code, SanError::kNotSpiffe);
}

TEST_F(SanTest, SpiffeUriThatIsNotAWorkloadId) {
  auto cert = cert_with({"spiffe://td/some/other/path"});
  auto id = spiffe_id_of(cert.get());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code, SanError::kMalformedSpiffeId);
  EXPECT_NE(id.error().message.find("spiffe://td/some/other/path"), std::string::npos);
}

TEST_F(SanTest, NullCertificate) {
  auto id = spiffe_id_of(nullptr);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code, SanError::kNoUriSan);
}

}  // namespace
}  // namespace sockmesh::identity
