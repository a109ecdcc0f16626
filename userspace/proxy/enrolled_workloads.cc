#include "proxy/enrolled_workloads.h"

#include "base/log.h"

namespace sockmesh::proxy {
namespace {

constexpr auto kKeepRetired = std::chrono::seconds(60);

std::shared_ptr<const state::Workload> workload_of(const maps::WorkloadRecord& r,
                                                   const IpAddress& ip, const std::string& node) {
  auto w = std::make_shared<state::Workload>();
  w->uid = r.uid;
  w->name = r.uid;  // the map keeps no pod name
  w->namespace_name = r.namespace_name;
  w->service_account = r.service_account;
  w->trust_domain = r.trust_domain;
  w->node = node;
  w->ips = {ip};
  w->protocol = state::Protocol::kHbone;  // enrolled: its traffic goes through this proxy
  return w;
}

}  // namespace

EnrolledWorkloads::EnrolledWorkloads(std::string pin_root, std::string node_name,
                                     std::chrono::milliseconds retry)
    : pin_root_(std::move(pin_root)), node_name_(std::move(node_name)), retry_(retry) {}

bool EnrolledWorkloads::available() {
  std::lock_guard lock(mu_);
  return open_locked();
}

bool EnrolledWorkloads::open_locked() {
  if (reader_ && Clock::now() >= next_pin_check_) {
    next_pin_check_ = Clock::now() + retry_;
    if (!reader_->map().still_pinned()) {
      // Recreated by the loader (reinstall, upgrade): read the new one from now on.
      SM_WARN("proxy") << "workload map " << reader_->map().path()
                       << " was recreated by the loader; opening the new one";
      reader_.reset();
      for (auto& [ip, cached] : by_ip_) retire_locked(std::move(cached.workload));
      by_ip_.clear();
      next_try_ = {};
    }
  }
  if (reader_) return true;
  if (pin_root_.empty() || Clock::now() < next_try_) return false;
  next_try_ = Clock::now() + retry_;
  auto r = maps::WorkloadMapReader::open(pin_root_);
  if (!r) {
    if (!logged_missing_) {
      SM_INFO("proxy") << "workload map not readable (" << r.error().message
                       << "): local workloads come from the config file only";
      logged_missing_ = true;
    }
    return false;
  }
  reader_.emplace(std::move(r).value());
  SM_INFO("proxy") << "workload map " << reader_->map().path()
                   << " open: pods enrolled on this node are local workloads";
  return true;
}

void EnrolledWorkloads::retire_locked(std::shared_ptr<const state::Workload> w) {
  auto now = Clock::now();
  if (w) retired_.emplace_back(now, std::move(w));
  while (!retired_.empty() && now - retired_.front().first > kKeepRetired) retired_.pop_front();
}

const state::Workload* EnrolledWorkloads::find(const state::Snapshot& snapshot,
                                               const IpAddress& ip) {
  std::lock_guard lock(mu_);
  if (!open_locked()) return nullptr;
  auto record = reader_->lookup(ip);
  auto cached = by_ip_.find(ip);
  if (!record || !record->enrolled) {
    if (cached != by_ip_.end()) {
      retire_locked(std::move(cached->second.workload));
      by_ip_.erase(cached);
    }
    return nullptr;
  }
  const state::Workload* configured = snapshot.workload_by_ip(ip);
  if (configured != nullptr && configured->identity() == record->spiffe_id()) return configured;
  if (cached != by_ip_.end() && cached->second.record == *record) {
    return cached->second.workload.get();
  }
  auto w = workload_of(*record, ip, node_name_);
  if (cached != by_ip_.end()) {
    retire_locked(std::move(cached->second.workload));
    cached->second = Cached{*record, w};
  } else {
    retire_locked(nullptr);
    by_ip_.emplace(ip, Cached{*record, w});
  }
  SM_DEBUG("proxy") << "workload map: " << ip.to_string() << " is " << w->identity() << " (uid "
                    << w->uid << ")";
  return w.get();
}

}  // namespace sockmesh::proxy
