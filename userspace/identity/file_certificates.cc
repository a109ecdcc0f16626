#include "identity/file_certificates.h"

#include "base/log.h"
#include "identity/verify.h"

namespace sockmesh::identity {
namespace {

constexpr std::string_view kScope = "identity";

Result<TrustRootsPtr> read_roots(const std::filesystem::path& path) {
  auto text = files::read(path);
  if (!text) return text.error();
  if (!text->has_value()) return Error{path.string() + ": no such file"};
  auto certs = certificates_from_pem(**text);
  if (!certs) return Error{path.string() + ": " + certs.error().message};
  if (auto why = check_trust_bundle(*certs, std::chrono::system_clock::now())) {
    return Error{path.string() + ": " + *why};
  }
  return TrustRootsPtr(std::make_shared<X509List>(*std::move(certs)));
}

bool same_files(const std::filesystem::path& a_chain, const std::optional<files::Stamp>& a_cs,
                const std::optional<files::Stamp>& a_ks, const std::filesystem::path& b_chain,
                const std::optional<files::Stamp>& b_cs, const std::optional<files::Stamp>& b_ks) {
  return a_chain == b_chain && a_cs && a_ks && a_cs == b_cs && a_ks == b_ks;
}

}  // namespace

FileCertificates::FileCertificates(std::filesystem::path dir, Clock clock, TrustRootsPtr roots,
                                   std::optional<files::Stamp> roots_stamp)
    : dir_(std::move(dir)),
      clock_(std::move(clock)),
      roots_(std::move(roots)),
      roots_stamp_(roots_stamp) {}

Result<std::shared_ptr<FileCertificates>> FileCertificates::create(std::filesystem::path dir,
                                                                   Clock clock) {
  if (dir.empty()) return Error{"certificate directory not set"};
  std::filesystem::path root_path = dir / kRootFile;
  auto stamp = files::stamp(root_path);
  auto roots = read_roots(root_path);
  if (!roots) return roots.error();
  SM_INFO(kScope) << "loaded mounted trust roots path=" << root_path.string()
                  << " count=" << (*roots)->size();
  return std::shared_ptr<FileCertificates>(
      new FileCertificates(std::move(dir), std::move(clock), *std::move(roots), stamp));
}

FileCertificates::Source FileCertificates::locate(const SpiffeId& id) const {
  Source s;
  std::filesystem::path per_id = dir_ / id.namespace_name / id.service_account;
  s.chain = per_id / kChainFile;
  s.key = per_id / kKeyFile;
  s.chain_stamp = files::stamp(s.chain);
  if (!s.chain_stamp) {
    auto flat = files::stamp(dir_ / kChainFile);
    if (flat) {
      s.chain = dir_ / kChainFile;
      s.key = dir_ / kKeyFile;
      s.chain_stamp = flat;
    }
  }
  s.key_stamp = files::stamp(s.key);
  return s;
}

Result<CertifiedKeyPtr> FileCertificates::issue(const SpiffeId& id) {
  const std::string name = id.to_string();
  // A writer replacing both files is not atomic as a pair; re-stat after reading and try again
  // if they moved underneath us, so that a rotation in progress rarely surfaces as an error.
  for (int attempt = 0; attempt < 3; ++attempt) {
    Source src = locate(id);
    if (!src.chain_stamp) {
      return Error{"no certificate for " + name + ": neither " + src.chain.string() + " nor " +
                   (dir_ / kChainFile).string() + " exists"};
    }
    if (!src.key_stamp) return Error{"no private key for " + name + ": " + src.key.string()};
    {
      std::lock_guard lock(mu_);
      auto it = loaded_.find(name);
      if (it != loaded_.end() &&
          same_files(it->second.source.chain, it->second.source.chain_stamp,
                     it->second.source.key_stamp, src.chain, src.chain_stamp, src.key_stamp)) {
        return it->second.key;
      }
    }

    auto chain_text = files::read(src.chain);
    if (!chain_text) return chain_text.error();
    auto key_text = files::read(src.key);
    if (!key_text) return key_text.error();
    Source after = locate(id);
    if (!same_files(src.chain, src.chain_stamp, src.key_stamp, after.chain, after.chain_stamp,
                    after.key_stamp)) {
      continue;
    }
    if (!chain_text->has_value() || !key_text->has_value()) continue;

    auto key = CertifiedKey::from_pem(**chain_text, **key_text);
    if (!key) {
      return Error{src.chain.string() + " + " + src.key.string() + ": " + key.error().message};
    }
    const CertifiedKeyPtr& ck = *key;
    if (ck->identity() != name) {
      return Error{src.chain.string() + " is for " + ck->identity() + ", not " + name};
    }
    TimePoint now = now_from(clock_);
    if (now >= ck->not_after()) {
      return Error{src.chain.string() + " expired at " + format_utc(ck->not_after())};
    }
    {
      std::lock_guard lock(mu_);
      loaded_[name] = Loaded{src, ck};
    }
    SM_INFO(kScope) << "loaded mounted certificate identity=" << name
                    << " path=" << src.chain.string() << " serial=" << ck->serial()
                    << " not_after=" << format_utc(ck->not_after());
    return ck;
  }
  return Error{"certificate files for " + name + " kept changing while being read"};
}

TrustRootsPtr FileCertificates::trust_roots() const {
  std::lock_guard lock(mu_);
  return roots_;
}

void FileCertificates::refresh() {
  std::filesystem::path path = dir_ / kRootFile;
  auto stamp = files::stamp(path);
  {
    std::lock_guard lock(mu_);
    // The file in use, or the bad one already reported: nothing to read or say again.
    if (stamp == roots_stamp_ || (stamp && stamp == rejected_roots_stamp_)) return;
  }
  auto roots = read_roots(path);
  if (!roots) {
    // Logged once per change of the file: the next refresh finds the same stamp and stays quiet.
    SM_WARN(kScope) << "keeping previous trust roots: " << roots.error().message;
    std::lock_guard lock(mu_);
    rejected_roots_stamp_ = stamp;
    return;
  }
  // Re-stat: if the file moved during the read we may hold a mix; the next refresh retries.
  if (files::stamp(path) != stamp) return;
  SM_INFO(kScope) << "reloaded mounted trust roots path=" << path.string()
                  << " count=" << (*roots)->size();
  std::lock_guard lock(mu_);
  roots_ = *std::move(roots);
  roots_stamp_ = stamp;
}

bool FileCertificates::superseded(const CertifiedKey& key) const {
  auto id = key.spiffe_id();
  Source now = locate(id);
  std::lock_guard lock(mu_);
  auto it = loaded_.find(key.identity());
  if (it == loaded_.end()) return false;  // not one of ours
  if (it->second.key.get() != &key) return true;
  return !same_files(it->second.source.chain, it->second.source.chain_stamp,
                     it->second.source.key_stamp, now.chain, now.chain_stamp, now.key_stamp);
}

}  // namespace sockmesh::identity
