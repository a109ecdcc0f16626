#pragma once
// How the node agent hands enrolled pods to the proxy: the proxy opens its 15001/15006/15008
// listeners inside each pod's network namespace and registers them for tc. The implementation is
// ZdsServer (zds_server.h); tests and the agent's own tests can substitute a fake.
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "loader/maps/result.h"

namespace sockmesh::agent {

struct PodWorkload {
  std::string uid;  // the pod's UID: the key of every later call
  std::string name;
  std::string namespace_name;
  std::string service_account;
  std::vector<IpAddress> ips;  // the proxy registers its listeners under each of them
  std::string netns_path;      // /proc/<pid>/ns/net, /run/netns/<name>, /var/run/netns/cni-...
};

// Hands pods to the proxy. Every call blocks until the proxy acknowledged it (the listeners exist,
// or are closed) or until the implementation's timeout, and is safe to call from any thread.
//
// Order at start-up: call sync() first, once the agent knows every pod on the node. Until then
// nothing is sent: handing over means sending a snapshot, and a partial one would make a running
// proxy close the listeners of the pods not yet known. add() before the first sync() only records
// the pod (the sync's list then replaces the record) and returns an error that says so.
class WorkloadHandoff {
 public:
  virtual ~WorkloadHandoff() = default;

  // Opens `pod.netns_path` and passes the netns to the proxy. Adding a pod that the proxy has
  // already, in the same netns with the same IPs, is a no-op; otherwise (the sandbox was
  // re-created, the IPs changed) the old listeners are replaced. The pod is remembered even when
  // the proxy is unreachable, and handed over whenever the proxy (re)connects; the error then says
  // so.
  virtual maps::Status add(const PodWorkload& pod) = 0;

  // The proxy closes the pod's listeners. Removing an unknown pod succeeds. While the proxy is
  // unreachable, this only forgets the pod (the next snapshot leaves it out).
  virtual maps::Status remove(const std::string& uid) = 0;

  // The complete set of pods on this node (e.g. after the agent restarted): each is added (or
  // kept, when its netns cannot be opened any more), and the proxy closes every pod not listed.
  // Errors of single pods are reported together; the others still take effect.
  virtual maps::Status sync(const std::vector<PodWorkload>& all) = 0;
};

}  // namespace sockmesh::agent
