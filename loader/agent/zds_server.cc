#include "loader/agent/zds_server.h"

#include <fcntl.h>
#include <linux/nsfs.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/log.h"

namespace sockmesh::agent {
namespace {

using maps::Error;
using maps::Status;
using maps::UniqueFd;

// Opens a pod's netns file and checks that it is one (a path to anything else would otherwise be
// refused by the proxy only when it tries to enter it).
maps::Result<UniqueFd> open_netns(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::from_errno(errno, "opening the pod's netns " + path);
  int type = ioctl(fd.get(), NS_GET_NSTYPE);
  if (type >= 0 && type != CLONE_NEWNET) {
    return Error{EINVAL, path + " is a namespace, but not a network namespace"};
  }
  if (type < 0 && errno != ENOTTY) {
    return Error::from_errno(errno, path + " is not a namespace file");
  }
  return fd;
}

zds::AddWorkload to_add(const PodWorkload& pod) {
  zds::AddWorkload add;
  add.uid = pod.uid;
  add.info.name = pod.name;
  add.info.namespace_name = pod.namespace_name;
  add.info.service_account = pod.service_account;
  add.ips = pod.ips;
  // Istio's proxy reads a message into 1 KiB: the IPs (our extension) go if they do not fit.
  if (zds::encode(zds::Request{add}).size() > zds::kMaxSentBytes) {
    SM_DEBUG("zds") << "add " << pod.uid << " sent without its IPs, which would not fit in "
                    << zds::kMaxSentBytes << " bytes";
    add.ips.clear();
  }
  return add;
}

}  // namespace

maps::Result<std::unique_ptr<ZdsServer>> ZdsServer::listen(ZdsServerOptions options) {
  sockaddr_un addr;  // the path must also fit the proxy's side of the protocol
  if (auto err = zds::socket_address(options.socket_path, &addr)) return Error{ENAMETOOLONG, *err};
  // The proxy connects non-blocking and the agent polls: the listening end is non-blocking too.
  auto listener = UnixListener::open(
      {.path = options.socket_path, .what = "ZDS", .backlog = 16, .non_blocking = true});
  if (!listener) return listener.error();
  SM_INFO("zds") << "serving ZDS on " << options.socket_path
                 << ": the proxy connects here for the node's pods";
  return std::unique_ptr<ZdsServer>(new ZdsServer(std::move(options), std::move(*listener)));
}

ZdsServer::ZdsServer(ZdsServerOptions options, UnixListener listener)
    : options_(std::move(options)), listener_(std::move(listener)) {
  thread_ = std::thread([this] { background(); });
}

ZdsServer::~ZdsServer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  listener_.close();  // removes the socket file only if a successor has not bound the path
}

bool ZdsServer::connected() const {
  std::lock_guard lock(mu_);
  return !sessions_.empty();
}

uint64_t ZdsServer::sessions() const {
  std::lock_guard lock(mu_);
  return session_count_;
}

bool ZdsServer::wait_connected(std::chrono::milliseconds timeout, uint64_t min_sessions) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [&] { return !sessions_.empty() && session_count_ >= min_sessions; });
}

void ZdsServer::accept_pending() {
  for (int served = 0; served < options_.max_accepts_per_round;) {
    UniqueFd fd(accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        accept_failing_ = false;
        return;
      }
      if (!accept_failing_) {
        SM_WARN("zds") << "accepting a proxy on " << options_.socket_path << ": "
                       << std::strerror(errno) << " (retrying)";
      }
      accept_failing_ = true;  // the background thread naps instead of polling a ready socket
      return;
    }
    accept_failing_ = false;
    ++served;
    if (Status s = open_session(std::move(fd)); !s) {
      SM_WARN("zds") << "a proxy connected, but: " << s.error().message;
    }
  }
}

void ZdsServer::wait_for_proxy(std::unique_lock<std::mutex>& lock) {
  auto deadline = std::chrono::steady_clock::now() + options_.connect_wait;
  accept_pending();
  while (sessions_.empty() && !stopping_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd p{listener_.fd(), POLLIN, 0};
    lock.unlock();
    poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 50)));
    lock.lock();
    accept_pending();
  }
}

Status ZdsServer::open_session(UniqueFd fd) {
  auto hello = zds::receive_packet(fd.get(), static_cast<int>(options_.hello_timeout.count()));
  if (hello.status != zds::ReceiveStatus::kOk) {
    return Error{EPROTO, "it sent no hello" + (hello.error.empty() ? "" : ": " + hello.error)};
  }
  std::string err;
  auto h = zds::decode_hello(hello.packet.bytes, &err);
  if (!h) return Error{EPROTO, "bad hello: " + err};
  if (h->version != zds::kVersionV1) {  // as Istio's agent: noted, not refused
    SM_WARN("zds") << "the proxy says ZDS version " << h->version << "; this agent speaks "
                   << zds::kVersionV1;
  }
  sessions_.push_back(Session{std::move(fd), session_count_ + 1});
  const size_t index = sessions_.size() - 1;
  const uint64_t number = sessions_[index].number;
  auto alive = [&] { return sessions_.size() > index && sessions_[index].number == number; };

  // The snapshot: every pod, then snapshot_sent, after which the proxy closes pods not mentioned.
  replay_errors_.clear();
  size_t added = 0;
  for (const auto& [uid, pod] : pods_) {
    Status s = send_pod(index, pod, /*keep_if_gone=*/true);
    if (!alive()) return Error{EPIPE, "sending the snapshot: " + s.error().message};
    if (!s) {
      replay_errors_[uid] = s.error().message;
    } else {
      ++added;
    }
  }
  if (Status s = request(index, zds::SnapshotSent{}, -1); !s) {
    if (alive()) close_session(index, "snapshot_sent refused: " + s.error().message);
    return Error{EPROTO, "snapshot_sent: " + s.error().message};
  }
  session_count_ = number;
  SM_INFO("zds") << "session " << number << ": a proxy connected on " << options_.socket_path
                 << "; snapshot of " << pods_.size() << " pod(s) sent, " << added << " acked"
                 << (replay_errors_.empty()
                         ? ""
                         : ", " + std::to_string(replay_errors_.size()) + " refused");
  for (const auto& [uid, e] : replay_errors_) SM_WARN("zds") << "pod " << uid << ": " << e;
  cv_.notify_all();
  return {};
}

void ZdsServer::close_session(size_t index, const std::string& why) {
  if (index >= sessions_.size()) return;
  SM_INFO("zds") << "session " << sessions_[index].number << " with a proxy closed: " << why;
  sessions_.erase(sessions_.begin() + static_cast<std::ptrdiff_t>(index));
}

Status ZdsServer::request(size_t index, const zds::Request& req, int attach_fd) {
  if (index >= sessions_.size()) return Error{ENOTCONN, "no proxy connected"};
  int fd = sessions_[index].fd.get();
  if (auto err = zds::send_packet(fd, zds::encode(req), attach_fd)) {
    close_session(index, *err);
    return Error{EPIPE, zds::describe(req) + ": " + *err};
  }
  auto deadline = std::chrono::steady_clock::now() + options_.ack_timeout;
  zds::Received got;
  do {  // a wake-up without a packet (EAGAIN) reads as a timeout: wait out the rest
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    got = zds::receive_packet(fd, static_cast<int>(std::max<int64_t>(left.count(), 0)));
  } while (got.status == zds::ReceiveStatus::kTimeout &&
           std::chrono::steady_clock::now() < deadline);
  if (got.status != zds::ReceiveStatus::kOk) {
    std::string why = got.status == zds::ReceiveStatus::kTimeout
                          ? "no ack within " + std::to_string(options_.ack_timeout.count()) + " ms"
                      : got.status == zds::ReceiveStatus::kClosed
                          ? "the proxy closed the connection"
                          : got.error;
    // The proxy may or may not have acted: only a new connection (the whole snapshot) is certain.
    close_session(index, why);
    return Error{EPIPE, zds::describe(req) + ": " + why};
  }
  std::string err;
  auto ack = zds::decode_ack(got.packet.bytes, &err);
  if (!ack) {
    close_session(index, "bad ack: " + err);
    return Error{EPROTO, zds::describe(req) + ": bad ack: " + err};
  }
  if (!ack->error.empty())
    return Error{0, "the proxy refused " + zds::describe(req) + ": " + ack->error};
  return {};
}

Status ZdsServer::send_pod(size_t index, const PodWorkload& pod, bool keep_if_gone) {
  auto netns = open_netns(pod.netns_path);
  if (!netns) {
    if (!keep_if_gone) return netns.error();
    // The agent cannot reach the pod's netns (any more); the proxy keeps it if it has it.
    Status s = request(index, zds::KeepWorkload{pod.uid}, -1);
    if (!s) return s;
    return Error{netns.error().code, "sent keep only: " + netns.error().message};
  }
  return request(index, to_add(pod), netns->get());
}

Status ZdsServer::add(const PodWorkload& pod) {
  std::unique_lock lock(mu_);
  if (pod.uid.empty()) return Error{EINVAL, "a pod without a uid"};
  if (!synced_) {
    pods_[pod.uid] = pod;
    return Error{EAGAIN, "pod " + pod.uid +
                             " remembered but not handed over: sync() has not been called yet"};
  }
  // A proxy that connected a moment ago gets the snapshot first; one that is reconnecting is
  // waited for a little.
  wait_for_proxy(lock);
  if (sessions_.empty()) {
    pods_[pod.uid] = pod;
    return Error{ENOTCONN, "no proxy is connected on " + options_.socket_path};
  }
  auto netns = open_netns(pod.netns_path);
  if (!netns) return netns.error();  // not remembered: there is nothing to hand over
  pods_[pod.uid] = pod;
  const size_t index = sessions_.size() - 1;  // adds go to the newest proxy
  const uint64_t number = sessions_[index].number;
  Status s = request(index, to_add(pod), netns->get());
  if (s || (sessions_.size() > index && sessions_[index].number == number)) return s;
  // The connection broke (the proxy restarted?): its successor gets this pod with the snapshot.
  accept_pending();
  if (!sessions_.empty() && sessions_.back().number > number) {
    auto it = replay_errors_.find(pod.uid);
    if (it != replay_errors_.end()) return Error{0, it->second};
    return {};
  }
  return Error{s.error().code, "the proxy's connection ended (" + s.error().message + ")"};
}

Status ZdsServer::remove(const std::string& uid) {
  std::lock_guard lock(mu_);
  pods_.erase(uid);
  // Every connected proxy closes it (an older one may still serve it); a proxy that connects
  // later gets a snapshot without it.
  Status first;
  for (size_t i = sessions_.size(); i-- > 0;) {
    Status s = request(i, zds::DelWorkload{uid}, -1);
    if (!s && first) first = s;
  }
  return first;
}

Status ZdsServer::sync(const std::vector<PodWorkload>& all) {
  std::unique_lock lock(mu_);
  pods_.clear();
  for (const auto& p : all) pods_[p.uid] = p;
  synced_ = true;
  // A snapshot is sent once per connection: proxies that have one reconnect and get this one.
  while (!sessions_.empty()) close_session(0, "a new snapshot needs a new connection");
  wait_for_proxy(lock);
  if (sessions_.empty()) {
    return Error{ENOTCONN, "snapshot of " + std::to_string(pods_.size()) +
                               " pod(s) remembered; no proxy is connected on " +
                               options_.socket_path + " yet, it gets it when it connects"};
  }
  if (replay_errors_.empty()) return {};
  std::string all_errors;
  for (const auto& [uid, e] : replay_errors_) {
    all_errors += (all_errors.empty() ? "" : "; ") + uid + ": " + e;
  }
  return Error{0, std::to_string(replay_errors_.size()) + " of " + std::to_string(pods_.size()) +
                      " pod(s) refused: " + all_errors};
}

bool ZdsServer::peer_gone(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0) return true;
  // Nothing is due from the proxy between requests; read it to see whether it is an EOF.
  auto got = zds::receive_packet(fd, 0);
  if (got.status == zds::ReceiveStatus::kClosed || got.status == zds::ReceiveStatus::kError) {
    return true;
  }
  if (got.status == zds::ReceiveStatus::kOk) SM_WARN("zds") << "unexpected message from a proxy";
  return false;
}

void ZdsServer::background() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    for (size_t i = sessions_.size(); i-- > 0;) {
      if (peer_gone(sessions_[i].fd.get())) {
        close_session(i, "the proxy went away; it gets the snapshot when it connects again");
      }
    }
    if (!synced_) {
      // Connections wait in the backlog until the agent knows every pod: a partial snapshot
      // would make a running proxy close the listeners of pods not known yet.
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      continue;
    }
    accept_pending();
    if (accept_failing_) {
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      continue;
    }
    // Short naps: a new or dropped connection is noticed within one.
    pollfd p{listener_.fd(), POLLIN, 0};
    lock.unlock();
    poll(&p, 1, 50);
    lock.lock();
  }
  while (!sessions_.empty()) close_session(0, "the agent is stopping");
}

}  // namespace sockmesh::agent
