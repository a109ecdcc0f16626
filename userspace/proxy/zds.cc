#include "proxy/zds.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/errno_text.h"
#include "base/log.h"
#include "dns/server.h"
#include "proxy/proxy.h"

namespace sockmesh::proxy {
namespace {

using maps::ListenerKind;
using maps::UniqueFd;

struct ListenerSpec {
  const char* role;  // Proxy::AdoptedListener::role
  ListenerKind kind;
  bool transparent;
};

// 15001 takes connections to any address (tc assigns them); 15006 too, to be safe with
// addresses the pod holds but did not report; 15008 is an ordinary listener.
constexpr ListenerSpec kListeners[] = {
    {"outbound", ListenerKind::kOutbound, true},
    {"inbound_plaintext", ListenerKind::kInboundPlain, true},
    {"hbone", ListenerKind::kHbone, false},
};

// The DNS proxy's sockets (with --dns-proxy): tc assigns a pod's queries to port 53 of any
// address to them, so both are transparent.
constexpr ListenerSpec kDnsListeners[] = {
    {"dns_udp", ListenerKind::kDnsUdp, true},
    {"dns_tcp", ListenerKind::kDnsTcp, true},
};

struct NewListener {
  const ListenerSpec* spec;
  int family;
  UniqueFd fd;
};

// socket + options + bind + listen, on the calling thread's current netns.
std::optional<std::string> open_listener(const ListenerSpec& spec, int family, uint32_t mark,
                                         UniqueFd* out) {
  UniqueFd fd(socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return errno_text(std::string("socket for ") + spec.role);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // A second proxy (an upgrade) opens the same ports in the pod while the first still drains;
  // tc sends new connections to whichever socket the listener map names, the newest.
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  if (family == AF_INET6 &&
      setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0) {
    return errno_text("IPV6_V6ONLY");
  }
  if (spec.transparent) {
    int r = family == AF_INET ? setsockopt(fd.get(), SOL_IP, IP_TRANSPARENT, &one, sizeof one)
                              : setsockopt(fd.get(), SOL_IPV6, IPV6_TRANSPARENT, &one, sizeof one);
    if (r != 0) return errno_text("IP_TRANSPARENT (needs CAP_NET_ADMIN)");
  }
  if (mark != 0 && setsockopt(fd.get(), SOL_SOCKET, SO_MARK, &mark, sizeof mark) != 0) {
    return errno_text("SO_MARK (needs CAP_NET_ADMIN)");
  }
  Endpoint at{family == AF_INET ? IpAddress::v4(0) : IpAddress(), maps::port_of(spec.kind)};
  sockaddr_storage ss{};
  socklen_t len = at.to_sockaddr(&ss);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return errno_text("bind " + at.to_string() + " in the pod");
  }
  if (listen(fd.get(), 1024) != 0) return errno_text("listen " + at.to_string());
  *out = std::move(fd);
  return std::nullopt;
}

uint64_t cookie_of(int fd) {
  uint64_t cookie = 0;
  socklen_t len = sizeof cookie;
  if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) != 0) return 0;
  return cookie;
}

// The addresses of the calling thread's netns: what a pod holds when the agent did not say (Istio's
// agent sends no IPs). Loopback and IPv6 link-local addresses are not the pod's identity.
std::vector<IpAddress> interface_addresses() {
  std::vector<IpAddress> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    if (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6) continue;
    if (a->ifa_addr->sa_family == AF_INET6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr)) continue;
    }
    auto ip = IpAddress::from_sockaddr(a->ifa_addr);
    if (ip && !ip->is_loopback() && std::find(out.begin(), out.end(), *ip) == out.end()) {
      out.push_back(*ip);
    }
  }
  freeifaddrs(list);
  return out;
}

std::string ips_text(const std::vector<IpAddress>& ips) {
  std::string s;
  for (const auto& ip : ips) s += (s.empty() ? "" : ",") + ip.to_string();
  return s.empty() ? "(none)" : s;
}

}  // namespace

ZdsClient::ZdsClient(Proxy& proxy, ZdsOptions options)
    : proxy_(proxy),
      options_(std::move(options)),
      pods_gauge_(&proxy.context().metrics->gauge(
          "sockmesh_zds_pods", "Pods handed over by the node agent whose listeners are open")) {}

ZdsClient::~ZdsClient() { stop(); }

std::optional<std::string> ZdsClient::start() {
  sockaddr_un addr;
  if (auto err = zds::socket_address(options_.socket_path, &addr)) return "--zds-socket: " + *err;
  wake_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) return errno_text("eventfd");
  SM_INFO("zds") << "connecting to the node agent on " << options_.socket_path << " (pin root "
                 << (options_.pin_root.empty() ? "none: listeners are not registered for tc"
                                               : options_.pin_root)
                 << ")";
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "sm-zds");
    run();
  });
  return std::nullopt;
}

void ZdsClient::stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof one);
  thread_.join();
}

bool ZdsClient::stop_requested_within(std::chrono::milliseconds d) {
  pollfd p{wake_fd_.get(), POLLIN, 0};
  int n;
  do {
    n = poll(&p, 1, static_cast<int>(d.count()));
  } while (n < 0 && errno == EINTR);
  return n > 0;
}

// Why the process at the other end of the ZDS socket is not trusted, or nullopt when it runs as
// root or as this proxy's user (SO_PEERCRED: its credentials when it called listen()).
static std::optional<std::string> refuse_peer(int fd, const std::string& path) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return errno_text("reading the credentials of the peer on " + path);
  }
  if (cred.uid == 0 || cred.uid == geteuid()) return std::nullopt;
  return "the process serving " + path + " (pid " + std::to_string(cred.pid) + ") runs as uid " +
         std::to_string(cred.uid) + ", neither root nor this proxy's uid " +
         std::to_string(geteuid()) + "; refusing it";
}

void ZdsClient::run() {
  sockaddr_un addr;
  (void)zds::socket_address(options_.socket_path, &addr);  // checked by start()
  auto backoff = options_.retry_min;
  std::string last_failure;
  while (true) {
    // Non-blocking connect: an agent whose backlog is full answers EAGAIN instead of holding
    // this thread (and stop()) in connect().
    UniqueFd conn(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    std::string failure;
    int blocking = 0;
    if (!conn) {
      failure = errno_text("ZDS socket");
    } else if (connect(conn.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      failure = errno_text("connecting to " + options_.socket_path);
    } else if (auto refused = refuse_peer(conn.get(), options_.socket_path)) {
      // The agent hands us network namespaces to serve: only root (the agent) or this proxy's
      // own user may speak for it, never whoever managed to bind the socket's path.
      failure = *refused;
    } else if (ioctl(conn.get(), FIONBIO, &blocking) != 0) {
      failure = errno_text("ZDS socket mode");
    } else if (auto err = zds::send_packet(conn.get(), zds::encode(zds::Hello{}))) {
      failure = "hello to the node agent: " + *err;
    }
    if (failure.empty()) {
      SM_INFO("zds") << "connected to the node agent's socket " << options_.socket_path << "; "
                     << pods_.size() << " pod(s) held until its snapshot";
      last_failure.clear();
      Ended ended = serve(std::move(conn));
      if (ended == Ended::kStopped) return;
      if (ended == Ended::kAfterSnapshot) {
        // A session that worked: the agent restarted or starts over, reconnect at once (as
        // ztunnel does).
        backoff = options_.retry_min;
        continue;
      }
      // Ended before any snapshot (the agent refuses us, or drops us): back off as below, so
      // that a broken agent does not get a reconnect loop.
      failure = "the connection ended before a snapshot";
    }
    // Once per kind of failure: an agent that is not up yet would fill the log otherwise.
    if (failure != last_failure) {
      SM_WARN("zds") << "node agent not reachable (retrying up to every "
                     << options_.retry_max.count() << " ms): " << failure;
      last_failure = failure;
    }
    if (stop_requested_within(backoff)) return;
    backoff = std::min(backoff * 2, options_.retry_max);
  }
}

ZdsClient::Ended ZdsClient::serve(UniqueFd conn) {
  Session session;
  auto next_retry = std::chrono::steady_clock::now() + options_.retry_failed_add;
  auto ended = [&] { return session.snapshot_received ? Ended::kAfterSnapshot : Ended::kEarly; };
  while (true) {
    pollfd fds[2] = {{wake_fd_.get(), POLLIN, 0}, {conn.get(), POLLIN, 0}};
    auto now = std::chrono::steady_clock::now();
    if (failed_.empty()) next_retry = now + options_.retry_failed_add;
    int wait_ms = -1;
    if (!failed_.empty()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_retry - now);
      wait_ms = static_cast<int>(std::max<int64_t>(left.count(), 0));
    }
    int n = poll(fds, 2, wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      SM_ERROR("zds") << errno_text("poll") << "; reconnecting to the node agent";
      return ended();
    }
    if (!failed_.empty() && std::chrono::steady_clock::now() >= next_retry) {
      retry_failed_adds();
      next_retry = std::chrono::steady_clock::now() + options_.retry_failed_add;
    }
    if (n == 0) continue;
    if (fds[0].revents != 0) return Ended::kStopped;
    if (fds[1].revents == 0) continue;
    auto got = zds::receive_packet(conn.get(), 0);
    if (got.status == zds::ReceiveStatus::kTimeout) continue;
    if (got.status == zds::ReceiveStatus::kClosed) {
      // Pods stay: the agent (restarted, or starting a new snapshot) sends them again.
      SM_INFO("zds") << "the node agent closed the connection; keeping " << pods_.size()
                     << " pod(s) and reconnecting";
      return ended();
    }
    std::string reply;
    if (got.status == zds::ReceiveStatus::kError) {
      reply = "unreadable message: " + got.error;
    } else {
      std::string err;
      auto request = zds::decode_request(got.packet.bytes, &err);
      reply = request ? handle(*request, std::move(got.packet.fd), session) : err;
    }
    if (!reply.empty()) SM_WARN("zds") << "nack: " << reply;
    if (auto err = zds::send_packet(conn.get(), zds::encode(zds::Ack{reply}))) {
      SM_WARN("zds") << "ack to the node agent: " << *err << "; reconnecting";
      return ended();
    }
  }
}

std::string ZdsClient::handle(const zds::Request& request, UniqueFd fd, Session& session) {
  SM_DEBUG("zds") << "received " << zds::describe(request);
  if (const auto* a = std::get_if<zds::AddWorkload>(&request)) {
    if (!fd) return "add " + a->uid + " came without the pod's netns descriptor";
    if (!session.snapshot_received) session.mentioned.insert(a->uid);
    return add_or_remember(*a, std::move(fd));
  }
  if (fd) return "unexpected descriptor with " + zds::describe(request);
  if (const auto* k = std::get_if<zds::KeepWorkload>(&request)) {
    if (session.snapshot_received) return "keep " + k->uid + " after snapshot_sent";
    session.mentioned.insert(k->uid);
    return "";
  }
  if (const auto* d = std::get_if<zds::DelWorkload>(&request)) {
    if (!session.snapshot_received) session.mentioned.erase(d->uid);
    remove(d->uid, "the node agent deleted it");
    return "";
  }
  if (session.snapshot_received) return "snapshot_sent twice on one connection";
  session.snapshot_received = true;
  synced_ = true;
  std::vector<std::string> gone;
  for (const auto& [uid, _] : pods_) {
    if (session.mentioned.count(uid) == 0) gone.push_back(uid);
  }
  for (const auto& uid : gone) remove(uid, "not in the node agent's snapshot");
  for (auto it = failed_.begin(); it != failed_.end();) {
    it = session.mentioned.count(it->first) == 0 ? failed_.erase(it) : std::next(it);
  }
  SM_INFO("zds") << "snapshot received: " << pods_.size() << " pod(s)"
                 << (gone.empty() ? "" : ", " + std::to_string(gone.size()) + " closed");
  session.mentioned.clear();
  return "";
}

std::string ZdsClient::add_or_remember(const zds::AddWorkload& a, UniqueFd netns_fd) {
  failed_.erase(a.uid);  // this add supersedes an earlier one that failed
  UniqueFd copy(fcntl(netns_fd.get(), F_DUPFD_CLOEXEC, 0));
  std::string err = add(a, std::move(netns_fd));
  if (!err.empty() && copy && !a.uid.empty()) {
    SM_WARN("zds") << "pod " << a.uid << " not served yet; trying again every "
                   << options_.retry_failed_add.count() << " ms";
    failed_[a.uid] = Failed{a, std::move(copy), 1};
  }
  return err;
}

void ZdsClient::retry_failed_adds() {
  for (auto it = failed_.begin(); it != failed_.end();) {
    Failed& f = it->second;
    UniqueFd copy(fcntl(f.netns.get(), F_DUPFD_CLOEXEC, 0));
    std::string err = copy ? add(f.info, std::move(copy)) : errno_text("dup of the pod's netns");
    ++f.attempts;
    if (err.empty()) {
      SM_INFO("zds") << "pod " << it->first << " served after " << f.attempts << " attempts";
      it = failed_.erase(it);
      continue;
    }
    SM_DEBUG("zds") << "pod " << it->first << ", attempt " << f.attempts << ": " << err;
    ++it;
  }
}

std::optional<std::string> ZdsClient::listener_map(maps::ListenerMap** out) {
  *out = nullptr;
  if (options_.pin_root.empty()) return std::nullopt;
  if (!listeners_map_) {
    auto m = maps::ListenerMap::open(options_.pin_root);
    if (!m) return "listener map: " + m.error().message;
    listeners_map_.emplace(std::move(m).value());
  }
  *out = &*listeners_map_;
  return std::nullopt;
}

void ZdsClient::follow_recreated_listener_map() {
  if (!listeners_map_ || listeners_map_->map().still_pinned()) return;
  // The loader recreated its maps under our pin root (an uninstall and install, an upgrade that
  // changed their layout): our registrations are in a map tc no longer reads. Close every pod's
  // listeners; the agent re-adds its pods, and they get new listeners in the new map.
  SM_WARN("zds") << "the listener map " << listeners_map_->map().path()
                 << " was recreated by the loader; re-creating the listeners of " << pods_.size()
                 << " pod(s) as the node agent adds them again";
  std::vector<std::string> uids;
  for (const auto& [uid, pod] : pods_) uids.push_back(uid);
  listeners_map_.reset();
  for (const auto& uid : uids) remove(uid, "the listener map was recreated");
}

std::string ZdsClient::add(const zds::AddWorkload& add, UniqueFd netns_fd) {
  if (add.uid.empty()) return "add without a uid";
  follow_recreated_listener_map();
  std::string err;
  auto netns = net::Netns::adopt(netns_fd.release(), &err);
  if (!netns) return "pod " + add.uid + ": " + err;

  if (auto it = pods_.find(add.uid); it != pods_.end()) {
    // Without IPs in the add (Istio's agent), the same netns is the same pod, as for ztunnel.
    if (it->second.netns->same_as(*netns) && (add.ips.empty() || it->second.info.ips == add.ips)) {
      auto ips = it->second.info.ips;
      it->second.info = add;
      it->second.info.ips = ips;
      return "";  // already serving it
    }
    remove(add.uid,
           it->second.netns->same_as(*netns) ? "its IPs changed" : "its sandbox has a new netns");
  }

  zds::AddWorkload info = add;
  bool discovered = false;
  uint32_t mark = proxy_.context().config.mark;
  const bool dns = proxy_.context().config.dns_proxy;
  std::vector<NewListener> created;
  std::optional<std::string> failure;
  auto entered = net::run_in(netns.get(), [&] {
    if (info.ips.empty()) {
      info.ips = interface_addresses();
      discovered = true;
    }
    // Families the pod has addresses in (IPv4 alone when it has none yet).
    bool v4 = info.ips.empty(), v6 = false;
    for (const auto& ip : info.ips) (ip.is_v4() ? v4 : v6) = true;
    for (int family : {AF_INET, AF_INET6}) {
      if ((family == AF_INET && !v4) || (family == AF_INET6 && !v6)) continue;
      for (const auto& spec : kListeners) {
        UniqueFd fd;
        if (auto e = open_listener(spec, family, mark, &fd)) {
          failure = e;
          return;
        }
        created.push_back(NewListener{&spec, family, std::move(fd)});
      }
      if (!dns) continue;
      for (const auto& spec : kDnsListeners) {
        std::string error;
        Endpoint at{family == AF_INET ? IpAddress::v4(0) : IpAddress(), maps::port_of(spec.kind)};
        UniqueFd fd(
            dns::open_dns_socket(spec.kind == ListenerKind::kDnsUdp ? SOCK_DGRAM : SOCK_STREAM, at,
                                 spec.transparent, mark, &error));
        if (!fd) {
          failure = error + " in the pod";
          return;
        }
        created.push_back(NewListener{&spec, family, std::move(fd)});
      }
    }
  });
  if (entered) return "pod " + add.uid + ": " + *entered;
  if (failure) return "pod " + add.uid + ": " + *failure;

  Pod pod{info, netns, {}};
  maps::ListenerMap* map = nullptr;
  if (auto e = listener_map(&map)) return "pod " + add.uid + ": " + *e;
  if (map != nullptr) {
    for (const auto& ip : info.ips) {
      for (const auto& l : created) {
        if ((l.family == AF_INET) != ip.is_v4()) continue;
        if (auto s = map->add(ip, l.spec->kind, l.fd.get()); !s) {
          // The sockets close below, which takes their entries out of the map.
          return "pod " + add.uid + ": " + s.error().message;
        }
        pod.registered.push_back({ip, l.spec->kind, cookie_of(l.fd.get())});
      }
    }
  }

  auto& ctx = proxy_.context();
  for (const auto& ip : info.ips) ctx.pod_netns.set(ip, netns);
  std::vector<Proxy::AdoptedListener> adopted;
  for (auto& l : created) adopted.push_back({l.spec->role, l.fd.release(), netns});
  if (auto e = proxy_.adopt_listeners(add.uid, std::move(adopted))) {
    for (const auto& ip : info.ips) ctx.pod_netns.erase(ip, netns.get());
    return *e;
  }
  SM_INFO("zds") << "pod " << add.uid << " (" << add.info.namespace_name << "/" << add.info.name
                 << ", sa " << add.info.service_account << ") in " << netns->to_string()
                 << ": listeners open on 15001, 15006, 15008"
                 << (dns ? ", DNS on 15053 (udp, tcp); " : "; ")
                 << (map != nullptr ? "registered for " + ips_text(info.ips) : "not registered")
                 << (discovered ? " (addresses read from the pod's interfaces)" : "");
  pods_[add.uid] = std::move(pod);
  pod_count_ = pods_.size();
  pods_gauge_->set(static_cast<int64_t>(pods_.size()));
  return "";
}

void ZdsClient::remove(const std::string& uid, const std::string& why) {
  failed_.erase(uid);
  auto it = pods_.find(uid);
  if (it == pods_.end()) return;
  Pod& pod = it->second;
  // Closing the sockets empties their slots too; removing first leaves no window in which tc
  // assigns a SYN to a closing listener. A slot that holds another socket by now is left alone.
  maps::ListenerMap* map = nullptr;
  if (!listener_map(&map) && map != nullptr) {
    for (const auto& r : pod.registered) {
      if (map->socket_cookie(r.ip, r.kind) == r.cookie) (void)map->remove(r.ip, r.kind);
    }
  }
  for (const auto& ip : pod.info.ips) proxy_.context().pod_netns.erase(ip, pod.netns.get());
  proxy_.release_listeners(uid);
  SM_INFO("zds") << "pod " << uid << " closed: " << why;
  pods_.erase(it);
  pod_count_ = pods_.size();
  pods_gauge_->set(static_cast<int64_t>(pods_.size()));
}

}  // namespace sockmesh::proxy
