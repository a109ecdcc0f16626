#include "identity/spiffe.h"

#include <openssl/x509v3.h>

#include <memory>
#include <vector>

namespace sockmesh::identity {
namespace {

constexpr std::string_view kScheme = "spiffe://";
constexpr size_t kMaxIdLength = 2048;
constexpr size_t kMaxTrustDomainLength = 255;

bool trust_domain_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
}

bool path_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

// "." and ".." are excluded because a peer could otherwise present an ID that different
// normalisers read as different identities.
bool valid_segment(std::string_view s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s) {
    if (!path_char(c)) return false;
  }
  return true;
}

struct GeneralNamesFree {
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
};

}  // namespace

bool valid_trust_domain(std::string_view td) {
  if (td.empty() || td.size() > kMaxTrustDomainLength) return false;
  for (char c : td) {
    if (!trust_domain_char(c)) return false;
  }
  return true;
}

std::optional<SpiffeId> SpiffeId::make(std::string_view trust_domain, std::string_view ns,
                                       std::string_view sa) {
  if (!valid_trust_domain(trust_domain) || !valid_segment(ns) || !valid_segment(sa)) {
    return std::nullopt;
  }
  SpiffeId id{std::string(trust_domain), std::string(ns), std::string(sa)};
  if (id.to_string().size() > kMaxIdLength) return std::nullopt;
  return id;
}

std::optional<SpiffeId> SpiffeId::parse(std::string_view text) {
  // The scheme is compared case-sensitively: the spec (and go-spiffe, which Istio uses) only
  // accepts the lowercase form, and accepting "SPIFFE://" would create two spellings of one ID.
  if (text.size() > kMaxIdLength || !text.starts_with(kScheme)) return std::nullopt;
  std::string_view rest = text.substr(kScheme.size());
  size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  std::string_view td = rest.substr(0, slash);
  rest.remove_prefix(slash + 1);

  std::vector<std::string_view> segments;
  while (true) {
    size_t next = rest.find('/');
    segments.push_back(rest.substr(0, next));
    if (next == std::string_view::npos) break;
    rest.remove_prefix(next + 1);
  }
  if (segments.size() != 4 || segments[0] != "ns" || segments[2] != "sa") return std::nullopt;
  return make(td, segments[1], segments[3]);
}

std::string SpiffeId::to_string() const {
  std::string out;
  out.reserve(kScheme.size() + trust_domain.size() + namespace_name.size() +
              service_account.size() + 8);
  out.append(kScheme).append(trust_domain).append("/ns/").append(namespace_name);
  out.append("/sa/").append(service_account);
  return out;
}

Result<SpiffeId, SanFailure> spiffe_id_of(X509* cert) {
  if (cert == nullptr) return SanFailure{SanError::kNoUriSan, "no certificate"};
  int crit = 0;
  std::unique_ptr<GENERAL_NAMES, GeneralNamesFree> names(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, &crit, nullptr)));
  if (!names) {
    // crit: -1 absent, -2 the extension occurs more than once, otherwise it failed to decode.
    if (crit == -2) {
      return SanFailure{SanError::kMultipleUriSans,
                        "certificate has more than one subjectAltName extension"};
    }
    if (crit == -1) {
      return SanFailure{SanError::kNoUriSan, "certificate has no subjectAltName extension"};
    }
    return SanFailure{SanError::kNoUriSan, "certificate's subjectAltName extension is malformed"};
  }

  int uri_count = 0;
  std::string_view uri;
  for (int i = 0; i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    if (name->type != GEN_URI) continue;
    ++uri_count;
    const ASN1_IA5STRING* s = name->d.uniformResourceIdentifier;
    uri = std::string_view(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                           static_cast<size_t>(ASN1_STRING_length(s)));
  }
  if (uri_count == 0) {
    return SanFailure{SanError::kNoUriSan, "certificate has no URI subjectAltName (no SPIFFE ID)"};
  }
  if (uri_count > 1) {
    return SanFailure{SanError::kMultipleUriSans,
                      "certificate has " + std::to_string(uri_count) +
                          " URI subjectAltNames; an X.509-SVID must have exactly one"};
  }
  // The URI comes from an untrusted peer and ends up in logs: bound it and mask control bytes.
  std::string shown(uri.substr(0, 256));
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  if (!uri.starts_with(kScheme)) {
    return SanFailure{SanError::kNotSpiffe,
                      "URI subjectAltName \"" + shown + "\" is not spiffe://"};
  }
  auto id = SpiffeId::parse(uri);
  if (!id) {
    return SanFailure{SanError::kMalformedSpiffeId,
                      "URI subjectAltName \"" + shown +
                          "\" is not a valid spiffe://<trust-domain>/ns/<ns>/sa/<sa> ID"};
  }
  return *std::move(id);
}

}  // namespace sockmesh::identity

size_t std::hash<sockmesh::identity::SpiffeId>::operator()(
    const sockmesh::identity::SpiffeId& id) const noexcept {
  std::hash<std::string> h;
  size_t v = h(id.trust_domain);
  v = v * 1000003u ^ h(id.namespace_name);
  v = v * 1000003u ^ h(id.service_account);
  return v;
}
