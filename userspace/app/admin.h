#pragma once
// The operator's endpoints: admin on 127.0.0.1:15000 (/config_dump, /logging), Prometheus
// metrics on :15020 (/metrics, /stats/prometheus) and readiness on :15021 (/healthz/ready).
#include <functional>
#include <memory>
#include <string>

#include "identity/certificate_cache.h"
#include "observe/http_server.h"
#include "observe/metrics.h"
#include "proxy/proxy.h"
#include "proxy/zds.h"
#include "state/store.h"
#include "xds/delta_client.h"

namespace sockmesh::app {

struct AdminSources {
  proxy::Proxy* proxy = nullptr;
  state::StateStore* store = nullptr;
  identity::CertificateCache* certificates = nullptr;
  observe::Registry* metrics = nullptr;
  std::string node_name;
  std::string config_source;              // file path or "embedded default"
  std::string bpf_pin_root;               // datapath counters are exported from here when pinned
  const proxy::ZdsClient* zds = nullptr;  // in-pod mode: ready only after the first snapshot
  const xds::DeltaClient* xds = nullptr;  // xDS mode: ready only after the first complete sync
};

// The xDS client's counters in Prometheus text ("" without a client).
std::string xds_metrics(const xds::DeltaClient* client);

// The kernel datapath's per-CPU counters (summed) in Prometheus text, or "" when the maps are not
// pinned under `pin_root` (no datapath on this node).
std::string datapath_metrics(const std::string& pin_root);

// JSON of workloads, services, policies and certificates (with expiry), as /config_dump serves.
std::string config_dump_json(const AdminSources& s);

void add_admin_routes(observe::HttpServer& server, const AdminSources& s);
void add_metrics_routes(observe::HttpServer& server, const AdminSources& s);
void add_readiness_routes(observe::HttpServer& server, const AdminSources& s);

}  // namespace sockmesh::app
