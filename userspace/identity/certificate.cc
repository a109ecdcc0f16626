#include "identity/certificate.h"

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <cctype>
#include <cstdio>
#include <ctime>

namespace sockmesh::identity {
namespace {

BioPtr memory_bio(std::string_view data) {
  return BioPtr(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

std::string bio_contents(BIO* bio) {
  char* data = nullptr;
  long len = BIO_get_mem_data(bio, &data);
  return len > 0 ? std::string(data, static_cast<size_t>(len)) : std::string();
}

// Refuses to prompt for a passphrase: a daemon reading a key must never block on a terminal.
int no_passphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*u*/) { return 0; }

std::string hex(const unsigned char* data, size_t len) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (size_t i = 0; i < len; ++i) {
    out.push_back(kDigits[data[i] >> 4]);
    out.push_back(kDigits[data[i] & 0xf]);
  }
  return out;
}

}  // namespace

// ---- helpers from ossl.h ----

X509List share_all(const X509List& list) {
  X509List out;
  out.reserve(list.size());
  for (const auto& c : list) out.push_back(share(c.get()));
  return out;
}

X509StackPtr to_stack(const X509List& list) {
  X509StackPtr stack(sk_X509_new_null());
  if (!stack) return stack;
  for (const auto& c : list) {
    X509Ptr ref = share(c.get());
    if (sk_X509_push(stack.get(), ref.get()) <= 0) return X509StackPtr();
    static_cast<void>(ref.release());  // the stack owns it now
  }
  return stack;
}

std::string openssl_error(std::string_view what) {
  std::string out(what);
  bool first = true;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    out.append(first ? ": " : "; ").append(buf);
    first = false;
  }
  return out;
}

// ---- CertifiedKey ----

CertifiedKey::CertifiedKey(X509Ptr leaf, X509List chain, EvpPkeyPtr key, SpiffeId id,
                           TimePoint not_before, TimePoint not_after, std::string serial)
    : leaf_(std::move(leaf)),
      chain_(std::move(chain)),
      key_(std::move(key)),
      spiffe_id_(std::move(id)),
      identity_(spiffe_id_.to_string()),
      not_before_(not_before),
      not_after_(not_after),
      serial_(std::move(serial)) {}

Result<CertifiedKeyPtr> CertifiedKey::create(X509Ptr leaf, X509List chain, EvpPkeyPtr key) {
  if (!leaf) return Error{"no leaf certificate"};
  if (!key) return Error{"no private key"};
  for (const auto& c : chain) {
    if (!c) return Error{"null certificate in chain"};
  }
  ERR_clear_error();
  if (X509_check_private_key(leaf.get(), key.get()) != 1) {
    return Error{openssl_error("private key does not match the leaf certificate")};
  }
  auto id = spiffe_id_of(leaf.get());
  if (!id) return Error{"leaf certificate has no workload identity: " + id.error().message};
  auto not_before = to_time_point(X509_get0_notBefore(leaf.get()));
  auto not_after = to_time_point(X509_get0_notAfter(leaf.get()));
  if (!not_before || !not_after) return Error{"leaf certificate has an unreadable validity period"};
  if (*not_after <= *not_before) return Error{"leaf certificate's validity period is empty"};
  std::string serial = serial_hex(leaf.get());
  return CertifiedKeyPtr(new CertifiedKey(std::move(leaf), std::move(chain), std::move(key),
                                          *std::move(id), *not_before, *not_after,
                                          std::move(serial)));
}

Result<CertifiedKeyPtr> CertifiedKey::from_pem(std::string_view cert_chain_pem,
                                               std::string_view key_pem) {
  auto certs = certificates_from_pem(cert_chain_pem);
  if (!certs) return Error{"certificate chain: " + certs.error().message};
  auto key = private_key_from_pem(key_pem);
  if (!key) return Error{"private key: " + key.error().message};
  X509List& list = certs.value();
  X509Ptr leaf = std::move(list.front());
  list.erase(list.begin());
  return create(std::move(leaf), std::move(list), std::move(key).value());
}

TimePoint CertifiedKey::refresh_at(double fraction) const {
  auto lifetime = not_after_ - not_before_;
  return not_before_ + std::chrono::duration_cast<TimePoint::duration>(lifetime * fraction);
}

std::string CertifiedKey::cert_chain_pem() const {
  std::string out = to_pem(leaf_.get());
  out += to_pem(chain_);
  return out;
}

std::string CertifiedKey::private_key_pem() const { return private_key_to_pem(key_.get()); }

// ---- PEM ----

Result<X509List> certificates_from_pem(std::string_view pem) {
  BioPtr bio = memory_bio(pem);
  if (!bio) return Error{"out of memory"};
  X509List out;
  ERR_clear_error();
  while (true) {
    X509* cert = PEM_read_bio_X509(bio.get(), nullptr, no_passphrase, nullptr);
    if (cert == nullptr) break;
    out.emplace_back(cert);
  }
  // Running out of input shows up as "no start line"; any other error is a damaged block.
  unsigned long err = ERR_peek_last_error();
  if (err != 0 &&
      !(ERR_GET_LIB(err) == ERR_LIB_PEM && ERR_GET_REASON(err) == PEM_R_NO_START_LINE)) {
    return Error{openssl_error("malformed PEM certificate")};
  }
  ERR_clear_error();
  if (out.empty()) return Error{"no PEM certificate found"};
  return out;
}

Result<EvpPkeyPtr> private_key_from_pem(std::string_view pem) {
  BioPtr bio = memory_bio(pem);
  if (!bio) return Error{"out of memory"};
  ERR_clear_error();
  EvpPkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
  if (!key) return Error{openssl_error("no usable PEM private key (encrypted keys unsupported)")};
  return key;
}

std::string to_pem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || cert == nullptr || PEM_write_bio_X509(bio.get(), cert) != 1) return {};
  return bio_contents(bio.get());
}

std::string to_pem(const X509List& certs) {
  std::string out;
  for (const auto& c : certs) out += to_pem(c.get());
  return out;
}

std::string private_key_to_pem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || key == nullptr ||
      PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return {};
  }
  return bio_contents(bio.get());
}

// ---- small certificate accessors ----

std::optional<TimePoint> to_time_point(const ASN1_TIME* t) {
  struct tm tm {};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) return std::nullopt;
  time_t secs = timegm(&tm);
  return std::chrono::system_clock::from_time_t(secs);
}

std::string format_utc(TimePoint t) {
  time_t secs = std::chrono::system_clock::to_time_t(t);
  struct tm tm {};
  gmtime_r(&secs, &tm);
  char buf[32];
  size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return std::string(buf, n);
}

std::string serial_hex(X509* cert) {
  if (cert == nullptr) return {};
  const ASN1_INTEGER* serial = X509_get0_serialNumber(cert);
  std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(ASN1_INTEGER_to_BN(serial, nullptr), BN_free);
  if (!bn) return {};
  std::unique_ptr<char, void (*)(char*)> text(BN_bn2hex(bn.get()),
                                              [](char* p) { OPENSSL_free(p); });
  if (!text) return {};
  std::string out(text.get());
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string fingerprint_sha256(X509* cert) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (cert == nullptr || X509_digest(cert, EVP_sha256(), md, &len) != 1) return {};
  return hex(md, len);
}

std::string subject_string(X509* cert) {
  if (cert == nullptr) return {};
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio) return {};
  X509_NAME_print_ex(bio.get(), X509_get_subject_name(cert), 0, XN_FLAG_RFC2253);
  return bio_contents(bio.get());
}

}  // namespace sockmesh::identity
