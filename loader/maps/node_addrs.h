#pragma once
// The addresses capture exempts (SM_MAP_NODE_ADDRS): inbound connections from them reach an
// enrolled pod's app without capture, so that the kubelet's probes are not subject to mesh policy
// (Istio exempts probes the same way). The node agent writes the two probe SNAT addresses only
// (loader/attach/probe_snat.h), never the node's own: a host-network process is captured.
#include <set>
#include <string>
#include <vector>

#include "base/ip_address.h"
#include "loader/maps/pinned_map.h"
#include "loader/maps/result.h"
#include "sockmesh/consts.h"

namespace sockmesh::maps {

class NodeAddrMap {
 public:
  static Result<NodeAddrMap> open(const std::string& pin_root = SM_PIN_ROOT_DEFAULT);

  // Makes the map hold exactly `addresses`. Returns how many entries were added or removed.
  Result<size_t> replace(const std::set<IpAddress>& addresses);
  Result<std::set<IpAddress>> list() const;

 private:
  explicit NodeAddrMap(PinnedMap map) : map_(std::move(map)) {}
  PinnedMap map_;
};

}  // namespace sockmesh::maps
