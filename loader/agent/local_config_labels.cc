#include "loader/agent/local_config_labels.h"

#include <cerrno>

#include "base/log.h"

namespace sockmesh::agent {

LabelViewPtr view_of(const state::Snapshot& snapshot) {
  auto view = std::make_shared<LabelView>();
  for (const auto& ns : snapshot.namespaces()) view->namespaces[ns.name] = ns.labels;
  for (const auto& w : snapshot.workloads()) {
    PodMeta meta;
    meta.uid = w.uid;
    meta.name = w.name;
    meta.namespace_name = w.namespace_name;
    meta.service_account = w.service_account;
    meta.labels = w.labels;
    meta.ips = w.ips;
    // Pods of a namespace that has no entry still have a namespace, without labels.
    view->namespaces.try_emplace(w.namespace_name);
    view->pods[LabelView::key(w.namespace_name, w.name)] = std::move(meta);
  }
  return view;
}

LocalConfigLabels::LocalConfigLabels(std::string path, std::chrono::milliseconds interval)
    : path_(std::move(path)), interval_(interval) {}

LocalConfigLabels::~LocalConfigLabels() { stop(); }

maps::Status LocalConfigLabels::load() {
  if (path_.empty()) {
    auto parsed = config::parse_local_config(config::embedded_default_config(), "<embedded>");
    if (const auto* error = config::error_of(parsed)) {
      return maps::Error{EINVAL, error->to_string()};
    }
    store_.set(config::snapshot_of(parsed));
    return {};
  }
  watcher_ = std::make_unique<config::ConfigWatcher>(path_, &store_, interval_);
  if (auto error = watcher_->reload()) return maps::Error{EINVAL, error->to_string()};
  return {};
}

void LocalConfigLabels::start(Listener listener) {
  LabelViewPtr first = view_of(*store_.get());
  {
    std::lock_guard lock(mu_);
    listener_ = std::move(listener);
    published_ = first;
  }
  store_.subscribe([this](const state::SnapshotPtr&, const state::SnapshotPtr& current) {
    if (!current) return;
    LabelViewPtr view = view_of(*current);
    Listener l;
    {
      std::lock_guard lock(mu_);
      if (!listener_) return;
      // Most edits of the file touch what the proxy reads (policies, services, addresses) and
      // leave the namespaces, pods and labels the agent decides on as they were: nothing to
      // re-decide, nothing to report.
      if (published_ && *published_ == *view) {
        SM_DEBUG("agent") << (path_.empty() ? "<embedded>" : path_)
                          << " changed; its namespaces, pods and labels did not";
        return;
      }
      published_ = view;
      l = listener_;
    }
    SM_INFO("agent") << "labels changed in " << (path_.empty() ? "<embedded>" : path_);
    l(std::move(view));
  });
  listener_(first);
  if (watcher_) watcher_->start();
}

std::optional<PodMeta> LocalConfigLabels::fetch_pod(const std::string& namespace_name,
                                                    const std::string& name) {
  if (watcher_) {
    if (auto error = watcher_->reload()) {
      SM_WARN("agent") << "re-reading " << path_ << " for pod " << namespace_name << "/" << name
                       << ": " << error->to_string();
    }
  }
  auto current = store_.get();
  if (!current) return std::nullopt;
  auto view = view_of(*current);
  if (const PodMeta* meta = view->pod(namespace_name, name)) return *meta;
  return std::nullopt;
}

void LocalConfigLabels::stop() {
  if (watcher_) watcher_->stop();
  std::lock_guard lock(mu_);
  listener_ = nullptr;
}

}  // namespace sockmesh::agent
