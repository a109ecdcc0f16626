#include "test_util.h"

#include <gtest/gtest.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace sockmesh::identity::testing {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::path(::testing::TempDir()) / "identity-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

FakeClock::FakeClock() {
  auto now = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
  ticks_ = TimePoint(now).time_since_epoch().count();
}

void write_file(const std::filesystem::path& path, std::string_view content) {
  std::filesystem::create_directories(path.parent_path());
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    if (!out) throw std::runtime_error("write failed: " + tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

EvpPkeyPtr make_p256_key() { return EvpPkeyPtr(EVP_EC_gen("P-256")); }

namespace {

void add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) throw std::runtime_error("bad extension " + value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

}  // namespace

X509Ptr make_cert(const LeafSpec& spec, EVP_PKEY* subject_key, X509* issuer, EVP_PKEY* issuer_key) {
  X509Ptr cert(X509_new());
  X509_set_version(cert.get(), X509_VERSION_3);
  unsigned char serial[12];
  RAND_bytes(serial, sizeof(serial));
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(spec.organization.c_str()), -1,
                             -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  ASN1_TIME_set(X509_getm_notBefore(cert.get()),
                std::chrono::system_clock::to_time_t(spec.not_before));
  ASN1_TIME_set(X509_getm_notAfter(cert.get()),
                std::chrono::system_clock::to_time_t(spec.not_after));
  X509_set_pubkey(cert.get(), subject_key);
  if (spec.is_ca) {
    add_ext(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE");
    add_ext(cert.get(), signer, NID_key_usage, "critical,keyCertSign");
    add_ext(cert.get(), signer, NID_subject_key_identifier, "hash");
  } else {
    add_ext(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_ext(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
    if (!spec.ext_key_usage.empty()) {
      add_ext(cert.get(), signer, NID_ext_key_usage, spec.ext_key_usage);
    }
  }
  add_ext(cert.get(), signer, NID_authority_key_identifier, "keyid");
  std::string san;
  for (const auto& u : spec.uris) san += (san.empty() ? "" : ",") + std::string("URI:") + u;
  for (const auto& d : spec.dns) san += (san.empty() ? "" : ",") + std::string("DNS:") + d;
  if (!san.empty()) add_ext(cert.get(), signer, NID_subject_alt_name, san);
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) <= 0) {
    throw std::runtime_error("signing test certificate failed");
  }
  return cert;
}

}  // namespace sockmesh::identity::testing
