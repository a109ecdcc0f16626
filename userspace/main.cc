// sockmesh-proxy: wires the configuration, identities, TLS, metrics and the proxy roles together,
// serves the admin endpoints, and drains on SIGTERM.
#include <boost/asio/io_context.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <malloc.h>
#include <pthread.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>
#include <iostream>

#include "app/admin.h"
#include "app/options.h"
#include "app/preflight.h"
#include "base/log.h"
#include "base/version.h"
#include "config/local_config.h"
#include "config/watcher.h"
#include "identity/builtin_ca.h"
#include "identity/certificate_cache.h"
#include "identity/file_certificates.h"
#include "identity/istio_ca_client.h"
#include "identity/kube_csr_issuer.h"
#include "observe/http_server.h"
#include "proxy/bypass_pinning.h"
#include "proxy/enrolled_workloads.h"
#include "proxy/proxy.h"
#include "proxy/zds.h"
#include "xds/delta_client.h"

using namespace sockmesh;

namespace {

int fail(const std::string& message) {
  SM_ERROR("main") << message;
  std::fprintf(stderr, "sockmesh-proxy: %s\n", message.c_str());
  return 1;
}

// Every proxied connection holds two or three descriptors (client, upstream, a share of a pooled
// HBONE connection): the default soft limit of 1024 would cap a node at a few hundred. Raise the
// soft limit to the hard one, as a node proxy must.
// The thread of the admin, metrics and readiness servers. stop() (or the destructor) closes them
// and joins; what their sessions still hold goes with the io_context.
struct HttpThread {
  boost::asio::io_context io;
  std::vector<std::unique_ptr<observe::HttpServer>> servers;
  std::thread thread{[this] {
    pthread_setname_np(pthread_self(), "sm-http");
    auto work = boost::asio::make_work_guard(io);
    io.run();
  }};
  ~HttpThread() { stop(); }
  void stop() {
    if (!thread.joinable()) return;
    boost::asio::post(io, [this] {
      servers.clear();
      io.stop();
    });
    thread.join();
  }
};

void raise_file_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  rlim_t before = lim.rlim_cur;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      SM_WARN("main") << "could not raise the open-file limit from " << before << ": "
                      << std::strerror(errno);
      return;
    }
  }
  SM_INFO("main") << "open-file limit " << lim.rlim_cur
                  << (before < lim.rlim_cur ? " (raised from " + std::to_string(before) + ")" : "");
}

// The data path reads into 256 KiB buffers and frees them once the peer has the bytes. glibc's
// default, dynamic thresholds hand such blocks back to the kernel and fault fresh pages in for the
// next read, again and again: fixed thresholds keep them in the heap. One stream through two
// proxies moved 4.6 Gbit/s before and 5.5 after (medians of 4, bench/run.py's sockmesh path);
// the cost is up to 8 MiB of free heap held per worker thread after a burst. An operator's own
// GLIBC_TUNABLES for malloc take precedence.
void tune_allocator() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) {
    SM_INFO("main") << "malloc tuning left to GLIBC_TUNABLES";
    return;
  }
  constexpr int kMmapThreshold = 1 << 20;  // blocks under 1 MiB come from the heap
  constexpr int kTrimThreshold = 8 << 20;  // free heap is returned above 8 MiB
  if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) != 1 ||
      mallopt(M_TRIM_THRESHOLD, kTrimThreshold) != 1) {
    SM_WARN("main") << "could not set malloc thresholds; the data path will fault pages in";
  }
}

// The heap keeps up to the trim threshold of free memory per thread after a burst. Once the proxy
// has had no connection for a whole interval, hand the free pages back, once per idle spell.
class IdleTrimmer {
 public:
  explicit IdleTrimmer(proxy::Proxy& p) : thread_([this, &p] { run(p); }) {}
  ~IdleTrimmer() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  IdleTrimmer(const IdleTrimmer&) = delete;
  IdleTrimmer& operator=(const IdleTrimmer&) = delete;

 private:
  void run(proxy::Proxy& p) {
    pthread_setname_np(pthread_self(), "sm-trim");
    std::unique_lock lock(mu_);
    int idle_checks = 0;
    while (!cv_.wait_for(lock, std::chrono::seconds(2), [&] { return stop_; })) {
      idle_checks = p.active_connections() == 0 ? idle_checks + 1 : 0;
      if (idle_checks == 2) {  // idle at two checks in a row: a whole interval, at least
        malloc_trim(0);
        SM_DEBUG("main") << "idle: free heap returned to the kernel";
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the rest is built
};

}  // namespace

int main(int argc, char** argv) {
  if (print_version_if_asked(argc, argv, "sockmesh-proxy")) return 0;
  app::Options opts;
  if (auto err = app::parse_options({argv + 1, argv + argc}, &opts)) {
    std::fprintf(stderr, "sockmesh-proxy: %s\n\n%s", err->c_str(), app::usage().c_str());
    return 2;
  }
  if (opts.help) {
    std::cout << app::usage();
    return 0;
  }
  if (opts.print_default_config) {
    std::cout << config::embedded_default_config();
    return 0;
  }
  log::Level level;
  if (!log::parse_level(opts.log_level, &level)) return fail("unknown log level " + opts.log_level);
  log::set_level(level);
  const auto& cfg = opts.proxy;
  SM_INFO("main") << "sockmesh-proxy starting: node=" << cfg.node_name
                  << " workers=" << cfg.effective_workers()
                  << " trust_domain=" << cfg.trust_domain;
  raise_file_limit();
  tune_allocator();
  for (const auto& finding : app::check_capabilities(cfg, app::effective_capabilities())) {
    if (finding.fatal) return fail("cannot start: " + finding.message);
    SM_WARN("main") << finding.message;
  }

  // Mesh state, one source at a time as ztunnel: istiod over xDS, else the local config file
  // (watched), else the embedded default.
  state::StateStore store;
  std::unique_ptr<config::ConfigWatcher> watcher;
  std::unique_ptr<xds::DeltaClient> xds_client;
  std::string config_source;
  if (!opts.xds.address.empty()) {
    if (!cfg.config_file.empty()) {
      return fail("both --xds-address (XDS_ADDRESS) and --config (LOCAL_XDS_PATH) are set; "
                  "mesh state comes from one source: unset one");
    }
    config_source = "xds " + opts.xds.address;
    xds::DeltaClientOptions xo;
    xo.address = opts.xds.address;
    xo.root_ca_file = opts.xds.root_ca;
    xo.token_file = opts.xds.token_file;
    xo.cluster_id = opts.xds.cluster_id;
    xo.node_name = cfg.node_name;
    xo.pod_name = opts.xds.pod_name;
    xo.pod_namespace = opts.xds.pod_namespace;
    xo.instance_ip = opts.xds.instance_ip;
    xo.max_message_bytes = static_cast<int>(opts.xds.max_message_bytes);
    SM_INFO("main") << "mesh state from istiod at " << xo.address << " (node id "
                    << xds::DeltaClient::node_id(xo) << "); not ready until the first sync";
    xds_client = std::make_unique<xds::DeltaClient>(std::move(xo), &store);
  } else if (cfg.config_file.empty()) {
    config_source = "embedded default";
    auto parsed = config::parse_local_config(config::embedded_default_config(), "<embedded>");
    if (const auto* e = config::error_of(parsed)) return fail(e->to_string());
    store.set(config::snapshot_of(parsed));
  } else {
    config_source = cfg.config_file;
    watcher = std::make_unique<config::ConfigWatcher>(cfg.config_file, &store, cfg.config_poll);
    if (auto e = watcher->reload()) return fail("bad configuration: " + e->to_string());
    watcher->start();
  }
  if (!xds_client) {
    auto snap = store.get();
    size_t local = 0;
    for (const auto& w : snap->workloads()) local += w.node == cfg.node_name ? 1 : 0;
    SM_INFO("main") << "configuration from " << config_source << ": "
                    << snap->workloads().size() << " workloads (" << local
                    << " on this node), " << snap->services().size() << " services, "
                    << snap->policies().size() << " policies";
  }

  // Identities, one issuer. --ca-provider names it; auto (the default) takes Istio's CA when a CA
  // address is set, else mounted certificates when --certs-dir is set, else the built-in CA. The
  // Kubernetes CSR API is used only when named. Settings of the issuers not chosen are ignored,
  // and the log says so.
  observe::Registry metrics;
  std::shared_ptr<identity::CertificateIssuer> issuer;
  identity::CertificateCacheOptions cache_options;
  app::CaProvider provider = opts.ca_provider;
  std::string chosen_by = "--ca-provider " + std::string(app::ca_provider_name(provider));
  if (provider == app::CaProvider::kAuto) {
    provider = !cfg.ca_address.empty()  ? app::CaProvider::kIstio
               : !cfg.certs_dir.empty() ? app::CaProvider::kFiles
                                        : app::CaProvider::kBuiltin;
    chosen_by = provider == app::CaProvider::kIstio   ? "auto: a CA address is set"
                : provider == app::CaProvider::kFiles ? "auto: no CA address, --certs-dir set"
                                                      : "auto: no CA address, no --certs-dir";
  }
  std::string ignored;
  auto note_ignored = [&ignored](bool set, app::CaProvider mine, app::CaProvider chosen,
                                 const std::string& what) {
    if (set && mine != chosen) ignored += (ignored.empty() ? "" : ", ") + what;
  };
  note_ignored(!cfg.ca_address.empty(), app::CaProvider::kIstio, provider,
               "CA address " + cfg.ca_address);
  note_ignored(!cfg.certs_dir.empty(), app::CaProvider::kFiles, provider,
               "--certs-dir " + cfg.certs_dir);
  note_ignored(!opts.kube.signer_name.empty(), app::CaProvider::kKubernetes, provider,
               "--k8s-signer-name " + opts.kube.signer_name);
  const std::string ignored_note = ignored.empty() ? "" : "; ignored: " + ignored;
  auto fetch_counter = [&metrics](const char* result) -> observe::Counter& {
    return metrics.counter("sockmesh_certificate_fetches_total",
                           "Certificate requests to the remote CA (Istio's CA or the Kubernetes "
                           "CSR API), by outcome",
                           {{"result", result}});
  };
  // As ztunnel: retries from 500 ms doubling up to 150 s; the current certificate serves
  // meanwhile. The remote call happens on the cache's thread, never on an io thread.
  auto remote_cache_options = [&cache_options, &cfg] {
    cache_options.min_retry = std::chrono::milliseconds(500);
    cache_options.max_retry = std::chrono::seconds(150);
    cache_options.issue_in_background = true;
    cache_options.parallel_issues = cfg.ca_max_requests;
  };
  if (provider == app::CaProvider::kIstio) {
    if (cfg.ca_address.empty()) {
      return fail(
          "--ca-provider istio needs a CA address (--ca-address, CA_ADDRESS or "
          "--xds-address)");
    }
    identity::IstioCaOptions ca;
    ca.address = cfg.ca_address;
    ca.root_ca_file = cfg.ca_root_ca;
    ca.token_file = cfg.token_file;
    ca.cluster_id = cfg.cluster_id;
    ca.ttl = cfg.secret_ttl;
    ca.max_in_flight = cfg.ca_max_requests;
    auto& fetched_ok = fetch_counter("ok");
    auto& fetch_failed = fetch_counter("failed");
    ca.on_fetch = [&fetched_ok, &fetch_failed](bool ok) { (ok ? fetched_ok : fetch_failed).inc(); };
    auto client = identity::IstioCaClient::create(std::move(ca));
    if (!client) return fail("Istio CA: " + client.error().message);
    issuer = *client;
    remote_cache_options();
    SM_INFO("main") << "identities: Istio CA at " << (*client)->target() << ", roots from "
                    << cfg.ca_root_ca << ", secret TTL " << cfg.secret_ttl.count() << " s ("
                    << chosen_by << ignored_note << ")";
  } else if (provider == app::CaProvider::kKubernetes) {
    identity::KubeCsrOptions ko;
    ko.api_server = opts.kube.api_server;
    if (ko.api_server.empty()) {
      std::map<std::string, std::string> env;
      for (const char* name : {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}) {
        if (const char* v = std::getenv(name)) env[name] = v;
      }
      ko.api_server = identity::in_cluster_api_server(env);
    }
    ko.api_ca_file = opts.kube.api_ca;
    ko.token_file = opts.kube.token_file;
    ko.signer_name = opts.kube.signer_name;
    ko.root_ca_file = cfg.ca_root_ca;
    ko.ttl = cfg.secret_ttl;
    ko.approval_timeout = opts.kube.approval_timeout;
    ko.max_in_flight = cfg.ca_max_requests;
    auto& fetched_ok = fetch_counter("ok");
    auto& fetch_failed = fetch_counter("failed");
    ko.on_fetch = [&fetched_ok, &fetch_failed](bool ok) { (ok ? fetched_ok : fetch_failed).inc(); };
    auto kube = identity::KubeCsrIssuer::create(std::move(ko));
    if (!kube) return fail("Kubernetes CSR issuer: " + kube.error().message);
    issuer = *kube;
    remote_cache_options();
    SM_INFO("main") << "identities: Kubernetes CSR API at " << (*kube)->options().api_server
                    << ", signer " << opts.kube.signer_name << ", roots from " << cfg.ca_root_ca
                    << ", secret TTL " << cfg.secret_ttl.count() << " s (" << chosen_by
                    << ignored_note << ")";
  } else if (provider == app::CaProvider::kFiles) {
    if (cfg.certs_dir.empty()) return fail("--ca-provider files needs --certs-dir");
    auto files = identity::FileCertificates::create(cfg.certs_dir);
    if (!files) return fail("certificates in " + cfg.certs_dir + ": " + files.error().message);
    issuer = *files;
    SM_INFO("main") << "identities: certificates mounted in " << cfg.certs_dir << " (" << chosen_by
                    << ignored_note << ")";
  } else {
    auto ca = identity::BuiltinCa::load_or_create(cfg.state_dir, cfg.trust_domain);
    if (!ca) return fail("built-in CA in " + cfg.state_dir + ": " + ca.error().message);
    issuer = *ca;
    SM_INFO("main") << "identities: built-in CA, root kept in " << cfg.state_dir << " ("
                    << chosen_by << ignored_note << ")";
  }
  identity::CertificateCache certificates(issuer, cache_options);
  // With a remote CA, the local workloads' certificates are asked for as soon as they are known
  // (at start, and whenever the mesh state changes), not at their first connection, which
  // would fail while the request is under way. The hook outlives the cache; the guard, declared
  // after the cache, detaches it first.
  struct PrefetchHook {
    std::mutex mu;
    identity::CertificateCache* cache = nullptr;
    std::string node;
    void run(const state::Snapshot& snap) {
      std::lock_guard lock(mu);
      if (cache == nullptr) return;
      for (const auto& w : snap.workloads()) {
        // A workload outside the mesh (protocol TCP) neither serves nor dials HBONE: it has no
        // certificate to ask the CA for.
        if (w.node != node || w.protocol != state::Protocol::kHbone) continue;
        if (auto id = identity::SpiffeId::parse(w.identity())) cache->prefetch(*id);
      }
    }
  };
  auto prefetch = std::make_shared<PrefetchHook>();
  struct DetachPrefetch {
    std::shared_ptr<PrefetchHook> hook;
    ~DetachPrefetch() {
      std::lock_guard lock(hook->mu);
      hook->cache = nullptr;
    }
  } detach_prefetch{prefetch};
  if (cache_options.issue_in_background) {
    prefetch->cache = &certificates;
    prefetch->node = cfg.node_name;
    store.subscribe([prefetch](const state::SnapshotPtr&, const state::SnapshotPtr& current) {
      if (current) prefetch->run(*current);
    });
    prefetch->run(*store.get());
  }
  certificates.start_background_renewal(cfg.certificate_check);
  auto roots = certificates.roots();
  if (!roots || roots->empty()) return fail("no trust roots available");
  std::shared_ptr<tls::MeshTls> tls;
  try {
    tls = std::make_shared<tls::MeshTls>(cfg.trust_domain,
                                         [&certificates] { return certificates.roots(); });
  } catch (const std::exception& e) {
    return fail(e.what());
  }

  proxy::Proxy proxy(cfg, store,
                     [&certificates](const std::string& id) { return certificates.lookup(id); },
                     tls, metrics);
  // Pods enrolled on this node (the loader's workload map) are local whatever the config says.
  auto enrolled = std::make_shared<proxy::EnrolledWorkloads>(cfg.bpf_pin_root, cfg.node_name);
  if (!cfg.bpf_pin_root.empty()) {
    enrolled->available();  // says once at start-up which source is in use
    proxy.set_local_workload_lookup(
        [enrolled, &proxy](const state::Snapshot& s, const IpAddress& ip) {
          const state::Workload* w = enrolled->find(s, ip);
          return w != nullptr ? w : proxy.context().find_local(s, ip);
        });
  }
  // Bypassed app flows go back to the TCP stack when the proxy stops reading them (its window
  // then bounds what the app queues); says once at start-up whether the maps are there.
  proxy.context().bypass_pinning =
      std::make_shared<proxy::BypassPinning>(cfg.bpf_pin_root, metrics);
  proxy.context().bypass_pinning->available();
  if (auto err = proxy.start()) return fail(*err);
  std::unique_ptr<proxy::ZdsClient> zds;
  if (!cfg.zds_socket.empty()) {
    proxy::ZdsOptions zds_options;
    zds_options.socket_path = cfg.zds_socket;
    zds_options.pin_root = cfg.bpf_pin_root;
    zds = std::make_unique<proxy::ZdsClient>(proxy, zds_options);
    if (auto err = zds->start()) {
      proxy.stop();
      return fail(*err);
    }
  }

  app::AdminSources sources{&proxy,         &store,        &certificates,   &metrics,
                            cfg.node_name, config_source, cfg.bpf_pin_root, zds.get(),
                            xds_client.get()};
  // The admin, metrics and readiness servers get a thread of their own: a scraper or a slow
  // client there never takes time from the acceptors on the control thread.
  HttpThread http;
  observe::HttpLimits http_limits;
  http_limits.max_connections = cfg.http_max_connections;
  http_limits.request_timeout = cfg.http_request_timeout;
  http_limits.max_request_bytes = cfg.http_max_request_bytes;
  std::optional<std::string> admin_err;
  std::promise<void> admin_up;
  boost::asio::post(http.io, [&] {
    auto add = [&](const std::optional<Endpoint>& at, const char* name, auto install) {
      if (!at || admin_err) return;
      auto s = std::make_unique<observe::HttpServer>(http.io, name, http_limits, &metrics);
      install(*s, sources);
      if (auto e = s->listen(*at)) {
        admin_err = e;
        return;
      }
      http.servers.push_back(std::move(s));
    };
    add(cfg.admin, "admin", app::add_admin_routes);
    add(cfg.metrics, "metrics", app::add_metrics_routes);
    add(cfg.readiness, "readiness", app::add_readiness_routes);
    admin_up.set_value();
  });
  admin_up.get_future().wait();
  if (admin_err) {
    proxy.stop();
    return fail(*admin_err);
  }
  if (cfg.zds_socket.empty()) {
    SM_INFO("main") << "sockmesh-proxy ready";
  } else {
    SM_INFO("main") << "sockmesh-proxy started; ready (/healthz/ready) once the node agent's first "
                       "snapshot arrives on "
                    << cfg.zds_socket;
  }

  // After the listeners: a push re-checks live connections through the proxy's subscription.
  if (xds_client) xds_client->start();
  IdleTrimmer trimmer(proxy);

  boost::asio::io_context signals_io;
  boost::asio::signal_set signals(signals_io, SIGTERM, SIGINT);
  int received = 0;
  signals.async_wait([&](const boost::system::error_code&, int sig) { received = sig; });
  signals_io.run();
  SM_INFO("main") << "signal " << received << " received: draining for up to "
                  << cfg.drain_timeout.count() << " ms";
  if (watcher) watcher->stop();
  if (xds_client) xds_client->stop();
  certificates.stop_background_renewal();
  if (zds) zds->stop();  // before the drain: no pod is adopted while listeners close
  proxy.drain(cfg.drain_timeout);
  http.stop();
  SM_INFO("main") << "sockmesh-proxy stopped";
  return 0;
}
