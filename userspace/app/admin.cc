#include "app/admin.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "loader/maps/counters.h"
#include "loader/maps/workload_map.h"

namespace sockmesh::app {
namespace {

using nlohmann::json;

std::string iso8601(identity::TimePoint t) {
  auto secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

json ips_json(const std::vector<IpAddress>& ips) {
  json a = json::array();
  for (const auto& ip : ips) a.push_back(ip.to_string());
  return a;
}

json networks_json(const std::vector<IpNetwork>& nets) {
  json a = json::array();
  for (const auto& n : nets) a.push_back(n.to_string());
  return a;
}

json match_json(const state::PolicyMatch& m) {
  json j = json::object();
  auto put = [&](const char* k, const auto& v) {
    if (!v.empty()) j[k] = v;
  };
  put("namespaces", m.namespaces);
  put("notNamespaces", m.not_namespaces);
  put("principals", m.principals);
  put("notPrincipals", m.not_principals);
  put("serviceAccounts", m.service_accounts);
  put("notServiceAccounts", m.not_service_accounts);
  if (!m.source_ips.empty()) j["sourceIps"] = networks_json(m.source_ips);
  if (!m.not_source_ips.empty()) j["notSourceIps"] = networks_json(m.not_source_ips);
  if (!m.destination_ips.empty()) j["destinationIps"] = networks_json(m.destination_ips);
  if (!m.not_destination_ips.empty()) j["notDestinationIps"] = networks_json(m.not_destination_ips);
  put("destinationPorts", m.destination_ports);
  put("notDestinationPorts", m.not_destination_ports);
  return j;
}

}  // namespace

std::string config_dump_json(const AdminSources& s) {
  auto snap = s.store->get();
  json out;
  out["node"] = s.node_name;
  out["configSource"] = s.config_source;
  json workloads = json::array();
  for (const auto& w : snap->workloads()) {
    json services = json::object();
    for (const auto& [svc, ports] : w.services) {
      json p = json::object();
      for (auto [from, to] : ports) p[std::to_string(from)] = to;
      services[svc] = p;
    }
    workloads.push_back({{"uid", w.uid},
                         {"name", w.name},
                         {"namespace", w.namespace_name},
                         {"serviceAccount", w.service_account},
                         {"trustDomain", w.trust_domain},
                         {"identity", w.identity()},
                         {"node", w.node},
                         {"local", w.node == s.node_name},
                         {"workloadIps", ips_json(w.ips)},
                         {"protocol", w.protocol == state::Protocol::kHbone ? "HBONE" : "TCP"},
                         {"services", services},
                         // The rest under ztunnel's names, for tools that read its dump.
                         {"workloadName", w.workload_name},
                         {"canonicalName", w.canonical_name},
                         {"canonicalRevision", w.canonical_revision},
                         {"clusterId", w.cluster_id},
                         {"network", w.network},
                         {"authorizationPolicies", w.authorization_policies}});
  }
  out["workloads"] = workloads;
  json services = json::array();
  for (const auto& svc : snap->services()) {
    json vips = json::array();
    for (const auto& v : svc.vips) vips.push_back(v.network + "/" + v.ip.to_string());
    json ports = json::object();
    for (auto [from, to] : svc.ports) ports[std::to_string(from)] = to;
    // ztunnel's shape: the service's endpoints by workload uid, each with its port map (service
    // port -> the workload's target port, as the workload's entry for this service names it).
    json endpoints = json::object();
    for (const state::Workload* w : snap->endpoints_of(svc)) {
      json port = json::object();
      if (auto it = w->services.find(svc.key()); it != w->services.end()) {
        for (auto [from, to] : it->second) port[std::to_string(from)] = to;
      }
      endpoints[w->uid] = {
          {"workloadUid", w->uid}, {"service", svc.key()}, {"port", port}, {"status", "Healthy"}};
    }
    services.push_back({{"name", svc.name},
                        {"namespace", svc.namespace_name},
                        {"hostname", svc.hostname},
                        {"vips", vips},
                        {"ports", ports},
                        {"endpoints", endpoints},
                        {"subjectAltNames", svc.subject_alt_names}});
  }
  out["services"] = services;
  json policies = json::array();
  for (const auto& p : snap->policies()) {
    json rules = json::array();
    for (const auto& rule : p.rules) {
      json clauses = json::array();
      for (const auto& clause : rule) {
        json matches = json::array();
        for (const auto& m : clause) matches.push_back(match_json(m));
        clauses.push_back(matches);
      }
      rules.push_back(clauses);
    }
    const char* scope = p.scope == state::PolicyScope::kGlobal      ? "Global"
                        : p.scope == state::PolicyScope::kNamespace ? "Namespace"
                                                                    : "WorkloadSelector";
    policies.push_back({{"name", p.name},
                        {"namespace", p.namespace_name},
                        {"scope", scope},
                        {"action", p.action == state::PolicyAction::kAllow ? "Allow" : "Deny"},
                        {"rules", rules},
                        {"dryRun", p.dry_run}});
  }
  out["policies"] = policies;
  if (s.xds != nullptr) {
    auto st = s.xds->status();
    json types = json::object();
    for (const auto& [type, t] : st.types) {
      json j = {{"answered", t.answered},
                {"ackedVersion", t.acked_version},
                {"ackedNonce", t.acked_nonce},
                {"acks", t.acks},
                {"nacks", t.nacks}};
      if (!t.nack_error.empty()) {
        j["lastNack"] = {{"nonce", t.nacked_nonce}, {"error", t.nack_error}};
      }
      types[type] = j;
    }
    json terminations = json::object();
    for (const auto& [reason, n] : st.terminations) terminations[reason] = n;
    out["xds"] = {
        {"connected", st.connected},  {"synced", st.synced}, {"streams", st.streams},
        {"lastError", st.last_error}, {"types", types},      {"terminations", terminations}};
  }
  if (s.certificates != nullptr) {
    // ztunnel's shape (istioctl ztunnel-config certificates reads it): one entry per identity,
    // state Available / Initializing / "Unavailable: <why>", the chain leaf first and the roots.
    // renewAt and lastError are ours; ztunnel's readers ignore them.
    auto cs = s.certificates->snapshot();
    auto cert_json = [](X509* c) {
      json e = {{"pem", identity::to_pem(c)}, {"serialNumber", identity::serial_hex(c)}};
      if (auto nb = identity::to_time_point(X509_get0_notBefore(c))) e["validFrom"] = iso8601(*nb);
      if (auto na = identity::to_time_point(X509_get0_notAfter(c))) {
        e["expirationTime"] = iso8601(*na);
      }
      return e;
    };
    json roots = json::array();
    for (const auto& r : cs.roots) {
      roots.push_back({{"pem", r.pem},
                       {"serialNumber", r.serial},
                       {"validFrom", iso8601(r.not_before)},
                       {"expirationTime", iso8601(r.not_after)},
                       {"subject", r.subject},
                       {"sha256", r.sha256}});
    }
    json certs = json::array();
    for (const auto& c : cs.certificates) {
      json e = {{"identity", c.identity}};
      json chain = json::array();
      if (c.state == "valid" || c.state == "renewing") {
        e["state"] = "Available";
        chain.push_back(cert_json(c.key->leaf()));
        for (const auto& x : c.key->chain()) chain.push_back(cert_json(x.get()));
        e["rootCerts"] = roots;
        e["renewAt"] = iso8601(c.renew_at);
      } else if (c.state == "issuing") {
        e["state"] = "Initializing";
        e["rootCerts"] = json::array();
      } else {
        e["state"] = "Unavailable: " + (c.last_error.empty()
                                            ? "certificate expired at " + iso8601(c.not_after)
                                            : c.last_error);
        e["rootCerts"] = json::array();
      }
      e["certChain"] = chain;
      if (!c.last_error.empty()) e["lastError"] = c.last_error;
      certs.push_back(e);
    }
    out["certificates"] = certs;
    out["certificateIssuer"] = cs.issuer;
  }
  if (s.proxy != nullptr) {
    json listeners = json::array();
    for (const auto& [role, at] : s.proxy->listening()) {
      listeners.push_back({{"role", role}, {"address", at.to_string()}});
    }
    out["listeners"] = listeners;
    out["activeConnections"] = s.proxy->active_connections();
    // Which way each live connection goes (the access log says it when the connection ends).
    constexpr size_t kListed = 1000;
    auto live = s.proxy->connections(std::chrono::milliseconds(500), kListed);
    auto now = std::chrono::steady_clock::now();
    json conns = json::array();
    for (const auto& c : live.connections) {
      const auto& a = c.access;
      json e = {{"direction", c.direction},
                {"path", c.path},
                {"relay", c.relay},
                {"src", a.src_addr},
                {"dst", a.dst_addr},
                {"bytesSent", a.bytes_sent},
                {"bytesReceived", a.bytes_recv},
                {"ageSeconds",
                 std::chrono::duration_cast<std::chrono::milliseconds>(now - a.started).count() /
                     1000.0}};
      if (!a.src_identity.empty()) e["srcIdentity"] = a.src_identity;
      if (!a.dst_identity.empty()) e["dstIdentity"] = a.dst_identity;
      if (!a.dst_hbone_addr.empty()) e["hboneAddress"] = a.dst_hbone_addr;
      if (!a.dst_service.empty()) e["service"] = a.dst_service;
      conns.push_back(std::move(e));
    }
    out["connections"] = conns;
    if (live.total > live.connections.size())
      out["connectionsNotListed"] = live.total - live.connections.size();
    if (live.unanswered_workers > 0) out["connectionsUnansweredWorkers"] = live.unanswered_workers;
  }
  // The pods enrolled on this node, as the loader's workload map has them (the identity each
  // one's certificate is issued for), whether or not the config file lists them.
  if (!s.bpf_pin_root.empty() && s.bpf_pin_root != "off") {
    if (auto map = maps::WorkloadMapReader::open(s.bpf_pin_root)) {
      if (auto listed = map->list()) {
        json enrolled = json::array();
        for (const auto& [ip, r] : *listed) {
          enrolled.push_back({{"ip", ip.to_string()},
                              {"uid", r.uid},
                              {"namespace", r.namespace_name},
                              {"serviceAccount", r.service_account},
                              {"identity", r.spiffe_id()},
                              {"enrolled", r.enrolled},
                              {"captureInbound", r.capture_inbound}});
        }
        out["enrolledWorkloads"] = enrolled;
      }
    }
  }
  return out.dump(2) + "\n";
}

void add_admin_routes(observe::HttpServer& server, const AdminSources& s) {
  server.route("/config_dump", [s](const observe::HttpRequest&) {
    return observe::HttpResponse{200, "application/json", config_dump_json(s)};
  });
  // GET shows the levels; POST ?level=debug sets all, ?access=debug sets one scope.
  server.route("/logging", [](const observe::HttpRequest& r) {
    if (r.method == "POST" || r.method == "PUT") {
      // All or nothing: every value is checked before any is applied; `level` (the default,
      // which resets the scopes) goes first, so `?access=warn&level=info` keeps access=warn.
      std::vector<std::pair<std::string, log::Level>> changes;
      for (const auto& [k, v] : r.query) {
        if (k != "level" && !log::is_known_scope(k)) {
          std::string known;
          for (auto scope : log::known_scopes()) known += " " + std::string(scope);
          return observe::HttpResponse{400, "text/plain; charset=utf-8",
                                       "unknown scope '" + k +
                                           "'; use level (all scopes) or "
                                           "one of:" +
                                           known + "; nothing was changed\n"};
        }
        log::Level level;
        if (!log::parse_level(v, &level)) {
          return observe::HttpResponse{400, "text/plain; charset=utf-8",
                                       "unknown level '" + v + "' for '" + k +
                                           "'; use trace, debug, info, warn, error or off; "
                                           "nothing was changed\n"};
        }
        if (k == "level") {
          changes.insert(changes.begin(), {k, level});
        } else {
          changes.emplace_back(k, level);
        }
      }
      for (const auto& [k, level] : changes) {
        if (k == "level") {
          log::set_level(level);
        } else {
          log::set_level(k, level);  // known: checked above
        }
        SM_INFO("admin") << "log level changed: " << k << "=" << r.query.at(k);
      }
    }
    return observe::HttpResponse{200, "text/plain; charset=utf-8",
                                 "current log levels: " + log::describe_levels() + "\n"};
  });
  server.route("/", [](const observe::HttpRequest&) {
    return observe::HttpResponse{200, "text/plain; charset=utf-8",
                                 "sockmesh admin: /config_dump /logging\n"};
  });
}

std::string datapath_metrics(const std::string& pin_root) {
  if (pin_root.empty()) return "";
  auto reader = maps::CounterReader::open(pin_root);
  if (!reader) return "";
  auto values = reader->read();
  if (!values) return "";
  std::string out;
  for (int i = 0; i < SM_CNT_COUNT; ++i) {
    auto c = static_cast<sm_counter>(i);
    std::string name = "sockmesh_datapath_" + std::string(maps::counter_name(c)) + "_total";
    out += "# HELP " + name + " " + std::string(maps::counter_help(c)) + "\n";
    out += "# TYPE " + name + " counter\n";
    out += name + " " + std::to_string((*values)[i]) + "\n";
  }
  // The bypass is optional (the loader goes on without it when the kernel refuses it).
  const std::string link = pin_root + "/" SM_PIN_LINKS_DIR "/" SM_PIN_LINK_SOCKOPS;
  out +=
      "# HELP sockmesh_datapath_bypass_attached 1 when the sockmap bypass (sockops + sk_msg) "
      "is attached, 0 when app <-> proxy traffic takes the TCP/IP stack\n"
      "# TYPE sockmesh_datapath_bypass_attached gauge\n"
      "sockmesh_datapath_bypass_attached " +
      std::string(access(link.c_str(), F_OK) == 0 ? "1" : "0") + "\n";
  return out;
}

std::string xds_metrics(const xds::DeltaClient* client) {
  if (client == nullptr) return "";
  auto st = client->status();
  auto short_type = [](const std::string& url) { return url.substr(url.rfind('/') + 1); };
  std::string out =
      "# HELP istio_xds_connection_terminations_total xDS streams to istiod that ended, by "
      "reason (the gRPC status, or why none could start)\n"
      "# TYPE istio_xds_connection_terminations_total counter\n";
  for (const auto& [reason, n] : st.terminations) {
    out += "istio_xds_connection_terminations_total{reason=\"" + reason + "\"} " +
           std::to_string(n) + "\n";
  }
  out +=
      "# HELP sockmesh_xds_acks_total xDS responses applied and ACKed, by type\n"
      "# TYPE sockmesh_xds_acks_total counter\n";
  for (const auto& [type, t] : st.types) {
    out += "sockmesh_xds_acks_total{type=\"" + short_type(type) + "\"} " + std::to_string(t.acks) +
           "\n";
  }
  out +=
      "# HELP sockmesh_xds_nacks_total xDS responses refused (NACKed), by type\n"
      "# TYPE sockmesh_xds_nacks_total counter\n";
  for (const auto& [type, t] : st.types) {
    out += "sockmesh_xds_nacks_total{type=\"" + short_type(type) + "\"} " +
           std::to_string(t.nacks) + "\n";
  }
  out +=
      "# HELP sockmesh_xds_connected 1 while the xDS stream to istiod is up\n"
      "# TYPE sockmesh_xds_connected gauge\n"
      "sockmesh_xds_connected " +
      std::string(st.connected ? "1" : "0") + "\n";
  return out;
}

void add_metrics_routes(observe::HttpServer& server, const AdminSources& s) {
  auto handler = [s](const observe::HttpRequest&) {
    return observe::HttpResponse{
        200, "text/plain; version=0.0.4; charset=utf-8",
        s.metrics->render() + datapath_metrics(s.bpf_pin_root) + xds_metrics(s.xds)};
  };
  server.route("/metrics", handler);
  server.route("/stats/prometheus", handler);
}

void add_readiness_routes(observe::HttpServer& server, const AdminSources& s) {
  server.route("/healthz/ready", [s](const observe::HttpRequest&) {
    if (s.proxy == nullptr || !s.proxy->ready()) {
      return observe::HttpResponse{503, "text/plain; charset=utf-8",
                                   "not ready: listeners not open, or draining\n"};
    }
    if (s.zds != nullptr && !s.zds->synced()) {
      return observe::HttpResponse{
          503, "text/plain; charset=utf-8",
          "not ready: waiting for the node agent's first snapshot (ZDS)\n"};
    }
    if (s.xds != nullptr && !s.xds->synced()) {
      return observe::HttpResponse{503, "text/plain; charset=utf-8",
                                   "not ready: waiting for the first complete xDS sync from "
                                   "istiod (workloads and policies)\n"};
    }
    return observe::HttpResponse{200, "text/plain; charset=utf-8", "ready\n"};
  });
}

}  // namespace sockmesh::app
