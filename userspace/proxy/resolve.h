#pragma once
// Where an outbound connection goes: a service VIP picks one of the service's endpoints (round
// robin, per service) and maps the port; a workload IP is used as is; anything else is outside
// the mesh.
#include <string>

#include "base/ip_address.h"
#include "state/snapshot.h"

namespace sockmesh::proxy {

struct Route {
  const state::Workload* workload = nullptr;  // null: outside the mesh
  const state::Service* service = nullptr;    // set when the destination was a VIP
  Endpoint target;                            // workload IP (or the original address), port
  std::string error;                          // set when a VIP cannot be served
};

Route resolve(const state::Snapshot& snap, const Endpoint& destination);

}  // namespace sockmesh::proxy
