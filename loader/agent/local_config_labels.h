#pragma once
// Labels from the local config file (the proxy's format): `namespaces: [{name, labels}]` and each
// workload's `labels` are sockmesh's extensions for a machine without an API server. The file is
// polled (config::ConfigWatcher): a valid change is published as a new view, an invalid one is
// logged and the previous view stays. Without a file, the embedded default is published once.
#include <memory>
#include <mutex>
#include <string>

#include "config/watcher.h"
#include "loader/agent/label_source.h"
#include "loader/maps/result.h"
#include "state/store.h"

namespace sockmesh::agent {

// The view of a parsed config: namespaces and their labels, workloads as pods.
LabelViewPtr view_of(const state::Snapshot& snapshot);

class LocalConfigLabels final : public LabelSource {
 public:
  // `path` empty: the embedded default config.
  explicit LocalConfigLabels(std::string path, std::chrono::milliseconds interval =
                                                   config::ConfigWatcher::kDefaultInterval);
  ~LocalConfigLabels() override;

  // Reads the file once; a bad or missing file is an error here (but not later).
  maps::Status load();

  std::string name() const override { return "local-config"; }
  void start(Listener listener) override;
  void stop() override;
  // A pod the agent's current view lacks (its CNI ADD came before the file's next poll): the
  // file is read again now, and the pod looked up in it.
  std::optional<PodMeta> fetch_pod(const std::string& namespace_name,
                                   const std::string& name) override;

 private:
  const std::string path_;
  const std::chrono::milliseconds interval_;
  state::StateStore store_;
  std::unique_ptr<config::ConfigWatcher> watcher_;
  Listener listener_;
  LabelViewPtr published_;  // the view listener_ was given last
  std::mutex mu_;           // guards listener_ and published_ against the watcher's thread
};

}  // namespace sockmesh::agent
