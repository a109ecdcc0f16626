#include "identity/csr.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "identity/verify.h"

namespace sockmesh::identity {
namespace {

struct ReqFree {
  void operator()(X509_REQ* p) const { X509_REQ_free(p); }
};
struct ExtsFree {
  void operator()(STACK_OF(X509_EXTENSION) * p) const {
    sk_X509_EXTENSION_pop_free(p, X509_EXTENSION_free);
  }
};
bool self_signed(X509* cert) { return X509_check_issued(cert, cert) == X509_V_OK; }

}  // namespace

namespace {
struct NamesFree {
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
};
}  // namespace

// The SAN is built as a structure, not from a config string, so nothing in the ID can be read
// as extension syntax.
X509_EXTENSION* uri_san_extension(const std::string& uri) {
  std::unique_ptr<GENERAL_NAMES, NamesFree> names(sk_GENERAL_NAME_new_null());
  GENERAL_NAME* name = GENERAL_NAME_new();
  ASN1_IA5STRING* ia5 = ASN1_IA5STRING_new();
  if (!names || name == nullptr || ia5 == nullptr ||
      ASN1_STRING_set(ia5, uri.data(), static_cast<int>(uri.size())) != 1) {
    GENERAL_NAME_free(name);
    ASN1_IA5STRING_free(ia5);
    return nullptr;
  }
  GENERAL_NAME_set0_value(name, GEN_URI, ia5);
  if (sk_GENERAL_NAME_push(names.get(), name) <= 0) {
    GENERAL_NAME_free(name);
    return nullptr;
  }
  // Critical because the subject is empty (RFC 5280 4.2.1.6).
  return X509V3_EXT_i2d(NID_subject_alt_name, 1, names.get());
}

Result<CertificateRequest> make_certificate_request(const SpiffeId& id) {
  ERR_clear_error();
  EvpPkeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return Error{openssl_error("generating ECDSA P-256 key")};
  std::unique_ptr<X509_REQ, ReqFree> req(X509_REQ_new());
  if (!req || X509_REQ_set_version(req.get(), X509_REQ_VERSION_1) != 1 ||
      X509_REQ_set_pubkey(req.get(), key.get()) != 1) {
    return Error{openssl_error("building CSR")};
  }
  std::unique_ptr<STACK_OF(X509_EXTENSION), ExtsFree> exts(sk_X509_EXTENSION_new_null());
  X509_EXTENSION* san = uri_san_extension(id.to_string());
  if (!exts || san == nullptr || sk_X509_EXTENSION_push(exts.get(), san) <= 0) {
    X509_EXTENSION_free(san);
    return Error{openssl_error("building CSR subjectAltName")};
  }
  if (X509_REQ_add_extensions(req.get(), exts.get()) != 1 ||
      X509_REQ_sign(req.get(), key.get(), EVP_sha256()) <= 0) {
    return Error{openssl_error("signing CSR")};
  }
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509_REQ(bio.get(), req.get()) != 1) {
    return Error{openssl_error("encoding CSR")};
  }
  char* data = nullptr;
  long len = BIO_get_mem_data(bio.get(), &data);
  return CertificateRequest{std::move(key), std::string(data, static_cast<size_t>(len))};
}

Result<CertifiedKeyPtr> accept_issued_chain(const std::vector<std::string>& chain_pem,
                                            EvpPkeyPtr key, const SpiffeId& requested,
                                            const X509List& roots, TimePoint now) {
  const std::string asked = requested.to_string();
  if (chain_pem.empty()) return Error{"the CA returned an empty certificate chain for " + asked};
  X509List certs;
  for (size_t i = 0; i < chain_pem.size(); ++i) {
    auto parsed = certificates_from_pem(chain_pem[i]);
    if (!parsed) {
      return Error{"the CA's chain for " + asked + ", element " + std::to_string(i) + ": " +
                   parsed.error().message};
    }
    for (auto& c : *parsed) certs.push_back(std::move(c));
  }
  X509Ptr leaf = std::move(certs.front());
  X509List rest;
  for (size_t i = 1; i < certs.size(); ++i) rest.push_back(std::move(certs[i]));
  // The root travels last; it is trusted from the configured bundle, never from the response.
  if (!rest.empty() && self_signed(rest.back().get())) rest.pop_back();

  X509StackPtr untrusted = to_stack(rest);
  X509* leaf_ptr = leaf.get();
  auto ck = CertifiedKey::create(std::move(leaf), share_all(rest), std::move(key));
  if (!ck) return Error{"the CA's certificate for " + asked + ": " + ck.error().message};
  if ((*ck)->identity() != asked) {
    return Error{"the CA issued a certificate for " + (*ck)->identity() + ", not for " + asked};
  }
  if (auto ok = verify_chain(leaf_ptr, untrusted.get(), roots, now); !ok) {
    return Error{"the CA's certificate for " + asked +
                 " does not chain to the configured root: " + ok.error().message};
  }
  return ck;
}

}  // namespace sockmesh::identity
