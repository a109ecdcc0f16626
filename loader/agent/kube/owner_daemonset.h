#pragma once
// Whether the agent's own DaemonSet still exists: the one question that tells an uninstall from an
// upgrade or a restart when the agent gets SIGTERM. `helm uninstall` (or `kubectl delete ds`)
// deletes the DaemonSet first and its pods after, so a stopping agent whose DaemonSet is gone, or
// carries a deletionTimestamp, is being removed for good; one whose DaemonSet is still there is
// being replaced (a rolling update) or restarted, and must leave the datapath to its successor.
#include <string>

#include "loader/agent/kube/api_client.h"

namespace sockmesh::agent::kube {

enum class OwnerState {
  kPresent,   // the DaemonSet exists and is not being deleted: an upgrade or a restart
  kDeleting,  // it exists with metadata.deletionTimestamp (foreground deletion)
  kGone,      // the API answers 404: deleted
  kUnknown,   // the API could not be asked, or answered something else
};

const char* owner_state_name(OwnerState s);

struct OwnerAnswer {
  OwnerState state = OwnerState::kUnknown;
  std::string detail;  // for the log: the status, the deletionTimestamp, or the error
};

// GET /apis/apps/v1/namespaces/<ns>/daemonsets/<name>. `owner` is "<namespace>/<name>".
OwnerAnswer owner_daemonset_state(ApiClient& api, const std::string& owner);

// Splits "<namespace>/<name>"; false (and `error` set) when it is not of that form.
bool parse_owner(const std::string& owner, std::string* ns, std::string* name, std::string* error);

}  // namespace sockmesh::agent::kube
