#include "app/options.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace sockmesh::app {
namespace {

// Sets an environment variable for one test and restores the absence afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(OptionsTest, CaSettingsDefaults) {
  Options o;
  ASSERT_EQ(parse_options({}, &o), std::nullopt);
  EXPECT_EQ(o.proxy.ca_address, "");
  EXPECT_EQ(o.proxy.ca_root_ca, "./var/run/secrets/istio/root-cert.pem");
  EXPECT_EQ(o.proxy.token_file, "./var/run/secrets/tokens/istio-token");
  EXPECT_EQ(o.proxy.cluster_id, "Kubernetes");
  EXPECT_EQ(o.proxy.secret_ttl, std::chrono::hours(24));
  EXPECT_EQ(o.proxy.ca_max_requests, 8u);
}

TEST(OptionsTest, SecretTtlTakesIstioDurations) {
  for (auto [text, seconds] :
       {std::pair{"20s", 20}, {"24h", 86400}, {"1h30m", 5400}, {"90", 90}, {"2m", 120}}) {
    Options o;
    ASSERT_EQ(parse_options({"--secret-ttl", text}, &o), std::nullopt) << text;
    EXPECT_EQ(o.proxy.secret_ttl.count(), seconds) << text;
  }
  for (const char* bad : {"", "1d", "h", "-5s", "500ms", "10x"}) {
    Options o;
    auto err = parse_options({"--secret-ttl", bad}, &o);
    ASSERT_TRUE(err.has_value()) << bad;
    EXPECT_NE(err->find("--secret-ttl"), std::string::npos) << *err;
  }
}

TEST(OptionsTest, ZtunnelVariablesWorkAndFlagsWin) {
  ScopedEnv a("CA_ADDRESS", "https://istiod.istio-system.svc:15012");
  ScopedEnv b("SECRET_TTL", "12h");
  ScopedEnv c("AUTH_TOKEN", "/tmp/token");
  ScopedEnv d("CLUSTER_ID", "east");
  ScopedEnv e("TRUST_DOMAIN", "example.org");
  ScopedEnv f("CA_ROOT_CA", "/tmp/root.pem");
  Options o;
  ASSERT_EQ(parse_options({"--secret-ttl", "1h"}, &o), std::nullopt);
  EXPECT_EQ(o.proxy.ca_address, "https://istiod.istio-system.svc:15012");
  EXPECT_EQ(o.proxy.secret_ttl, std::chrono::hours(1)) << "the flag wins";
  EXPECT_EQ(o.proxy.token_file, "/tmp/token");
  EXPECT_EQ(o.proxy.cluster_id, "east");
  EXPECT_EQ(o.proxy.trust_domain, "example.org");
  EXPECT_EQ(o.proxy.ca_root_ca, "/tmp/root.pem");
  {
    ScopedEnv g("SOCKMESH_CLUSTER_ID", "west");
    Options p;
    ASSERT_EQ(parse_options({}, &p), std::nullopt);
    EXPECT_EQ(p.proxy.cluster_id, "west") << "SOCKMESH_<FLAG> wins over ztunnel's name";
  }
  ScopedEnv bad("SECRET_TTL", "soon");
  Options q;
  auto err = parse_options({}, &q);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->rfind("SECRET_TTL: ", 0), 0u) << *err;
}

}  // namespace
}  // namespace sockmesh::app
