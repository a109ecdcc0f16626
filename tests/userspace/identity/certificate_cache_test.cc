#include "identity/certificate_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <stdexcept>
#include <thread>

#include "identity/builtin_ca.h"
#include "test_util.h"

namespace sockmesh::identity {
namespace {

using namespace std::chrono_literals;
using testing::FakeClock;
using testing::TempDir;

const std::string kWeb = "spiffe://cluster.local/ns/default/sa/web";
const std::string kDb = "spiffe://cluster.local/ns/data/sa/db";

// Wraps the real CA to count calls, inject failures and slow issuance down.
class TestIssuer : public CertificateIssuer {
 public:
  explicit TestIssuer(std::shared_ptr<CertificateIssuer> inner) : inner_(std::move(inner)) {}
  Result<CertifiedKeyPtr> issue(const SpiffeId& id) override {
    ++calls;
    int now_in = ++in_flight;
    for (int seen = max_in_flight;
         now_in > seen && !max_in_flight.compare_exchange_weak(seen, now_in);) {
    }
    if (delay.load().count() > 0) std::this_thread::sleep_for(delay.load());
    --in_flight;
    if (fail) return Error{"CA unavailable"};
    return inner_->issue(id);
  }
  TrustRootsPtr trust_roots() const override { return inner_->trust_roots(); }
  std::string_view kind() const override { return "test"; }

  std::atomic<int> calls{0};
  std::atomic<int> in_flight{0};
  std::atomic<int> max_in_flight{0};
  std::atomic<bool> fail{false};
  std::atomic<std::chrono::milliseconds> delay{0ms};

 private:
  std::shared_ptr<CertificateIssuer> inner_;
};

class CertificateCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BuiltinCaOptions options;
    options.clock = clock_.fn();
    auto ca = BuiltinCa::load_or_create(dir_.path(), "cluster.local", options);
    ASSERT_TRUE(ca.ok()) << ca.error().message;
    ca_ = *ca;
    issuer_ = std::make_shared<TestIssuer>(ca_);
    CertificateCacheOptions cache_options;
    cache_options.clock = clock_.fn();
    cache_ = std::make_unique<CertificateCache>(issuer_, cache_options);
  }

  FakeClock clock_;
  TempDir dir_;
  std::shared_ptr<BuiltinCa> ca_;
  std::shared_ptr<TestIssuer> issuer_;
  std::unique_ptr<CertificateCache> cache_;
};

TEST_F(CertificateCacheTest, SameCertificateUntilHalfLifeThenANewOne) {
  CertifiedKeyPtr first = cache_->get(kWeb);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->identity(), kWeb);
  EXPECT_EQ(issuer_->calls, 1);
  // 24 h lifetime backdated by 5 min: half-life is 11 h 57 min 30 s after issuance.
  const TimePoint half = first->not_before() + (first->not_after() - first->not_before()) / 2;
  EXPECT_EQ(half, clock_.now() + 11h + 57min + 30s);
  EXPECT_EQ(cache_->next_renewal(), half);

  clock_.advance(6h);
  EXPECT_EQ(cache_->get(kWeb), first);
  clock_.set(half - 1s);
  EXPECT_EQ(cache_->get(kWeb), first);
  EXPECT_EQ(issuer_->calls, 1);

  clock_.set(half);
  CertifiedKeyPtr second = cache_->get(kWeb);
  ASSERT_TRUE(second);
  EXPECT_NE(second, first);
  EXPECT_NE(second->serial(), first->serial());
  EXPECT_EQ(second->identity(), kWeb);
  EXPECT_EQ(second->not_before(), half - 5min);
  EXPECT_EQ(issuer_->calls, 2);
  EXPECT_EQ(cache_->get(kWeb), second);
  EXPECT_EQ(issuer_->calls, 2);
  // A connection that took the first certificate still holds a complete, unchanged object.
  EXPECT_EQ(X509_check_private_key(first->leaf(), first->private_key()), 1);
  EXPECT_TRUE(first->valid_at(clock_.now()));
}

TEST_F(CertificateCacheTest, RenewDueRenewsBeforeHandshakesAsk) {
  CertifiedKeyPtr first = cache_->get(kWeb);
  CertifiedKeyPtr db = cache_->get(kDb);
  ASSERT_TRUE(first && db);
  EXPECT_EQ(cache_->renew_due(), 0u) << "nothing due yet";
  EXPECT_EQ(issuer_->calls, 2);

  clock_.advance(12h);
  EXPECT_EQ(cache_->renew_due(), 2u);
  EXPECT_EQ(issuer_->calls, 4);
  CertifiedKeyPtr renewed = cache_->get(kWeb);
  EXPECT_NE(renewed, first);
  EXPECT_EQ(issuer_->calls, 4) << "get() served the renewed certificate without issuing";
  EXPECT_EQ(cache_->renew_due(), 0u);
}

TEST_F(CertificateCacheTest, ConcurrentFirstUseIssuesOnce) {
  issuer_->delay = 50ms;
  constexpr int kThreads = 8;
  std::latch start(kThreads);
  std::vector<CertifiedKeyPtr> got(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      got[i] = cache_->get(kWeb);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(issuer_->calls, 1);
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_TRUE(got[i]) << i;
    EXPECT_EQ(got[i], got[0]);
  }
}

TEST_F(CertificateCacheTest, DifferentIdentitiesIssueInParallel) {
  // The lock is not held while signing: two slow issuances overlap instead of queueing.
  issuer_->delay = 300ms;
  auto start = std::chrono::steady_clock::now();
  std::thread a([&] { EXPECT_TRUE(cache_->get(kWeb)); });
  std::thread b([&] { EXPECT_TRUE(cache_->get(kDb)); });
  a.join();
  b.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 550ms);
  EXPECT_EQ(issuer_->calls, 2);
}

TEST_F(CertificateCacheTest, RenewalKeepsServingWhileOneThreadRenews) {
  CertifiedKeyPtr first = cache_->get(kWeb);
  ASSERT_TRUE(first);
  clock_.advance(12h);
  issuer_->delay = 500ms;
  std::thread renewer([&] { EXPECT_NE(cache_->get(kWeb), first); });
  while (issuer_->calls < 2) std::this_thread::sleep_for(1ms);
  // While the renewal is in flight, others get the still-valid certificate immediately.
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(cache_->get(kWeb), first);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 250ms);
  EXPECT_EQ(cache_->snapshot().certificates.at(0).state, "renewing");
  renewer.join();
  EXPECT_EQ(issuer_->calls, 2);
}

TEST_F(CertificateCacheTest, FailuresBackOff) {
  issuer_->fail = true;
  EXPECT_EQ(cache_->get(kWeb), nullptr);
  auto r = cache_->lookup(kWeb);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "CA unavailable");
  EXPECT_EQ(issuer_->calls, 1) << "second call within the backoff must not reach the issuer";

  clock_.advance(1s);  // first backoff: 1 s
  EXPECT_FALSE(cache_->get(kWeb));
  EXPECT_EQ(issuer_->calls, 2);
  clock_.advance(1s);  // second backoff: 2 s
  EXPECT_FALSE(cache_->get(kWeb));
  EXPECT_EQ(issuer_->calls, 2);
  clock_.advance(1s);
  EXPECT_FALSE(cache_->get(kWeb));
  EXPECT_EQ(issuer_->calls, 3);

  auto snap = cache_->snapshot();
  ASSERT_EQ(snap.certificates.size(), 1u);
  EXPECT_EQ(snap.certificates[0].state, "failed");
  EXPECT_EQ(snap.certificates[0].last_error, "CA unavailable");
  EXPECT_EQ(snap.certificates[0].serial, "");

  issuer_->fail = false;
  clock_.advance(4s);
  EXPECT_TRUE(cache_->get(kWeb));
  EXPECT_EQ(issuer_->calls, 4);
  EXPECT_EQ(cache_->snapshot().certificates[0].last_error, "");
}

TEST_F(CertificateCacheTest, FailedRenewalKeepsTheOldCertificate) {
  CertifiedKeyPtr first = cache_->get(kWeb);
  ASSERT_TRUE(first);
  issuer_->fail = true;
  clock_.advance(12h);
  EXPECT_EQ(cache_->get(kWeb), first);
  EXPECT_EQ(issuer_->calls, 2);
  EXPECT_EQ(cache_->get(kWeb), first);
  EXPECT_EQ(issuer_->calls, 2) << "in backoff";
  auto info = cache_->snapshot().certificates.at(0);
  EXPECT_EQ(info.state, "valid");
  EXPECT_EQ(info.serial, first->serial());
  EXPECT_EQ(info.last_error, "CA unavailable");

  // Once it has expired there is nothing left to serve.
  clock_.set(first->not_after());
  EXPECT_EQ(cache_->get(kWeb), nullptr);
  issuer_->fail = false;
  clock_.advance(1min);
  CertifiedKeyPtr fresh = cache_->get(kWeb);
  ASSERT_TRUE(fresh);
  EXPECT_NE(fresh, first);
}

TEST_F(CertificateCacheTest, SnapshotListsCertificatesAndRoots) {
  CertifiedKeyPtr web = cache_->get(kWeb);
  CertifiedKeyPtr db = cache_->get(kDb);
  ASSERT_TRUE(web && db);
  CacheSnapshot snap = cache_->snapshot();
  EXPECT_EQ(snap.issuer, "test");
  ASSERT_EQ(snap.certificates.size(), 2u);
  // Sorted by identity.
  EXPECT_EQ(snap.certificates[0].identity, kDb);
  EXPECT_EQ(snap.certificates[0].serial, db->serial());
  EXPECT_EQ(snap.certificates[0].not_after, db->not_after());
  EXPECT_EQ(snap.certificates[1].identity, kWeb);
  EXPECT_EQ(snap.certificates[1].serial, web->serial());
  EXPECT_EQ(snap.certificates[1].not_after, web->not_after());
  EXPECT_EQ(snap.certificates[1].renew_at, web->refresh_at(0.5));
  EXPECT_EQ(snap.certificates[1].state, "valid");
  ASSERT_EQ(snap.roots.size(), 1u);
  EXPECT_EQ(snap.roots[0].sha256, fingerprint_sha256(ca_->root()));
  EXPECT_EQ(snap.roots[0].subject, "O=sockmesh");
  ASSERT_EQ(cache_->roots()->size(), 1u);
  EXPECT_EQ(cache_->roots()->front().get(), ca_->root());
}

TEST_F(CertificateCacheTest, InvalidIdentity) {
  EXPECT_EQ(cache_->get("spiffe://cluster.local/default/web"), nullptr);
  auto r = cache_->lookup("not an id");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("invalid workload SPIFFE ID"), std::string::npos);
  EXPECT_EQ(issuer_->calls, 0);
  EXPECT_TRUE(cache_->snapshot().certificates.empty());
}

TEST_F(CertificateCacheTest, RemoveForgetsIdentity) {
  CertifiedKeyPtr first = cache_->get(kWeb);
  ASSERT_TRUE(first);
  cache_->remove(kWeb);
  EXPECT_TRUE(cache_->snapshot().certificates.empty());
  EXPECT_FALSE(cache_->next_renewal().has_value());
  CertifiedKeyPtr again = cache_->get(kWeb);
  EXPECT_NE(again, first);
  EXPECT_EQ(issuer_->calls, 2);
}

TEST_F(CertificateCacheTest, BackgroundRenewal) {
  CertifiedKeyPtr first = cache_->get(kWeb);
  ASSERT_TRUE(first);
  cache_->start_background_renewal(5ms);
  clock_.advance(12h);
  // Poll the snapshot (not get(), which would renew by itself).
  std::string serial = first->serial();
  for (int i = 0; i < 500 && serial == first->serial(); ++i) {
    std::this_thread::sleep_for(10ms);
    serial = cache_->snapshot().certificates.at(0).serial;
  }
  cache_->stop_background_renewal();
  EXPECT_NE(serial, first->serial());
  EXPECT_EQ(issuer_->calls, 2);
}

// A remote CA's issuer: lookups never call it (they run on io threads), the background thread
// does, woken by the lookup rather than at its next period.
TEST_F(CertificateCacheTest, BackgroundModeNeverIssuesOnTheCallersThread) {
  CertificateCacheOptions options;
  options.issue_in_background = true;
  CertificateCache cache(issuer_, options);
  issuer_->delay = 200ms;
  auto first = cache.lookup(kWeb);
  ASSERT_FALSE(first.ok());
  EXPECT_NE(first.error().message.find("being obtained from test"), std::string::npos)
      << first.error().message;
  EXPECT_EQ(issuer_->calls, 0);
  cache.start_background_renewal(1h);  // only a wake-up can make it issue within the test
  Result<CertifiedKeyPtr> got = Error{"not tried"};
  for (int i = 0; i < 300; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    got = cache.lookup(kWeb);
    // Never waits for the 200 ms issuance in progress.
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 100ms);
    if (got.ok()) break;
    std::this_thread::sleep_for(10ms);
  }
  cache.stop_background_renewal();
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(issuer_->calls, 1);
}

TEST_F(CertificateCacheTest, BackgroundModeReportsTheLastFailureAndPrefetches) {
  CertificateCacheOptions options;
  options.issue_in_background = true;
  CertificateCache cache(issuer_, options);
  issuer_->fail = true;
  cache.prefetch(*SpiffeId::parse(kDb));
  EXPECT_EQ(cache.renew_due(), 0u);
  auto r = cache.lookup(kDb);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "CA unavailable");
  EXPECT_EQ(issuer_->calls, 1);
}

// Several identities due at once are asked for together, up to parallel_issues, not beyond.
TEST_F(CertificateCacheTest, RenewDueIssuesUpToParallelIssuesAtOnce) {
  for (size_t parallel : {size_t{1}, size_t{3}}) {
    CertificateCacheOptions options;
    options.clock = clock_.fn();
    options.issue_in_background = true;
    options.parallel_issues = parallel;
    CertificateCache cache(issuer_, options);
    for (int i = 0; i < 6; ++i) {
      cache.prefetch(*SpiffeId::parse("spiffe://cluster.local/ns/n" + std::to_string(i) + "/sa/a"));
    }
    issuer_->max_in_flight = 0;
    issuer_->delay = 200ms;  // long enough for the helpers to overlap even on a busy machine
    EXPECT_EQ(cache.renew_due(), 6u);
    EXPECT_LE(issuer_->max_in_flight, static_cast<int>(parallel));
    EXPECT_GE(issuer_->max_in_flight, parallel == 1 ? 1 : 2);
  }
}

TEST(CertificateCacheConfigTest, RejectsBadConfiguration) {
  EXPECT_THROW(CertificateCache(nullptr), std::invalid_argument);
  TempDir dir;
  auto ca = BuiltinCa::load_or_create(dir.path(), "td");
  ASSERT_TRUE(ca.ok());
  CertificateCacheOptions zero;
  zero.renew_fraction = 0;
  EXPECT_THROW(CertificateCache(*ca, zero), std::invalid_argument);
  CertificateCacheOptions big;
  big.renew_fraction = 1.5;
  EXPECT_THROW(CertificateCache(*ca, big), std::invalid_argument);
}

}  // namespace
}  // namespace sockmesh::identity
