#include "identity/root_file.h"

#include "base/log.h"

namespace sockmesh::identity {

Result<RootBundle> read_root_bundle(const std::filesystem::path& path) {
  const std::string at = "CA root file " + path.string() + ": ";
  auto text = files::read(path);
  if (!text) return Error{at + text.error().message};
  if (!text->has_value()) return Error{at + "no such file"};
  auto certs = certificates_from_pem(**text);
  if (!certs) return Error{at + certs.error().message};
  if (auto why = check_trust_bundle(*certs, std::chrono::system_clock::now())) {
    return Error{at + *why};
  }
  return RootBundle{std::make_shared<X509List>(*std::move(certs)), **std::move(text)};
}

Result<WatchedRootFile> WatchedRootFile::open(std::filesystem::path path) {
  auto stamp = files::stamp(path);  // before the read: a change during it is seen next time
  auto bundle = read_root_bundle(path);
  if (!bundle) return bundle.error();
  return WatchedRootFile(std::move(path), *std::move(bundle), stamp);
}

WatchedRootFile::WatchedRootFile(std::filesystem::path path, RootBundle first,
                                 std::optional<files::Stamp> stamp)
    : path_(std::move(path)),
      first_pem_(std::move(first.pem)),
      roots_(std::move(first.roots)),
      stamp_(stamp) {}

WatchedRootFile::WatchedRootFile(WatchedRootFile&& other) noexcept
    : path_(std::move(other.path_)),
      first_pem_(std::move(other.first_pem_)),
      roots_(std::move(other.roots_)),
      stamp_(other.stamp_) {}

TrustRootsPtr WatchedRootFile::roots() const {
  std::lock_guard lock(mu_);
  return roots_;
}

std::optional<RootBundle> WatchedRootFile::reload(std::string_view scope, std::string_view what,
                                                  std::string_view users) {
  auto stamp = files::stamp(path_);
  {
    std::lock_guard lock(mu_);
    if (stamp == stamp_) return std::nullopt;
  }
  auto bundle = read_root_bundle(path_);
  if (!bundle) {
    SM_WARN(scope) << "keeping previous " << what << ": " << bundle.error().message;
    std::lock_guard lock(mu_);
    stamp_ = stamp;  // say it once per change of the file, not at every check
    return std::nullopt;
  }
  if (files::stamp(path_) != stamp) return std::nullopt;  // moved while read: next time
  SM_INFO(scope) << "reloaded " << what << " path=" << path_.string()
                 << " count=" << bundle->roots->size() << "; " << users;
  std::lock_guard lock(mu_);
  roots_ = bundle->roots;
  stamp_ = stamp;
  return *std::move(bundle);
}

}  // namespace sockmesh::identity
