// The Kubernetes CSR issuer's parts that need no API server: the CertificateSigningRequest body,
// the in-cluster address, create()'s checks, an unreachable server and cancel(). The exchange with
// an API server is tested against a fake one in tests/integration/test_kube_csr.py.
#include "identity/kube_csr_issuer.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <nlohmann/json.hpp>

#include "identity/csr.h"
#include "test_util.h"

namespace sockmesh::identity {
namespace {

const SpiffeId kWeb = *SpiffeId::parse("spiffe://cluster.local/ns/default/sa/web");

std::string root_pem(testing::FakeClock& clock) {
  auto key = testing::make_p256_key();
  testing::LeafSpec spec;
  spec.is_ca = true;
  spec.organization = "kube-signer";
  spec.not_before = clock.now() - std::chrono::hours(1);
  spec.not_after = clock.now() + std::chrono::hours(48);
  X509Ptr cert = testing::make_cert(spec, key.get(), nullptr, key.get());
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert.get());
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  return pem;
}

TEST(KubeCsrIssuer, TheObjectCarriesSignerUsagesExpirationAndTheCsr) {
  auto req = make_certificate_request(kWeb);
  ASSERT_TRUE(req.ok());
  auto j = nlohmann::json::parse(csr_object_json("sockmesh-0123", req->csr_pem, "example.com/mesh",
                                                 kWeb, std::chrono::seconds(3600)));
  EXPECT_EQ(j["apiVersion"], "certificates.k8s.io/v1");
  EXPECT_EQ(j["kind"], "CertificateSigningRequest");
  EXPECT_EQ(j["metadata"]["name"], "sockmesh-0123");
  EXPECT_EQ(j["metadata"]["annotations"]["sockmesh.io/identity"], kWeb.to_string());
  EXPECT_EQ(j["spec"]["signerName"], "example.com/mesh");
  EXPECT_EQ(j["spec"]["expirationSeconds"], 3600);
  EXPECT_EQ(j["spec"]["usages"], nlohmann::json({"digital signature", "key encipherment",
                                                 "client auth", "server auth"}));
  // spec.request is the PEM CSR, base64 without line breaks (JSON's encoding of []byte).
  std::string b64 = j["spec"]["request"];
  EXPECT_EQ(b64.find('\n'), std::string::npos);
  std::string decoded(b64.size(), '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(decoded.data()),
                          reinterpret_cast<const unsigned char*>(b64.data()),
                          static_cast<int>(b64.size()));
  ASSERT_GT(n, 0);
  decoded.resize(static_cast<size_t>(n));
  EXPECT_EQ(decoded.substr(0, req->csr_pem.size()), req->csr_pem);
}

TEST(KubeCsrIssuer, InClusterAddress) {
  EXPECT_EQ(in_cluster_api_server(
                {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}}),
            "https://10.96.0.1:443");
  EXPECT_EQ(in_cluster_api_server(
                {{"KUBERNETES_SERVICE_HOST", "fd00::1"}, {"KUBERNETES_SERVICE_PORT", "6443"}}),
            "https://[fd00::1]:6443");
  EXPECT_EQ(in_cluster_api_server({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}}), "");
  EXPECT_EQ(in_cluster_api_server({}), "");
}

TEST(KubeCsrIssuer, CreateNamesWhatIsMissing) {
  testing::TempDir dir;
  testing::FakeClock clock;
  auto root = dir.path() / "root.pem";
  testing::write_file(root, root_pem(clock));
  KubeCsrOptions o;
  o.root_ca_file = root;
  o.signer_name = "example.com/mesh";
  auto no_server = KubeCsrIssuer::create(o);
  ASSERT_FALSE(no_server.ok());
  EXPECT_NE(no_server.error().message.find("KUBERNETES_SERVICE_HOST"), std::string::npos);
  o.api_server = "https://127.0.0.1:6443";
  o.signer_name = "";
  auto no_signer = KubeCsrIssuer::create(o);
  ASSERT_FALSE(no_signer.ok());
  EXPECT_NE(no_signer.error().message.find("--k8s-signer-name"), std::string::npos);
  o.signer_name = "example.com/mesh";
  o.root_ca_file = dir.path() / "missing.pem";
  auto no_root = KubeCsrIssuer::create(o);
  ASSERT_FALSE(no_root.ok());
  EXPECT_NE(no_root.error().message.find("missing.pem"), std::string::npos);
  o.root_ca_file = root;
  o.api_ca_file = dir.path() / "no-api-ca.crt";
  auto no_api_ca = KubeCsrIssuer::create(o);
  ASSERT_FALSE(no_api_ca.ok());
  EXPECT_NE(no_api_ca.error().message.find("no-api-ca.crt"), std::string::npos);
  o.api_ca_file.clear();
  auto ok = KubeCsrIssuer::create(o);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ((*ok)->kind(), "kubernetes-csr");
  EXPECT_EQ((*ok)->trust_roots()->size(), 1u);
}

TEST(KubeCsrIssuer, UnreachableServerAndCancel) {
  testing::TempDir dir;
  testing::FakeClock clock;
  auto root = dir.path() / "root.pem";
  testing::write_file(root, root_pem(clock));
  KubeCsrOptions o;
  o.root_ca_file = root;
  o.signer_name = "example.com/mesh";
  o.api_server = "http://127.0.0.1:1";  // nothing listens on port 1
  o.request_timeout = std::chrono::milliseconds(2000);
  int ok_count = 0, failed_count = 0;
  o.on_fetch = [&](bool ok) { ++(ok ? ok_count : failed_count); };
  auto issuer = KubeCsrIssuer::create(o);
  ASSERT_TRUE(issuer.ok()) << issuer.error().message;
  auto r = (*issuer)->issue(kWeb);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("creating CSR sockmesh-"), std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("http://127.0.0.1:1"), std::string::npos);
  EXPECT_EQ(failed_count, 1);
  (*issuer)->cancel();
  auto after = (*issuer)->issue(kWeb);
  ASSERT_FALSE(after.ok());
  EXPECT_NE(after.error().message.find("stopping"), std::string::npos) << after.error().message;
  EXPECT_EQ(ok_count, 0);
}

}  // namespace
}  // namespace sockmesh::identity
