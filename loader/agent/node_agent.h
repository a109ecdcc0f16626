#pragma once
// The node agent's core: it answers the CNI plugin's pod events, decides which pods belong to the
// mesh from the labels a LabelSource publishes, and keeps each pod's enrollment (the loader's tc
// capture and workload records) and its handoff to the proxy in step with that decision.
//
// Enrolling hands the pod to the proxy first and switches capture on second, so that a running
// pod whose namespace gets labelled never has captured connections without a proxy listener;
// unenrolling switches capture off first and takes the pod from the proxy second. A step that
// fails undoes the step before it: a pod is either enrolled and handed over, or neither.
//
// Every pod seen through CNI ADD is remembered with its netns (also the ones not enrolled), in a
// file, so that label changes can enroll and unenroll running pods, and a restarted agent knows
// where its enrolled pods live.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cni/event/pod_event.h"
#include "loader/agent/enroller.h"
#include "loader/agent/handoff.h"
#include "loader/agent/label_source.h"
#include "loader/agent/pod_discovery.h"
#include "loader/agent/pod_record.h"

namespace sockmesh::agent {

struct AgentOptions {
  std::vector<std::string> excluded_namespaces = {"kube-system"};
  std::string trust_domain = "cluster.local";
  std::string state_file;  // the pod records; empty: kept in memory only
  std::string hints_file;  // namespace hints for the plugin; empty: not published
  // How long a CNI event waits for the label source's first view before answering "unavailable".
  std::chrono::milliseconds labels_wait{5000};
};

class NodeAgent {
 public:
  // `enroller` must outlive the agent; `handoff` may be null (no proxy to hand pods to);
  // `finder` (may be null) looks for running pods the source lists but CNI never showed.
  NodeAgent(AgentOptions options, Enroller* enroller, std::unique_ptr<WorkloadHandoff> handoff,
            PodNetnsFinder* finder = nullptr);
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Restores the pod records and reconciles them with the workload map: pods whose netns still
  // exists are adopted, pods whose netns is gone are cleaned up; records in the map that the
  // agent has no note of are adopted by their netns cookie, or removed. Then hands every enrolled
  // pod to the proxy (sync). Call once, before events and labels.
  maps::Status start();

  // Used for pods that are not in the latest view (fetch_pod). May be null; must outlive the
  // agent otherwise.
  void set_label_source(LabelSource* source) { source_ = source; }

  // A CNI event. Blocks until enrollment and handoff are done (or failed and undone).
  cni::AgentReply handle(const cni::PodEvent& event);
  // The plugin went away before the reply to `event` reached it (its deadline passed): the
  // runtime counts the ADD as failed, so an enrollment it made is undone.
  void reply_lost(const cni::PodEvent& event);

  // A new view of labels: every known pod is decided again (and, with a finder, running pods of
  // the view that CNI never showed), and the plugin's namespace hints are rewritten.
  void update_labels(LabelViewPtr view);

  // Forgets pods whose netns has gone without a CNI DEL, after undoing their enrollment.
  void sweep();

  // Events still waiting for the first labels answer "unavailable" now (the agent is stopping).
  void shutdown();

  // Takes every enrolled pod out of the mesh (capture off, then taken from the proxy) and clears
  // the agent's record file: what an uninstall does before the datapath is removed. Pods whose
  // unenrollment fails are named in the error; the others are done.
  maps::Status unenroll_all();

  PodRecords pods() const;
  bool labels_known() const;
  // CNI ADDs refused because the pod's metadata was not known (its enrollment held rather than
  // made under a guessed service account), since start.
  uint64_t adds_held_for_metadata() const { return adds_held_for_metadata_.load(); }

 private:
  cni::AgentReply add_or_check(const cni::PodEvent& event, std::unique_lock<std::mutex>& lock);
  cni::AgentReply del(const cni::PodEvent& event);
  // Metadata for a record from the current view (by namespace/name, else by uid).
  const PodMeta* meta_for(const PodRecord& record) const;
  Decision decide_locked(const PodRecord& record, const PodMeta* meta) const;
  maps::Status enroll_locked(PodRecord& record);
  maps::Status unenroll_locked(PodRecord& record);
  void reconcile_locked();
  void discover_locked();
  void save_locked();
  void publish_hints_locked();

  const AgentOptions options_;
  Enroller* const enroller_;
  const std::unique_ptr<WorkloadHandoff> handoff_;
  PodNetnsFinder* const finder_;
  LabelSource* source_ = nullptr;

  mutable std::mutex mu_;
  std::condition_variable labels_cv_;
  PodRecords pods_;
  LabelViewPtr view_;  // null until the source's first view
  bool stopping_ = false;
  std::atomic<uint64_t> adds_held_for_metadata_{0};
};

}  // namespace sockmesh::agent
