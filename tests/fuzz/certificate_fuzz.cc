// What the proxy reads from certificates and SPIFFE IDs (identity/): a peer's leaf as DER (what a
// TLS handshake hands over), PEM files of certificates and keys (file certificates, the CA's
// state), and SPIFFE ID text. The first byte picks the format. Every reader gives a value or an
// error; a SPIFFE ID that parses prints back to the same ID.
#include <openssl/x509.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "identity/certificate.h"
#include "identity/spiffe.h"
#include "identity/verify.h"

namespace {

using namespace sockmesh::identity;

void inspect(X509* cert) {
  auto id = spiffe_id_of(cert);
  if (id) {
    auto again = SpiffeId::parse(id.value().to_string());
    FUZZ_CHECK(again && *again == id.value());
  } else {
    FUZZ_CHECK(!id.error().message.empty());
  }
  (void)to_time_point(X509_get0_notBefore(cert));
  (void)to_time_point(X509_get0_notAfter(cert));
  (void)serial_hex(cert);
  (void)fingerprint_sha256(cert);
  (void)subject_string(cert);
  (void)to_pem(cert);
  (void)check_trust_domain(cert, "cluster.local");
  // The certificate as its own root: self-signed leaves, CA flags, validity and key usages all
  // go through the checks a peer's chain goes through.
  X509List roots;
  roots.push_back(share(cert));
  auto verified = verify_peer(cert, nullptr, roots, "cluster.local",
                              std::chrono::system_clock::now(), PeerRole::kClient);
  if (!verified) FUZZ_CHECK(!verified.error().message.empty());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  sockmesh::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t* body = data + 1;
  std::string_view text(reinterpret_cast<const char*>(body), size - 1);
  switch (data[0] % 4) {
    case 0: {  // a peer's leaf, DER
      const uint8_t* p = body;
      X509Ptr cert(d2i_X509(nullptr, &p, static_cast<long>(size - 1)));
      if (cert) inspect(cert.get());
      break;
    }
    case 1: {  // a certificate chain file
      auto certs = certificates_from_pem(text);
      if (certs) {
        for (const auto& c : certs.value()) inspect(c.get());
        (void)to_pem(certs.value());
      }
      break;
    }
    case 2: {  // a chain and its key in one file (cert-chain.pem + key.pem)
      auto key = CertifiedKey::from_pem(text, text);
      if (key) {
        FUZZ_CHECK(!key.value()->identity().empty());
        (void)key.value()->cert_chain_pem();
      }
      (void)private_key_from_pem(text);
      break;
    }
    default: {  // SPIFFE ID text
      auto id = SpiffeId::parse(text);
      if (id) {
        auto again = SpiffeId::parse(id->to_string());
        FUZZ_CHECK(again && *again == *id);
        auto made = SpiffeId::make(id->trust_domain, id->namespace_name, id->service_account);
        FUZZ_CHECK(made && *made == *id);
        FUZZ_CHECK(valid_trust_domain(id->trust_domain));
      }
      break;
    }
  }
  return 0;
}
