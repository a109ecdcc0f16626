#include "identity/verify.h"

#include <openssl/err.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

namespace sockmesh::identity {
namespace {

std::string describe(X509* cert, int depth) {
  if (depth == 0) return "leaf certificate";
  std::string s = "CA certificate at depth " + std::to_string(depth);
  if (cert != nullptr) s += " (" + subject_string(cert) + ")";
  return s;
}

std::string issuer_string(X509* cert) {
  if (cert == nullptr) return "?";
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio) return "?";
  X509_NAME_print_ex(bio.get(), X509_get_issuer_name(cert), 0, XN_FLAG_RFC2253);
  char* data = nullptr;
  long len = BIO_get_mem_data(bio.get(), &data);
  return len > 0 ? std::string(data, static_cast<size_t>(len)) : std::string("<empty>");
}

std::string time_of(const ASN1_TIME* t) {
  auto tp = to_time_point(t);
  return tp ? format_utc(*tp) : std::string("?");
}

VerifyFailure classify(X509_STORE_CTX* ctx, TimePoint now) {
  int err = X509_STORE_CTX_get_error(ctx);
  int depth = X509_STORE_CTX_get_error_depth(ctx);
  X509* cert = X509_STORE_CTX_get_current_cert(ctx);
  std::string what = describe(cert, depth);
  switch (err) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
      return {VerifyError::kExpired, what + " expired at " +
                                         time_of(cert ? X509_get0_notAfter(cert) : nullptr) +
                                         " (now " + format_utc(now) + ")"};
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return {VerifyError::kNotYetValid, what + " is not valid before " +
                                             time_of(cert ? X509_get0_notBefore(cert) : nullptr) +
                                             " (now " + format_utc(now) + "); check clocks"};
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_UNTRUSTED:
    case X509_V_ERR_CERT_REJECTED:
      return {VerifyError::kUntrustedIssuer,
              what + " (issuer " + issuer_string(cert) +
                  ") does not chain to a trusted root: " + X509_verify_cert_error_string(err)};
    default:
      return {VerifyError::kInvalidChain,
              what + " rejected: " + X509_verify_cert_error_string(err)};
  }
}

}  // namespace

std::string_view verify_error_name(VerifyError e) {
  switch (e) {
    case VerifyError::kMalformed:
      return "malformed";
    case VerifyError::kNoTrustRoots:
      return "no_trust_roots";
    case VerifyError::kUntrustedIssuer:
      return "untrusted_issuer";
    case VerifyError::kExpired:
      return "expired";
    case VerifyError::kNotYetValid:
      return "not_yet_valid";
    case VerifyError::kInvalidChain:
      return "invalid_chain";
    case VerifyError::kNoSpiffeId:
      return "no_spiffe_id";
    case VerifyError::kInvalidSpiffeId:
      return "invalid_spiffe_id";
    case VerifyError::kWrongTrustDomain:
      return "wrong_trust_domain";
  }
  return "unknown";
}

VerifyStatus verify_chain(X509* leaf, STACK_OF(X509) * chain, const X509List& roots, TimePoint now,
                          PeerRole role) {
  if (leaf == nullptr) return VerifyFailure{VerifyError::kMalformed, "peer sent no certificate"};
  if (roots.empty()) {
    return VerifyFailure{VerifyError::kNoTrustRoots, "no trust roots configured"};
  }
  ERR_clear_error();
  // A fresh store per call: roots change at run time (rotation, file reload) and a store is
  // cheap next to the signature checks; sharing one would need locking around replacement.
  X509StorePtr store(X509_STORE_new());
  X509StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (!store || !ctx) return VerifyFailure{VerifyError::kMalformed, "out of memory"};
  for (const auto& root : roots) {
    if (X509_STORE_add_cert(store.get(), root.get()) != 1) {
      return VerifyFailure{VerifyError::kMalformed, openssl_error("adding trust root")};
    }
  }
  if (X509_STORE_CTX_init(ctx.get(), store.get(), leaf, chain) != 1) {
    return VerifyFailure{VerifyError::kMalformed, openssl_error("initialising verification")};
  }
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx.get());
  X509_VERIFY_PARAM_set_time(param, std::chrono::system_clock::to_time_t(now));
  if (role != PeerRole::kAny) {
    int purpose = role == PeerRole::kServer ? X509_PURPOSE_SSL_SERVER : X509_PURPOSE_SSL_CLIENT;
    if (X509_STORE_CTX_set_purpose(ctx.get(), purpose) != 1) {
      return VerifyFailure{VerifyError::kMalformed, openssl_error("setting purpose")};
    }
  }
  int rc = X509_verify_cert(ctx.get());
  if (rc == 1) {
    ERR_clear_error();
    return {};
  }
  if (rc < 0) {
    return VerifyFailure{VerifyError::kMalformed, openssl_error("certificate verification")};
  }
  ERR_clear_error();
  return classify(ctx.get(), now);
}

Result<SpiffeId, VerifyFailure> check_trust_domain(X509* leaf, std::string_view trust_domain) {
  auto id = spiffe_id_of(leaf);
  if (!id) {
    VerifyError code = VerifyError::kInvalidSpiffeId;
    if (id.error().code == SanError::kNoUriSan || id.error().code == SanError::kNotSpiffe) {
      code = VerifyError::kNoSpiffeId;
    }
    return VerifyFailure{code, "peer certificate: " + id.error().message};
  }
  if (id->trust_domain != trust_domain) {
    return VerifyFailure{VerifyError::kWrongTrustDomain, "peer identity " + id->to_string() +
                                                             " is in trust domain \"" +
                                                             id->trust_domain + "\", expected \"" +
                                                             std::string(trust_domain) + "\""};
  }
  return *std::move(id);
}

Result<SpiffeId, VerifyFailure> verify_peer(X509* leaf, STACK_OF(X509) * chain,
                                            const X509List& roots, std::string_view trust_domain,
                                            TimePoint now, PeerRole role) {
  auto st = verify_chain(leaf, chain, roots, now, role);
  if (!st) return st.error();
  return check_trust_domain(leaf, trust_domain);
}

std::optional<std::string> check_trust_bundle(const X509List& roots, TimePoint now) {
  if (roots.empty()) return "no certificates in the bundle";
  time_t t = std::chrono::system_clock::to_time_t(now);
  for (const auto& root : roots) {
    X509* c = root.get();
    if (X509_check_ca(c) < 1) return "certificate " + subject_string(c) + " is not a CA";
    if (X509_cmp_time(X509_get0_notAfter(c), &t) <= 0) {
      return "certificate " + subject_string(c) + " has expired";
    }
  }
  return std::nullopt;
}

}  // namespace sockmesh::identity
