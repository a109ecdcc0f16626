#pragma once
// The proxy as a whole: worker threads, the listeners of each role, policy re-checks when the
// state changes, and an orderly drain.
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dns/server.h"
#include "net/sockets.h"
#include "proxy/connection_record.h"
#include "proxy/context.h"
#include "proxy/inbound.h"
#include "proxy/inbound_plaintext.h"
#include "proxy/outbound.h"
#include "proxy/socks5.h"

namespace sockmesh::proxy {

class Proxy {
 public:
  Proxy(ProxyConfig config, state::StateStore& store, CertificateSource certificates,
        std::shared_ptr<tls::MeshTls> tls, observe::Registry& metrics);
  ~Proxy();

  // Starts workers and opens every configured listener. Returns an error message (and opens
  // nothing more) if a listener cannot be opened.
  std::optional<std::string> start();
  // Stops accepting, lets connections finish for up to `deadline`, then closes what is left.
  void drain(std::chrono::milliseconds deadline);
  // Stops everything at once.
  void stop();

  ProxyContext& context() { return ctx_; }
  boost::asio::io_context& control() { return control_; }
  bool ready() const { return ready_.load(); }
  // Listening addresses by role ("hbone", "socks5", ...), as actually bound.
  std::vector<std::pair<std::string, Endpoint>> listening();
  int64_t active_connections();
  // The live connections, each worker asked on its own thread. At most `limit` are listed
  // (`total` counts all); a worker that does not answer within `wait` is left out and counted.
  struct ConnectionList {
    std::vector<ConnectionSummary> connections;
    size_t total = 0;
    int unanswered_workers = 0;
  };
  ConnectionList connections(std::chrono::milliseconds wait, size_t limit);

  // Replace how local workloads are found (e.g. by the node's BPF workload map).
  void set_local_workload_lookup(LocalWorkloadLookup lookup);

  // In-pod mode (ZDS): listening sockets that the caller created inside a pod's netns. The proxy
  // owns each fd from the call on (closing it on failure too) and serves it as the listener of
  // its role: "outbound" (15001), "inbound_plaintext" (15006) or "hbone" (15008). Listeners the
  // pod had before are closed. Returns once the acceptors run, or an error.
  struct AdoptedListener {
    std::string role;  // "outbound", "inbound_plaintext", "hbone", "dns_udp", "dns_tcp"
    int fd = -1;
    // The pod's netns: the DNS proxy opens its upstream sockets for this pod there.
    std::shared_ptr<const net::Netns> netns;
  };
  std::optional<std::string> adopt_listeners(const std::string& pod_uid,
                                             std::vector<AdoptedListener> listeners);
  // Closes the pod's listeners; connections already accepted carry on. Returns once closed.
  void release_listeners(const std::string& pod_uid);

 private:
  struct Listener {
    std::string role;
    Endpoint at;
    boost::asio::ip::tcp::acceptor acceptor;
    std::function<void(Worker&, boost::asio::ip::tcp::socket)> handler;
    boost::asio::steady_timer backoff;
    Listener(boost::asio::io_context& io) : acceptor(io), backoff(io) {}
  };

  std::optional<std::string> open(const std::string& role, const Endpoint& at,
                                  const net::ListenOptions& options,
                                  std::function<void(Worker&, boost::asio::ip::tcp::socket)> h);
  void accept_loop(Listener& l);
  std::function<void(Worker&, boost::asio::ip::tcp::socket)> handler_for(const std::string& role);
  // Runs `f` on the control thread and waits for it (directly when already there).
  void on_control(const std::function<void()>& f);
  void close_pod_listeners(const std::string& pod_uid);
  // Closes listeners taken out of listeners_ and frees them once nothing queued can reach them.
  void retire(std::vector<std::unique_ptr<Listener>> listeners);
  void reconcile_hbone_listeners();
  // Creates the DNS server (on the control thread) and, outside in-pod mode, its sockets.
  std::optional<std::string> start_dns();
  void recheck_policies(const state::SnapshotPtr& snap);

  ProxyContext ctx_;
  InboundHbone inbound_;
  InboundPlaintext inbound_plaintext_;
  Outbound outbound_;
  Socks5 socks5_;
  boost::asio::io_context control_{1};
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard_;
  std::thread control_thread_;
  std::map<std::string, std::unique_ptr<Listener>> listeners_;  // key: role + address
  // After control_: its coroutines hold the server's state, freed with control_.
  std::shared_ptr<dns::Server> dns_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace sockmesh::proxy
