#pragma once
// Istio's metric labels and access-log fields for one connection, from what the proxy knows.
#include <string>

#include "observe/access_log.h"
#include "observe/metrics.h"
#include "state/snapshot.h"

namespace sockmesh::proxy {

struct ConnectionView {
  const state::Workload* source = nullptr;
  std::string source_principal;
  const state::Workload* destination = nullptr;
  std::string destination_principal;
  const state::Service* service = nullptr;
  bool mutual_tls = false;
};

observe::TrafficLabels traffic_labels(observe::Reporter reporter, const ConnectionView& v);
void fill_access(observe::AccessRecord& r, const ConnectionView& v);

}  // namespace sockmesh::proxy
