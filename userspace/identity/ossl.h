#pragma once
// Owning handles for the OpenSSL objects this module passes around. OpenSSL's own reference
// counting is used for sharing (up_ref), so a handle can be copied into several owners without
// copying the certificate.
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

#include <memory>
#include <string>
#include <vector>

namespace sockmesh::identity {

struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
struct EvpPkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free_all(p); }
};
struct X509StackFree {
  void operator()(STACK_OF(X509) * p) const { sk_X509_pop_free(p, X509_free); }
};
struct X509StoreFree {
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
};
struct X509StoreCtxFree {
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
};

using X509Ptr = std::unique_ptr<X509, X509Free>;
using EvpPkeyPtr = std::unique_ptr<EVP_PKEY, EvpPkeyFree>;
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509StackPtr = std::unique_ptr<STACK_OF(X509), X509StackFree>;
using X509StorePtr = std::unique_ptr<X509_STORE, X509StoreFree>;
using X509StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, X509StoreCtxFree>;

// An ordered list of certificates (a chain without its leaf, or a set of trust roots).
using X509List = std::vector<X509Ptr>;

// A new owning handle to the same certificate (reference count + 1). Null in, null out.
inline X509Ptr share(X509* cert) {
  if (cert != nullptr) X509_up_ref(cert);
  return X509Ptr(cert);
}
inline EvpPkeyPtr share(EVP_PKEY* key) {
  if (key != nullptr) EVP_PKEY_up_ref(key);
  return EvpPkeyPtr(key);
}

// Shares every certificate of a list into a new list.
X509List share_all(const X509List& list);

// A STACK_OF(X509) holding shared references to the list, for OpenSSL calls that want one.
X509StackPtr to_stack(const X509List& list);

// Drains OpenSSL's thread-local error queue into one line ("what: reason; reason"). Call right
// after a failing OpenSSL call so that stale errors from elsewhere do not leak into the message.
std::string openssl_error(std::string_view what);

}  // namespace sockmesh::identity
