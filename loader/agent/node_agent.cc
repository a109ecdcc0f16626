#include "loader/agent/node_agent.h"

#include <algorithm>
#include <map>
#include <optional>

#include "base/log.h"
#include "loader/agent/files.h"

namespace sockmesh::agent {
namespace {

using cni::Outcome;
using maps::Error;

std::string uid_of(const cni::PodEvent& e) {
  return e.pod_uid.empty() ? e.pod_namespace + "/" + e.pod_name : e.pod_uid;
}

void add_unique(std::vector<IpAddress>* ips, const IpAddress& ip) {
  if (std::find(ips->begin(), ips->end(), ip) == ips->end()) ips->push_back(ip);
}

}  // namespace

NodeAgent::NodeAgent(AgentOptions options, Enroller* enroller,
                     std::unique_ptr<WorkloadHandoff> handoff, PodNetnsFinder* finder)
    : options_(std::move(options)),
      enroller_(enroller),
      handoff_(std::move(handoff)),
      finder_(finder) {}

maps::Status NodeAgent::start() {
  std::lock_guard lock(mu_);
  // This agent owns the run dir now (run.cc claimed its CNI socket first): a temporary file
  // of its files is what an agent killed mid-write left, never read, and gone only if removed.
  for (const auto* file : {&options_.state_file, &options_.hints_file}) {
    if (file->empty()) continue;
    for (const auto& name : remove_stale_temp_files(*file)) {
      SM_INFO("agent") << "removed " << name << ": left by an agent that stopped while writing it";
    }
  }
  if (!options_.state_file.empty()) {
    auto loaded = load_pod_records(options_.state_file);
    if (loaded) {
      pods_ = std::move(*loaded);
    } else {
      // The workload map is the truth about capture; the records are adopted from it below.
      SM_WARN("agent") << "ignoring unreadable pod records: " << loaded.error().message;
    }
  }
  auto listed = enroller_->list();
  if (!listed) return listed.error();
  std::map<std::string, std::vector<EnrolledIp>> in_map;
  for (auto& entry : *listed) in_map[entry.record.uid].push_back(std::move(entry));

  for (auto it = pods_.begin(); it != pods_.end();) {
    PodRecord& record = it->second;
    auto mapped = in_map.find(record.uid);
    if (mapped != in_map.end()) {
      for (const auto& e : mapped->second) add_unique(&record.ips, e.ip);
    }
    if (!enroller_->netns_exists(record.netns_path)) {
      if (mapped != in_map.end() || record.enrolled) {
        if (auto s = enroller_->unenroll(record); !s) {
          SM_WARN("agent") << "pod " << record.who()
                           << " is gone; removing its records: " << s.error().message;
        } else {
          SM_INFO("agent") << "pod " << record.who()
                           << " was deleted while the agent was away: capture removed";
        }
      }
      if (mapped != in_map.end()) in_map.erase(mapped);
      it = pods_.erase(it);
      continue;
    }
    record.enrolled = mapped != in_map.end();
    if (mapped != in_map.end()) in_map.erase(mapped);
    if (record.enrolled) SM_INFO("agent") << "adopted enrolled pod " << record.who();
    ++it;
  }

  // Records in the map that the agent has no note of (its state file was lost, or the pod was
  // enrolled by hand): adopted if their netns can be found, removed otherwise.
  for (auto& [uid, entries] : in_map) {
    const maps::WorkloadRecord& first = entries.front().record;
    PodRecord record;
    record.uid = uid;
    record.name = uid;
    record.namespace_name = first.namespace_name;
    record.service_account = first.service_account;
    record.capture_dns = first.capture_dns;
    record.enrolled = true;
    record.origin = PodOrigin::kAdopted;
    for (const auto& e : entries) add_unique(&record.ips, e.ip);
    FoundNetns found;
    if (first.netns_cookie != 0) found = enroller_->find_netns(first.netns_cookie, first.ifindex);
    if (found.path.empty()) {
      if (auto s = enroller_->unenroll(record); !s) {
        SM_WARN("agent") << "removing records of vanished pod " << uid << ": " << s.error().message;
      } else {
        SM_INFO("agent") << "removed the workload records of pod " << uid << ": its netns is gone";
      }
      continue;
    }
    record.netns_path = found.path;
    record.ifname = found.ifname;
    SM_INFO("agent") << "adopted enrolled pod " << uid << " found in " << found.path;
    pods_[uid] = std::move(record);
  }
  // Enrolling again is idempotent, and attaches the tc programs pinned now: after an upgrade
  // that changed them, pods enrolled by the old agent move to the new programs (the filter is
  // replaced in place; the flows in the maps stay, so live connections carry on).
  for (auto& [uid, record] : pods_) {
    if (!record.enrolled) continue;
    if (auto s = enroller_->enroll(record, options_.trust_domain); !s) {
      SM_WARN("agent") << "re-applying the enrollment of " << record.who() << ": "
                       << s.error().message;
    }
  }
  save_locked();

  if (handoff_) {
    std::vector<PodWorkload> all;
    for (const auto& [uid, record] : pods_) {
      if (record.enrolled) all.push_back(record.workload());
    }
    if (auto s = handoff_->sync(all); !s) {
      SM_WARN("agent") << "handing " << all.size()
                       << " enrolled pods to the proxy: " << s.error().message;
    }
  }
  return {};
}

cni::AgentReply NodeAgent::handle(const cni::PodEvent& event) {
  if (event.pod_namespace.empty() || event.pod_name.empty()) {
    return {Outcome::kFailed, "the event names no pod (podNamespace, podName)"};
  }
  if (event.command == cni::Command::kDel) return del(event);
  if (event.netns.empty()) return {Outcome::kFailed, "the event has no netns"};

  std::unique_lock lock(mu_);
  auto wait = options_.labels_wait;
  if (event.deadline_ms > 0) {
    wait = std::min(wait, std::chrono::milliseconds(event.deadline_ms / 2));
  }
  if (!labels_cv_.wait_for(lock, wait, [&] { return view_ != nullptr || stopping_; }) ||
      view_ == nullptr) {
    return {Outcome::kUnavailable,
            stopping_ ? "the agent is stopping"
                      : "the agent is starting: it has no namespace labels yet from its label "
                        "source"};
  }
  return add_or_check(event, lock);
}

cni::AgentReply NodeAgent::add_or_check(const cni::PodEvent& event,
                                        std::unique_lock<std::mutex>& lock) {
  const std::string uid = uid_of(event);
  const std::string who = event.pod_namespace + "/" + event.pod_name;

  LabelViewPtr view = view_;
  std::optional<PodMeta> meta;
  if (const PodMeta* m = view->pod(event.pod_namespace, event.pod_name)) {
    meta = *m;
  } else if (source_ != nullptr) {
    lock.unlock();
    meta = source_->fetch_pod(event.pod_namespace, event.pod_name);
    lock.lock();
    view = view_;
  }

  PodRecord incoming;
  incoming.uid = uid;
  incoming.name = event.pod_name;
  incoming.namespace_name = event.pod_namespace;
  if (meta && !meta->service_account.empty()) incoming.service_account = meta->service_account;
  if (meta) incoming.capture_dns = dns_capture_wanted(meta->labels, meta->annotations);
  incoming.container_id = event.container_id;
  incoming.netns_path = event.netns;
  incoming.ifname = event.ifname.empty() ? "eth0" : event.ifname;
  for (const auto& text : event.ips) {
    auto ip = IpAddress::parse(text);
    if (!ip) return {Outcome::kFailed, "pod " + who + ": not an IP address: " += text};
    add_unique(&incoming.ips, *ip);
  }
  if (incoming.ips.empty() && meta) incoming.ips = meta->ips;

  PodFacts facts;
  facts.namespace_name = event.pod_namespace;
  facts.pod_labels = meta ? &meta->labels : nullptr;
  facts.namespace_labels = view->namespace_labels(event.pod_namespace);
  facts.host_network = (meta && meta->host_network) || enroller_->is_host_netns(event.netns);
  Decision decision = decide(facts, options_.excluded_namespaces);

  bool identity_known = meta.has_value();
  if (auto it = pods_.find(uid); it != pods_.end()) {
    PodRecord& old = it->second;
    if (old.netns_path == incoming.netns_path) {
      incoming.enrolled = old.enrolled;
      if (!meta && old.enrolled && !old.metadata_pending) {
        // A CHECK (or a repeated ADD) of a pod enrolled with the identity it was given: kept.
        incoming.service_account = old.service_account;
        incoming.capture_dns = old.capture_dns;
        identity_known = true;
      }
    } else if (old.enrolled) {
      // The sandbox was re-created: the old netns's enrollment goes first.
      SM_INFO("agent") << "pod " << who << " has a new sandbox; unenrolling the old one";
      if (auto s = unenroll_locked(old); !s) {
        SM_WARN("agent") << "unenrolling the old sandbox of " << who << ": " << s.error().message;
      }
    }
  }
  PodRecord& record = pods_[uid] = std::move(incoming);

  if (!decision.enroll) {
    if (record.enrolled) {
      if (auto s = unenroll_locked(record); !s) {
        save_locked();
        return {Outcome::kFailed, "pod " + who + " is not to be enrolled (" + decision.reason +
                                      ") but unenrolling it failed: " + s.error().message};
      }
    }
    save_locked();
    SM_INFO("agent") << to_string(event.command) << " " << who << ": not enrolled, "
                     << decision.reason;
    return {Outcome::kSkipped, decision.reason};
  }
  if (!identity_known) {
    // Enrolled, the pod would carry an identity; without its metadata that identity would be a
    // guess ("default"). Its enrollment is held: the ADD fails (the pod does not start outside
    // the mesh, nor inside it as someone else), the runtime retries, and a view that brings the
    // pod enrolls a sandbox still held.
    record.metadata_pending = true;
    record.service_account.clear();
    save_locked();
    uint64_t n = adds_held_for_metadata_.fetch_add(1) + 1;
    std::string why = "pod " + who + " is to be enrolled (" + decision.reason +
                      ") but its metadata (service account, labels) is not known yet to the " +
                      (source_ != nullptr ? source_->name() : std::string("label")) +
                      " source; enrollment held rather than made under a guessed identity";
    SM_WARN("agent") << to_string(event.command) << " " << who << ": " << why
                     << " (adds held so far: " << n << ")";
    return {Outcome::kFailed, why};
  }
  record.metadata_pending = false;
  if (record.ips.empty()) {
    save_locked();
    return {Outcome::kFailed, "pod " + who + " is to be enrolled (" + decision.reason +
                                  ") but has no IP address in prevResult"};
  }
  auto s = enroll_locked(record);
  save_locked();
  if (!s) {
    SM_WARN("agent") << to_string(event.command) << " " << who
                     << ": enrolling failed: " << s.error().message;
    return {Outcome::kFailed, "pod " + who + " (" + decision.reason + "): " + s.error().message};
  }
  SM_INFO("agent") << to_string(event.command) << " " << who << ": enrolled, " << decision.reason;
  return {Outcome::kEnrolled, decision.reason};
}

cni::AgentReply NodeAgent::del(const cni::PodEvent& event) {
  std::lock_guard lock(mu_);
  const std::string who = event.pod_namespace + "/" + event.pod_name;
  auto it = pods_.find(uid_of(event));
  if (it == pods_.end()) {
    it = std::find_if(pods_.begin(), pods_.end(), [&](const auto& p) {
      return !event.container_id.empty() && p.second.container_id == event.container_id;
    });
  }
  if (it == pods_.end()) return {Outcome::kRemoved, "pod " + who + " was not known"};
  PodRecord& record = it->second;
  if (!record.container_id.empty() && !event.container_id.empty() &&
      record.container_id != event.container_id) {
    return {Outcome::kRemoved, "DEL of an older sandbox of " + who + "; the current one stays"};
  }
  if (record.enrolled) {
    if (auto s = unenroll_locked(record); !s) {
      // Kept: sweep() retries once the netns is gone.
      save_locked();
      return {Outcome::kFailed, "unenrolling " + who + ": " + s.error().message};
    }
  }
  pods_.erase(it);
  save_locked();
  SM_INFO("agent") << "DEL " << who << ": removed";
  return {Outcome::kRemoved, ""};
}

void NodeAgent::reply_lost(const cni::PodEvent& event) {
  if (event.command != cni::Command::kAdd) return;
  std::lock_guard lock(mu_);
  auto it = pods_.find(uid_of(event));
  if (it == pods_.end() || it->second.container_id != event.container_id) return;
  SM_WARN("agent") << "the plugin gave up on ADD of " << it->second.who()
                   << " before the answer; undoing it";
  if (it->second.enrolled) {
    if (auto s = unenroll_locked(it->second); !s) {
      SM_WARN("agent") << "undoing " << it->second.who() << ": " << s.error().message;
      save_locked();
      return;
    }
  }
  pods_.erase(it);
  save_locked();
}

void NodeAgent::update_labels(LabelViewPtr view) {
  if (!view) return;
  std::lock_guard lock(mu_);
  bool first = view_ == nullptr;
  view_ = std::move(view);
  labels_cv_.notify_all();
  if (first) {
    SM_INFO("agent") << "labels known: " << view_->namespaces.size() << " namespaces, "
                     << view_->pods.size() << " pods";
  }
  reconcile_locked();
  if (finder_ != nullptr && source_ != nullptr && source_->lists_node_pods()) discover_locked();
  publish_hints_locked();
  save_locked();
}

void NodeAgent::sweep() {
  std::lock_guard lock(mu_);
  bool changed = false;
  for (auto it = pods_.begin(); it != pods_.end();) {
    PodRecord& record = it->second;
    if (enroller_->netns_exists(record.netns_path)) {
      ++it;
      continue;
    }
    // A pod found through one of its processes may just have another process now.
    if (record.origin == PodOrigin::kDiscovered && finder_ != nullptr) {
      std::string path = finder_->find(record.uid);
      if (!path.empty()) {
        record.netns_path = path;
        changed = true;
        ++it;
        continue;
      }
    }
    if (record.enrolled) {
      if (auto s = unenroll_locked(record); !s) {
        SM_WARN("agent") << "pod " << record.who()
                         << " is gone; cleaning up: " << s.error().message;
        ++it;
        continue;
      }
    }
    SM_INFO("agent") << "pod " << record.who() << " is gone (netns " << record.netns_path
                     << "); forgotten";
    it = pods_.erase(it);
    changed = true;
  }
  if (changed) save_locked();
}

void NodeAgent::shutdown() {
  std::lock_guard lock(mu_);
  stopping_ = true;
  labels_cv_.notify_all();
}

maps::Status NodeAgent::unenroll_all() {
  std::lock_guard lock(mu_);
  std::string failed;
  size_t done = 0;
  for (auto it = pods_.begin(); it != pods_.end();) {
    PodRecord& record = it->second;
    if (record.enrolled) {
      if (auto s = unenroll_locked(record); !s) {
        failed += (failed.empty() ? "" : "; ") + record.who() + ": " + s.error().message;
        ++it;
        continue;
      }
      ++done;
      SM_INFO("agent") << "pod " << record.who() << ": unenrolled (uninstall)";
    }
    it = pods_.erase(it);
  }
  save_locked();
  if (!failed.empty()) return Error{EIO, "unenrolling for the uninstall: " + failed};
  SM_INFO("agent") << done << " pods unenrolled for the uninstall";
  return {};
}

PodRecords NodeAgent::pods() const {
  std::lock_guard lock(mu_);
  return pods_;
}

bool NodeAgent::labels_known() const {
  std::lock_guard lock(mu_);
  return view_ != nullptr;
}

const PodMeta* NodeAgent::meta_for(const PodRecord& record) const {
  if (!view_) return nullptr;
  if (const PodMeta* m = view_->pod(record.namespace_name, record.name)) return m;
  for (const auto& [key, meta] : view_->pods) {
    if (meta.uid == record.uid) return &meta;
  }
  return nullptr;
}

Decision NodeAgent::decide_locked(const PodRecord& record, const PodMeta* meta) const {
  PodFacts facts;
  facts.namespace_name = record.namespace_name;
  facts.pod_labels = meta ? &meta->labels : nullptr;
  facts.namespace_labels = view_ ? view_->namespace_labels(record.namespace_name) : nullptr;
  facts.host_network = (meta && meta->host_network) || enroller_->is_host_netns(record.netns_path);
  return decide(facts, options_.excluded_namespaces);
}

maps::Status NodeAgent::enroll_locked(PodRecord& record) {
  const bool was_enrolled = record.enrolled;
  auto undo = [&] {
    if (handoff_) (void)handoff_->remove(record.uid);
    if (was_enrolled) (void)enroller_->unenroll(record);
    record.enrolled = false;
  };
  if (handoff_) {
    if (auto s = handoff_->add(record.workload()); !s) {
      undo();
      return Error{s.error().code, "handing the pod to the proxy: " + s.error().message};
    }
  }
  if (auto s = enroller_->enroll(record, options_.trust_domain); !s) {
    undo();
    return Error{s.error().code, "enrolling in the datapath: " + s.error().message};
  }
  record.enrolled = true;
  return {};
}

maps::Status NodeAgent::unenroll_locked(PodRecord& record) {
  if (auto s = enroller_->unenroll(record); !s) {
    return Error{s.error().code, "switching capture off: " + s.error().message};
  }
  record.enrolled = false;
  if (handoff_) {
    if (auto s = handoff_->remove(record.uid); !s) {
      SM_WARN("agent") << "taking " << record.who() << " from the proxy: " << s.error().message;
    }
  }
  return {};
}

void NodeAgent::reconcile_locked() {
  for (auto& [uid, record] : pods_) {
    const PodMeta* meta = meta_for(record);
    if (meta != nullptr && record.origin == PodOrigin::kAdopted && record.name == record.uid) {
      record.name = meta->name;
    }
    if (record.metadata_pending) {
      if (meta == nullptr) continue;  // still held: nothing is enrolled on a guess
      record.metadata_pending = false;
      record.service_account = meta->service_account;
      record.capture_dns = dns_capture_wanted(meta->labels, meta->annotations);
      if (record.ips.empty()) record.ips = meta->ips;
      SM_INFO("agent") << "pod " << record.who() << ": metadata arrived (service account "
                       << record.service_account << "); its held enrollment is decided now";
    }
    Decision decision = decide_locked(record, meta);
    if (record.enrolled && decision.enroll && meta != nullptr && !meta->service_account.empty() &&
        meta->service_account != record.service_account) {
      // The identity in the workload record follows the pod's service account (learnt late when
      // the first view lacked the pod).
      SM_INFO("agent") << "pod " << record.who() << ": service account " << record.service_account
                       << " -> " << meta->service_account << "; updating its workload record";
      record.service_account = meta->service_account;
      if (auto s = enroller_->enroll(record, options_.trust_domain); !s) {
        SM_WARN("agent") << "updating the workload record of " << record.who() << ": "
                         << s.error().message;
      }
      continue;
    }
    if (record.enrolled && decision.enroll && meta != nullptr &&
        dns_capture_wanted(meta->labels, meta->annotations) != record.capture_dns) {
      // ambient.istio.io/dns-capture changed on a running pod: its record's flag follows.
      record.capture_dns = !record.capture_dns;
      SM_INFO("agent") << "pod " << record.who() << ": DNS capture "
                       << (record.capture_dns ? "on"
                                              : "off (" + std::string(kDnsCaptureKey) + "=false)")
                       << "; updating its workload record";
      if (auto s = enroller_->enroll(record, options_.trust_domain); !s) {
        SM_WARN("agent") << "updating the workload record of " << record.who() << ": "
                         << s.error().message;
      }
      continue;
    }
    if (decision.enroll == record.enrolled) continue;
    if (!enroller_->netns_exists(record.netns_path)) continue;  // sweep() takes it
    if (decision.enroll) {
      if (auto s = enroll_locked(record); !s) {
        SM_WARN("agent") << "enrolling running pod " << record.who() << " (" << decision.reason
                         << "): " << s.error().message;
      } else {
        SM_INFO("agent") << "enrolled running pod " << record.who() << ": " << decision.reason;
      }
    } else {
      if (auto s = unenroll_locked(record); !s) {
        SM_WARN("agent") << "unenrolling running pod " << record.who() << " (" << decision.reason
                         << "): " << s.error().message;
      } else {
        SM_INFO("agent") << "unenrolled running pod " << record.who() << ": " << decision.reason;
      }
    }
  }
}

void NodeAgent::discover_locked() {
  for (const auto& [key, meta] : view_->pods) {
    if (!meta.running || meta.host_network || meta.uid.empty() || pods_.count(meta.uid) != 0) {
      continue;
    }
    PodFacts facts;
    facts.namespace_name = meta.namespace_name;
    facts.pod_labels = &meta.labels;
    facts.namespace_labels = view_->namespace_labels(meta.namespace_name);
    if (!decide(facts, options_.excluded_namespaces).enroll || meta.ips.empty()) continue;
    std::string netns = finder_->find(meta.uid);
    if (netns.empty() || enroller_->is_host_netns(netns)) continue;
    PodRecord record;
    record.uid = meta.uid;
    record.name = meta.name;
    record.namespace_name = meta.namespace_name;
    record.service_account = meta.service_account;
    record.capture_dns = dns_capture_wanted(meta.labels, meta.annotations);
    record.netns_path = netns;
    record.ips = meta.ips;
    record.origin = PodOrigin::kDiscovered;
    if (auto s = enroll_locked(record); !s) {
      SM_WARN("agent") << "enrolling running pod " << record.who() << " found in " << netns << ": "
                       << s.error().message;
      continue;
    }
    SM_INFO("agent") << "enrolled running pod " << record.who() << " found in " << netns;
    pods_[record.uid] = std::move(record);
  }
}

void NodeAgent::save_locked() {
  if (options_.state_file.empty()) return;
  if (auto s = save_pod_records(options_.state_file, pods_); !s) {
    SM_WARN("agent") << "saving pod records: " << s.error().message;
  }
}

void NodeAgent::publish_hints_locked() {
  if (options_.hints_file.empty() || !view_) return;
  cni::NamespaceHints hints;
  hints.source = source_ != nullptr ? source_->name() : "unknown";
  hints.excluded = options_.excluded_namespaces;
  for (const auto& [name, labels] : view_->namespaces) {
    if (std::find(hints.excluded.begin(), hints.excluded.end(), name) != hints.excluded.end()) {
      continue;
    }
    (is_ambient(labels) ? hints.ambient : hints.other).push_back(name);
  }
  if (auto s = write_file_atomic(options_.hints_file, cni::encode(hints), 0644); !s) {
    SM_WARN("agent") << "publishing namespace hints: " << s.error().message;
  }
}

}  // namespace sockmesh::agent
