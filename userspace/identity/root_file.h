#pragma once
// The CA root bundle of a remote issuer (Istio's CA, the Kubernetes CSR API): read and checked at
// start, then re-read whenever the file's stamp changes. New connections and new requests use
// the new roots; what already holds the old ones keeps them. A file that no longer parses, or
// holds no usable CA, is refused with one warning per change, and the previous roots stay.
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "identity/file_util.h"
#include "identity/issuer.h"
#include "identity/verify.h"

namespace sockmesh::identity {

struct RootBundle {
  TrustRootsPtr roots;
  std::string pem;  // the file's text, for clients that take PEM (gRPC's channel credentials)
};

// Reads and checks a root bundle; errors start with "CA root file <path>: ".
Result<RootBundle> read_root_bundle(const std::filesystem::path& path);

class WatchedRootFile {
 public:
  // Reads the file once; fails as read_root_bundle() does.
  static Result<WatchedRootFile> open(std::filesystem::path path);

  TrustRootsPtr roots() const;
  const std::string& first_pem() const { return first_pem_; }
  const std::filesystem::path& path() const { return path_; }

  // Re-reads the file if its stamp changed. Returns the new bundle when it replaced the old one;
  // nullopt when nothing changed or the new file was refused. The log lines name the roots as
  // `what` ("CA roots") and say who uses them from now on (`users`).
  std::optional<RootBundle> reload(std::string_view scope, std::string_view what,
                                   std::string_view users);

  WatchedRootFile(WatchedRootFile&& other) noexcept;

 private:
  WatchedRootFile(std::filesystem::path path, RootBundle first, std::optional<files::Stamp> stamp);

  std::filesystem::path path_;
  std::string first_pem_;
  mutable std::mutex mu_;
  TrustRootsPtr roots_;
  std::optional<files::Stamp> stamp_;
};

}  // namespace sockmesh::identity
