#pragma once
// Per-identity certificates for the proxy's workloads, issued on first use and renewed at
// half-life. Handshakes call get(); a timer (or the optional background thread) calls
// renew_due() so that renewal normally happens off the handshake path.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "identity/certificate.h"
#include "identity/issuer.h"

namespace sockmesh::identity {

struct CertificateCacheOptions {
  Clock clock;
  // Renew once this fraction of the lifetime has passed; 0.5 = half-life, as Istio does.
  double renew_fraction = 0.5;
  // After a failed issuance nobody asks the issuer again for this long, doubling per consecutive
  // failure up to max_retry: a broken CA must not be hit by every handshake.
  std::chrono::milliseconds min_retry = std::chrono::seconds(1);
  std::chrono::milliseconds max_retry = std::chrono::seconds(60);
  // For issuers that wait on the network (a remote CA): get()/lookup() never call the issuer and
  // never wait; they return what is there and leave issuing and renewing to the background
  // thread, which they wake. An identity without a certificate yet gets an error until the
  // first one arrives (prefetch() asks early). Off: first use issues on the caller's thread.
  bool issue_in_background = false;
  // How many identities renew_due() issues for at once (1: one after another).
  size_t parallel_issues = 1;
};

// One identity's entry, for the admin config dump.
struct CertificateInfo {
  std::string identity;
  // "valid", "renewing" (valid, new one being issued), "issuing" (none yet), "expired",
  // "failed" (none usable and the last attempt failed).
  std::string state;
  // Empty when no certificate has been obtained yet.
  std::string serial;
  TimePoint not_before{};
  TimePoint not_after{};
  TimePoint renew_at{};
  std::string last_error;
  CertifiedKeyPtr key;  // the certificate in use (leaf and intermediates); null when none
};

struct RootInfo {
  std::string pem;
  std::string subject;
  std::string serial;
  std::string sha256;
  TimePoint not_before{};
  TimePoint not_after{};
};

struct CacheSnapshot {
  std::string issuer;  // CertificateIssuer::kind()
  std::vector<CertificateInfo> certificates;
  std::vector<RootInfo> roots;
};

class CertificateCache {
 public:
  // Throws std::invalid_argument for a null issuer or a renew_fraction outside (0, 1].
  explicit CertificateCache(std::shared_ptr<CertificateIssuer> issuer,
                            CertificateCacheOptions options = {});
  ~CertificateCache();
  CertificateCache(const CertificateCache&) = delete;
  CertificateCache& operator=(const CertificateCache&) = delete;

  // The current certificate for a SPIFFE ID string, or null when none can be had (invalid ID,
  // issuer failing; the reason is logged once per attempt and shown by snapshot()). Thread-safe.
  // First use issues synchronously; concurrent callers for the same identity wait for that one
  // issuance instead of starting their own. Past the half-life, one caller renews while the
  // others keep getting the still-valid certificate; a failed renewal keeps the old one.
  CertifiedKeyPtr get(const std::string& spiffe_id);
  // Same as get() with the reason on failure.
  Result<CertifiedKeyPtr> lookup(const std::string& spiffe_id);
  Result<CertifiedKeyPtr> lookup(const SpiffeId& id);

  // Re-issues every entry that is past its renewal point, expired, or superseded according to
  // the issuer (after letting the issuer refresh()), except those in failure backoff. Blocks
  // while issuing; returns how many entries got a certificate.
  size_t renew_due();
  // When renew_due() next has scheduled work; nullopt when the cache is empty. Superseded
  // entries are not predictable, so a timer should also fire periodically.
  std::optional<TimePoint> next_renewal() const;

  // Runs renew_due() every `period` (sooner when next_renewal() is due sooner, or when woken by
  // a lookup in issue_in_background mode) on a thread owned by the cache, until
  // stop_background_renewal() or destruction. Calling it while running changes nothing.
  void start_background_renewal(std::chrono::milliseconds period);
  void stop_background_renewal();

  // Registers `id` so that the background thread obtains its certificate before it is needed.
  void prefetch(const SpiffeId& id);

  // Drops an identity (its workload left the node). Live connections keep their pointer.
  void remove(const std::string& spiffe_id);

  TrustRootsPtr roots() const { return issuer_->trust_roots(); }
  CacheSnapshot snapshot() const;
  CertificateIssuer& issuer() const { return *issuer_; }

 private:
  struct Entry {
    SpiffeId id;
    CertifiedKeyPtr current;
    TimePoint renew_at{};
    TimePoint retry_after{};  // failure backoff; no attempts before this
    int failures = 0;
    std::string last_error;
    bool inflight = false;
    uint64_t attempts = 0;  // completed attempts; lets waiters see that theirs is over
  };

  TimePoint now() const { return now_from(options_.clock); }
  // Issues for `e` with mu_ released around the issuer call; `lock` holds mu_ before and after.
  // Returns whether a certificate was obtained.
  bool attempt(std::unique_lock<std::mutex>& lock, const std::shared_ptr<Entry>& e);
  std::shared_ptr<Entry> entry_locked(const SpiffeId& id);
  // Wakes the background thread (issue_in_background).
  void kick();

  const std::shared_ptr<CertificateIssuer> issuer_;
  const CertificateCacheOptions options_;

  mutable std::mutex mu_;
  std::condition_variable done_;  // an attempt finished
  // shared_ptr so that remove() cannot pull an entry from under a thread issuing for it.
  std::map<std::string, std::shared_ptr<Entry>, std::less<>> entries_;

  std::mutex bg_mu_;
  std::condition_variable bg_cv_;
  bool bg_stop_ = false;
  bool bg_kick_ = false;
  std::thread bg_;
};

}  // namespace sockmesh::identity
