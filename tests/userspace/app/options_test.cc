// The control-plane settings (xDS and Istio's CA), Istio's durations and ztunnel's environment
// variables: a flag wins over SOCKMESH_<FLAG>, which wins over ztunnel's name for the setting.
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

TEST(XdsOptions, DefaultsAsZtunnel) {
  Options o;
  ASSERT_EQ(parse_options({}, &o), std::nullopt);
  EXPECT_EQ(o.xds.address, "") << "no xDS unless asked: the local config or the embedded default";
  EXPECT_EQ(o.xds.root_ca, "./var/run/secrets/istio/root-cert.pem");
  EXPECT_EQ(o.xds.token_file, "./var/run/secrets/tokens/istio-token");
  EXPECT_EQ(o.xds.cluster_id, "Kubernetes");
}

TEST(XdsOptions, ZtunnelVariablesAreRead) {
  ScopedEnv a("XDS_ADDRESS", "https://istiod.istio-system.svc:15012");
  ScopedEnv r("XDS_ROOT_CA", "/r.pem");
  ScopedEnv t("AUTH_TOKEN", "/t");
  ScopedEnv c("CLUSTER_ID", "c2");
  ScopedEnv n("NODE_NAME", "n1");
  ScopedEnv p("POD_NAME", "ztunnel-x");
  ScopedEnv ns("POD_NAMESPACE", "istio-system");
  ScopedEnv ip("INSTANCE_IP", "10.0.0.9");
  ScopedEnv l("LOCAL_XDS_PATH", "/local.yaml");
  Options o;
  ASSERT_EQ(parse_options({}, &o), std::nullopt);
  EXPECT_EQ(o.xds.address, "https://istiod.istio-system.svc:15012");
  EXPECT_EQ(o.xds.root_ca, "/r.pem");
  EXPECT_EQ(o.xds.token_file, "/t");
  EXPECT_EQ(o.xds.cluster_id, "c2");
  EXPECT_EQ(o.proxy.node_name, "n1");
  EXPECT_EQ(o.xds.pod_name, "ztunnel-x");
  EXPECT_EQ(o.xds.pod_namespace, "istio-system");
  EXPECT_EQ(o.xds.instance_ip, "10.0.0.9");
  EXPECT_EQ(o.proxy.config_file, "/local.yaml");
}

TEST(XdsOptions, FlagWinsOverSockmeshVariableWhichWinsOverZtunnels) {
  ScopedEnv z("XDS_ADDRESS", "https://from-ztunnel-env:15012");
  {
    Options o;
    ScopedEnv s("SOCKMESH_XDS_ADDRESS", "https://from-sockmesh-env:15012");
    ASSERT_EQ(parse_options({}, &o), std::nullopt);
    EXPECT_EQ(o.xds.address, "https://from-sockmesh-env:15012");
  }
  Options o;
  ASSERT_EQ(parse_options({"--xds-address", "https://from-flag:15012"}, &o), std::nullopt);
  EXPECT_EQ(o.xds.address, "https://from-flag:15012");
}

TEST(XdsOptions, HelpListsZtunnelsVariables) {
  std::string u = usage();
  for (const char* s :
       {"--xds-address", "XDS_ADDRESS", "XDS_ROOT_CA", "AUTH_TOKEN", "CLUSTER_ID", "NODE_NAME",
        "POD_NAME", "POD_NAMESPACE", "INSTANCE_IP", "LOCAL_XDS_PATH"}) {
    EXPECT_NE(u.find(s), std::string::npos) << s;
  }
}

TEST(XdsOptions, OneTokenFileAndClusterIdForXdsAndTheCa) {
  Options o;
  ASSERT_EQ(parse_options({"--xds-token-file", "/t", "--cluster-id", "c9"}, &o), std::nullopt);
  EXPECT_EQ(o.xds.token_file, "/t");
  EXPECT_EQ(o.proxy.token_file, "/t");
  EXPECT_EQ(o.xds.cluster_id, "c9");
  EXPECT_EQ(o.proxy.cluster_id, "c9");
}

TEST(XdsOptions, TheCaIsAtIstiodsAddressUnlessTold) {
  Options o;
  ASSERT_EQ(parse_options({"--xds-address", "https://istiod:15012"}, &o), std::nullopt);
  EXPECT_EQ(o.proxy.ca_address, "https://istiod:15012");
  Options p;
  ASSERT_EQ(parse_options({"--xds-address", "https://istiod:15012", "--ca-address",
                           "https://ca:15012"}, &p), std::nullopt);
  EXPECT_EQ(p.proxy.ca_address, "https://ca:15012");
  Options q;  // '' keeps the built-in CA (or --certs-dir) while xDS is on
  ASSERT_EQ(parse_options({"--xds-address", "https://istiod:15012", "--ca-address", ""}, &q),
            std::nullopt);
  EXPECT_EQ(q.proxy.ca_address, "");
}

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

TEST(OptionsTest, WorkerThreadsFromZtunnelsVariable) {
  Options d;
  ASSERT_EQ(parse_options({}, &d), std::nullopt);
  EXPECT_EQ(d.proxy.workers, 0) << "0: the proxy sizes it from the cores";
  ScopedEnv z("ZTUNNEL_WORKER_THREADS", "1");
  Options o;
  ASSERT_EQ(parse_options({}, &o), std::nullopt);
  EXPECT_EQ(o.proxy.workers, 1);
  Options f;
  ASSERT_EQ(parse_options({"--workers", "3"}, &f), std::nullopt);
  EXPECT_EQ(f.proxy.workers, 3) << "the flag wins";
}

TEST(OptionsTest, PoolMaxStreamsPerConnectionAsZtunnel) {
  Options d;
  ASSERT_EQ(parse_options({}, &d), std::nullopt);
  EXPECT_EQ(d.proxy.max_streams_per_connection, 100u);
  {
    ScopedEnv z("POOL_MAX_STREAMS_PER_CONNECTION", "8");
    Options o;
    ASSERT_EQ(parse_options({}, &o), std::nullopt);
    EXPECT_EQ(o.proxy.max_streams_per_connection, 8u);
  }
  Options f;
  ASSERT_EQ(parse_options({"--pool-max-streams-per-connection", "1"}, &f), std::nullopt);
  EXPECT_EQ(f.proxy.max_streams_per_connection, 1u);
  // No stream could use a pooled connection with 0; a u16 in ztunnel.
  for (const char* bad : {"0", "65536", "x"}) {
    Options o;
    auto err = parse_options({"--pool-max-streams-per-connection", bad}, &o);
    ASSERT_TRUE(err.has_value()) << bad;
    EXPECT_NE(err->find("pool-max-streams-per-connection"), std::string::npos) << *err;
  }
  ScopedEnv z("POOL_MAX_STREAMS_PER_CONNECTION", "0");
  Options e;
  auto err = parse_options({}, &e);
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->find("POOL_MAX_STREAMS_PER_CONNECTION"), std::string::npos) << *err;
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

TEST(OptionsTest, CaProviderAndKubernetesCsrSettings) {
  Options d;
  ASSERT_EQ(parse_options({}, &d), std::nullopt);
  EXPECT_EQ(d.ca_provider, CaProvider::kAuto);
  EXPECT_EQ(d.kube.api_server, "") << "in-cluster unless told";
  EXPECT_EQ(d.kube.api_ca, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt");
  EXPECT_EQ(d.kube.token_file, "/var/run/secrets/kubernetes.io/serviceaccount/token");
  EXPECT_EQ(d.kube.signer_name, "");
  EXPECT_EQ(d.kube.approval_timeout, std::chrono::seconds(60));
  for (auto [text, want] : {std::pair{"auto", CaProvider::kAuto},
                            {"istio", CaProvider::kIstio},
                            {"kubernetes", CaProvider::kKubernetes},
                            {"files", CaProvider::kFiles},
                            {"builtin", CaProvider::kBuiltin}}) {
    Options o;
    ASSERT_EQ(parse_options({"--ca-provider", text}, &o), std::nullopt) << text;
    EXPECT_EQ(o.ca_provider, want) << text;
    EXPECT_STREQ(ca_provider_name(want), text);
  }
  Options bad;
  auto err = parse_options({"--ca-provider", "citadel"}, &bad);
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->find("--ca-provider"), std::string::npos) << *err;
  EXPECT_NE(err->find("kubernetes"), std::string::npos) << *err;

  ScopedEnv provider("SOCKMESH_CA_PROVIDER", "kubernetes");
  Options k;
  ASSERT_EQ(parse_options({"--k8s-api-server", "https://10.96.0.1:443", "--k8s-api-ca", "/ca",
                           "--k8s-token-file", "/tok", "--k8s-signer-name", "example.com/mesh",
                           "--k8s-csr-timeout", "90s"},
                          &k),
            std::nullopt);
  EXPECT_EQ(k.ca_provider, CaProvider::kKubernetes);
  EXPECT_EQ(k.kube.api_server, "https://10.96.0.1:443");
  EXPECT_EQ(k.kube.api_ca, "/ca");
  EXPECT_EQ(k.kube.token_file, "/tok");
  EXPECT_EQ(k.kube.signer_name, "example.com/mesh");
  EXPECT_EQ(k.kube.approval_timeout, std::chrono::seconds(90));
  Options short_timeout;
  EXPECT_TRUE(parse_options({"--k8s-csr-timeout", "500ms"}, &short_timeout).has_value());
  EXPECT_NE(usage().find("--k8s-signer-name"), std::string::npos);
}

}  // namespace
}  // namespace sockmesh::app
