#pragma once
// Shared fixtures for the identity tests: scratch directories, a movable clock and a way to
// mint certificates the production code would never produce (no SAN, two SANs, other EKUs).
#include <openssl/x509.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "identity/certificate.h"
#include "identity/ossl.h"

namespace sockmesh::identity::testing {

// A fresh directory under the test temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Starts at the real current time (truncated to seconds, as certificates store it) and moves
// only when told to.
class FakeClock {
 public:
  FakeClock();
  TimePoint now() const { return TimePoint(TimePoint::duration(ticks_.load())); }
  void advance(std::chrono::nanoseconds d) { ticks_ += TimePoint::duration(d).count(); }
  void set(TimePoint t) { ticks_ = t.time_since_epoch().count(); }
  Clock fn() {
    return [this] { return now(); };
  }

 private:
  std::atomic<TimePoint::duration::rep> ticks_;
};

// Writes via a temporary file and rename, as Kubernetes and careful tools update files.
void write_file(const std::filesystem::path& path, std::string_view content);
std::string read_file(const std::filesystem::path& path);

EvpPkeyPtr make_p256_key();

struct LeafSpec {
  std::vector<std::string> uris;  // one URI SAN each; empty means no SAN extension at all
  std::vector<std::string> dns;   // DNS SANs, to show they are ignored
  TimePoint not_before;
  TimePoint not_after;
  std::string ext_key_usage = "serverAuth,clientAuth";
  bool is_ca = false;
  std::string organization = "test";  // subject O=; must differ from the issuer's
};

// A certificate for `subject_key` signed by `issuer_key`; `issuer` null means self-signed.
X509Ptr make_cert(const LeafSpec& spec, EVP_PKEY* subject_key, X509* issuer, EVP_PKEY* issuer_key);

}  // namespace sockmesh::identity::testing
