#include "identity/certificate_cache.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "base/log.h"

namespace sockmesh::identity {
namespace {

constexpr std::string_view kScope = "identity";

}  // namespace

CertificateCache::CertificateCache(std::shared_ptr<CertificateIssuer> issuer,
                                   CertificateCacheOptions options)
    : issuer_(std::move(issuer)), options_(std::move(options)) {
  if (!issuer_) throw std::invalid_argument("CertificateCache needs an issuer");
  if (!(options_.renew_fraction > 0.0 && options_.renew_fraction <= 1.0)) {
    throw std::invalid_argument("CertificateCache renew_fraction must be in (0, 1]");
  }
  if (options_.min_retry.count() < 0 || options_.max_retry < options_.min_retry) {
    throw std::invalid_argument("CertificateCache retry bounds must satisfy 0 <= min <= max");
  }
}

CertificateCache::~CertificateCache() { stop_background_renewal(); }

CertifiedKeyPtr CertificateCache::get(const std::string& spiffe_id) {
  auto r = lookup(spiffe_id);
  return r ? *std::move(r) : nullptr;
}

Result<CertifiedKeyPtr> CertificateCache::lookup(const std::string& spiffe_id) {
  auto id = SpiffeId::parse(spiffe_id);
  if (!id) return Error{"invalid workload SPIFFE ID \"" + spiffe_id + "\""};
  return lookup(*id);
}

std::shared_ptr<CertificateCache::Entry> CertificateCache::entry_locked(const SpiffeId& id) {
  const std::string name = id.to_string();
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    auto e = std::make_shared<Entry>();
    e->id = id;
    it = entries_.emplace(name, std::move(e)).first;
  }
  return it->second;
}

void CertificateCache::kick() {
  {
    std::lock_guard lock(bg_mu_);
    bg_kick_ = true;
  }
  bg_cv_.notify_all();
}

void CertificateCache::prefetch(const SpiffeId& id) {
  {
    std::lock_guard lock(mu_);
    entry_locked(id);
  }
  kick();
}

Result<CertifiedKeyPtr> CertificateCache::lookup(const SpiffeId& id) {
  std::unique_lock lock(mu_);
  std::shared_ptr<Entry> e = entry_locked(id);

  if (options_.issue_in_background) {
    const TimePoint t = now();
    const bool usable = e->current && t < e->current->not_after();
    const bool due = !usable || t >= e->renew_at;
    if (due && !e->inflight && t >= e->retry_after) kick();
    if (usable) return e->current;
    if (!e->last_error.empty()) return Error{e->last_error};
    return Error{"no certificate for " + e->id.to_string() + " yet: being obtained from " +
                 std::string(issuer_->kind())};
  }

  bool waited = false;
  while (true) {
    const TimePoint t = now();
    const bool usable = e->current && t < e->current->not_after();
    if (usable) {
      if (e->inflight || t < e->renew_at || t < e->retry_after) return e->current;
      // Due, and nobody is on it: this caller renews. It has a valid certificate either way.
      attempt(lock, e);
      return e->current;
    }
    if (e->inflight) {
      uint64_t seen = e->attempts;
      done_.wait(lock, [&] { return e->attempts != seen; });
      waited = true;
      continue;
    }
    // The attempt we waited for, or a recent one, failed: report it rather than piling on.
    if (!e->last_error.empty() && (waited || t < e->retry_after)) return Error{e->last_error};
    if (attempt(lock, e)) return e->current;
    return Error{e->last_error};
  }
}

bool CertificateCache::attempt(std::unique_lock<std::mutex>& lock,
                               const std::shared_ptr<Entry>& e) {
  e->inflight = true;
  const SpiffeId id = e->id;
  lock.unlock();
  auto result = issuer_->issue(id);
  lock.lock();
  e->inflight = false;
  ++e->attempts;
  const TimePoint t = now();
  bool ok = result.ok();
  if (ok) {
    CertifiedKeyPtr fresh = *std::move(result);
    bool changed = fresh != e->current;
    e->current = std::move(fresh);
    e->failures = 0;
    e->last_error.clear();
    e->retry_after = TimePoint{};
    e->renew_at = e->current->refresh_at(options_.renew_fraction);
    // An issuer that hands back material already past its renewal point (mounted files nobody
    // rotated yet) is asked again after a pause, not on every handshake.
    if (e->renew_at <= t) {
      e->renew_at = t + std::max(options_.min_retry, std::chrono::milliseconds(1));
    }
    if (changed) {
      SM_INFO(kScope) << "certificate ready identity=" << e->current->identity()
                      << " serial=" << e->current->serial()
                      << " not_after=" << format_utc(e->current->not_after())
                      << " renew_at=" << format_utc(e->renew_at);
    }
  } else {
    e->last_error = result.error().message;
    ++e->failures;
    auto backoff = options_.min_retry;
    for (int i = 1; i < e->failures && backoff < options_.max_retry; ++i) backoff *= 2;
    backoff = std::min(backoff, options_.max_retry);
    e->retry_after = t + backoff;
    SM_WARN(kScope) << "certificate issuance failed identity=" << id.to_string()
                    << " failures=" << e->failures << " retry_in_ms=" << backoff.count()
                    << " error=" << e->last_error;
  }
  done_.notify_all();
  return ok;
}

size_t CertificateCache::renew_due() {
  issuer_->refresh();
  struct Candidate {
    std::shared_ptr<Entry> entry;
    CertifiedKeyPtr current;
    bool due;
  };
  std::vector<Candidate> candidates;
  const TimePoint t = now();
  {
    std::lock_guard lock(mu_);
    for (auto& [_, e] : entries_) {
      if (e->inflight || t < e->retry_after) continue;
      bool due = !e->current || t >= e->current->not_after() || t >= e->renew_at;
      candidates.push_back({e, e->current, due});
    }
  }
  std::atomic<size_t> renewed{0};
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < candidates.size(); i = next++) {
      Candidate& c = candidates[i];
      // The issuer may stat files here; do it without holding the cache lock.
      if (!c.due && !issuer_->superseded(*c.current)) continue;
      std::unique_lock lock(mu_);
      // Someone else may have renewed or removed it in the meantime.
      auto it = entries_.find(c.entry->id.to_string());
      if (it == entries_.end() || it->second != c.entry) continue;
      if (c.entry->inflight || c.entry->current != c.current) continue;
      if (attempt(lock, c.entry)) ++renewed;
    }
  };
  // A remote CA answers in a round trip: ask for several identities at once (the issuer caps
  // its own requests in flight), so that a node full of new pods is not served one by one.
  size_t helpers = std::min(options_.parallel_issues, candidates.size());
  std::vector<std::thread> threads;
  for (size_t i = 1; i < helpers; ++i) threads.emplace_back(work);
  work();
  for (auto& th : threads) th.join();
  return renewed;
}

std::optional<TimePoint> CertificateCache::next_renewal() const {
  std::lock_guard lock(mu_);
  std::optional<TimePoint> next;
  for (const auto& [_, e] : entries_) {
    TimePoint at = e->current ? std::max(e->renew_at, e->retry_after) : e->retry_after;
    if (!next || at < *next) next = at;
  }
  return next;
}

void CertificateCache::start_background_renewal(std::chrono::milliseconds period) {
  std::lock_guard lock(bg_mu_);
  if (bg_.joinable()) return;
  bg_stop_ = false;
  bg_ = std::thread([this, period] {
    std::unique_lock lk(bg_mu_);
    while (!bg_stop_) {
      bg_kick_ = false;
      lk.unlock();
      renew_due();
      std::chrono::milliseconds wait = period;
      if (auto next = next_renewal()) {
        auto until = std::chrono::duration_cast<std::chrono::milliseconds>(*next - now());
        // At least a little: an entry due now that could not be renewed must not spin.
        // (std::clamp needs lo <= hi, and a period may be shorter than that floor.)
        const auto floor = std::min(std::chrono::milliseconds(10), period);
        wait = std::clamp(until + std::chrono::milliseconds(1), floor, period);
      }
      lk.lock();
      bg_cv_.wait_for(lk, wait, [this] { return bg_stop_ || bg_kick_; });
    }
  });
}

void CertificateCache::stop_background_renewal() {
  std::thread t;
  {
    std::lock_guard lock(bg_mu_);
    bg_stop_ = true;
    t = std::move(bg_);
  }
  bg_cv_.notify_all();
  // The thread may be inside a remote CA's call: end it rather than wait for its deadline.
  if (t.joinable()) issuer_->cancel();
  if (t.joinable()) t.join();
}

void CertificateCache::remove(const std::string& spiffe_id) {
  std::lock_guard lock(mu_);
  entries_.erase(spiffe_id);
}

CacheSnapshot CertificateCache::snapshot() const {
  CacheSnapshot snap;
  snap.issuer = std::string(issuer_->kind());
  const TimePoint t = now();
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, e] : entries_) {
      CertificateInfo info;
      info.identity = name;
      info.last_error = e->last_error;
      if (e->current) {
        info.serial = e->current->serial();
        info.not_before = e->current->not_before();
        info.not_after = e->current->not_after();
        info.renew_at = e->renew_at;
        info.key = e->current;
      }
      const bool usable = e->current && t < e->current->not_after();
      if (e->inflight) {
        info.state = usable ? "renewing" : "issuing";
      } else if (usable) {
        info.state = "valid";
      } else if (e->current && e->last_error.empty()) {
        info.state = "expired";
      } else {
        info.state = e->last_error.empty() ? "issuing" : "failed";
      }
      snap.certificates.push_back(std::move(info));
    }
  }
  if (TrustRootsPtr roots = issuer_->trust_roots()) {
    for (const auto& root : *roots) {
      RootInfo r;
      r.pem = to_pem(root.get());
      r.subject = subject_string(root.get());
      if (auto nb = to_time_point(X509_get0_notBefore(root.get()))) r.not_before = *nb;
      r.serial = serial_hex(root.get());
      r.sha256 = fingerprint_sha256(root.get());
      if (auto na = to_time_point(X509_get0_notAfter(root.get()))) r.not_after = *na;
      snap.roots.push_back(std::move(r));
    }
  }
  return snap;
}

}  // namespace sockmesh::identity
