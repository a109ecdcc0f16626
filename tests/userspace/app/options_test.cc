// The xDS settings and ztunnel's environment variables: a flag wins over SOCKMESH_<FLAG>, which
// wins over ztunnel's name for the same setting.
#include "app/options.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace sockmesh::app {
namespace {

class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~EnvVar() { unsetenv(name_); }

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
  EnvVar a("XDS_ADDRESS", "https://istiod.istio-system.svc:15012");
  EnvVar r("XDS_ROOT_CA", "/r.pem");
  EnvVar t("AUTH_TOKEN", "/t");
  EnvVar c("CLUSTER_ID", "c2");
  EnvVar n("NODE_NAME", "n1");
  EnvVar p("POD_NAME", "ztunnel-x");
  EnvVar ns("POD_NAMESPACE", "istio-system");
  EnvVar ip("INSTANCE_IP", "10.0.0.9");
  EnvVar l("LOCAL_XDS_PATH", "/local.yaml");
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
  EnvVar z("XDS_ADDRESS", "https://from-ztunnel-env:15012");
  {
    Options o;
    EnvVar s("SOCKMESH_XDS_ADDRESS", "https://from-sockmesh-env:15012");
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

}  // namespace
}  // namespace sockmesh::app
