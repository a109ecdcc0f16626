#include "proxy/labels.h"

namespace sockmesh::proxy {
namespace {

std::string workload_name(const state::Workload& w) {
  return w.workload_name.empty() ? w.name : w.workload_name;
}
std::string canonical(const state::Workload& w) {
  return w.canonical_name.empty() ? workload_name(w) : w.canonical_name;
}
std::string revision(const state::Workload& w) {
  return w.canonical_revision.empty() ? "latest" : w.canonical_revision;
}

}  // namespace

observe::TrafficLabels traffic_labels(observe::Reporter reporter, const ConnectionView& v) {
  observe::TrafficLabels l;
  l.reporter = reporter;
  if (v.source != nullptr) {
    l.source_workload = workload_name(*v.source);
    l.source_canonical_service = canonical(*v.source);
    l.source_canonical_revision = revision(*v.source);
    l.source_workload_namespace = v.source->namespace_name;
    l.source_app = canonical(*v.source);
    l.source_version = revision(*v.source);
    l.source_cluster = v.source->cluster_id;
  }
  l.source_principal = v.source_principal;
  if (v.destination != nullptr) {
    l.destination_workload = workload_name(*v.destination);
    l.destination_canonical_service = canonical(*v.destination);
    l.destination_canonical_revision = revision(*v.destination);
    l.destination_workload_namespace = v.destination->namespace_name;
    l.destination_app = canonical(*v.destination);
    l.destination_version = revision(*v.destination);
    l.destination_cluster = v.destination->cluster_id;
  }
  l.destination_principal = v.destination_principal;
  if (v.service != nullptr) {
    l.destination_service = v.service->hostname;
    l.destination_service_namespace = v.service->namespace_name;
    l.destination_service_name = v.service->name;
  }
  l.connection_security_policy =
      v.mutual_tls ? observe::SecurityPolicy::kMutualTls : observe::SecurityPolicy::kUnknown;
  return l;
}

void fill_access(observe::AccessRecord& r, const ConnectionView& v) {
  if (v.source != nullptr) {
    r.src_workload = v.source->name;
    r.src_namespace = v.source->namespace_name;
  }
  r.src_identity = v.source_principal;
  if (v.destination != nullptr) {
    r.dst_workload = v.destination->name;
    r.dst_namespace = v.destination->namespace_name;
  }
  r.dst_identity = v.destination_principal;
  if (v.service != nullptr) r.dst_service = v.service->hostname;
}

}  // namespace sockmesh::proxy
