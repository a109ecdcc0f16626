#include "loader/agent/zds_client.h"

#include <fcntl.h>
#include <linux/nsfs.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/log.h"

namespace sockmesh::agent {
namespace {

using maps::Error;
using maps::Status;
using maps::UniqueFd;
using Clock = std::chrono::steady_clock;

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
  return add;
}

}  // namespace

ZdsClient::ZdsClient(ZdsClientOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { background(); });
}

ZdsClient::~ZdsClient() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool ZdsClient::connected() const {
  std::lock_guard lock(mu_);
  return session_.valid();
}

uint64_t ZdsClient::sessions() const {
  std::lock_guard lock(mu_);
  return sessions_;
}

bool ZdsClient::wait_connected(std::chrono::milliseconds timeout, uint64_t min_sessions) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return session_.valid() && sessions_ >= min_sessions; });
}

Status ZdsClient::open_session() {
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) return Error::from_errno(errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options_.socket_path.size() >= sizeof addr.sun_path) {
    return Error{ENAMETOOLONG, "ZDS socket path too long: " + options_.socket_path};
  }
  std::memcpy(addr.sun_path, options_.socket_path.data(), options_.socket_path.size());
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Error::from_errno(errno, "connecting to the proxy at " + options_.socket_path);
  }
  auto hello = zds::receive_packet(fd.get(), static_cast<int>(options_.ack_timeout.count()));
  if (hello.status != zds::ReceiveStatus::kOk) {
    return Error{EPROTO, "the proxy at " + options_.socket_path + " sent no hello" +
                             (hello.error.empty() ? "" : ": " + hello.error)};
  }
  std::string err;
  auto h = zds::decode_hello(hello.packet.bytes, &err);
  if (!h) return Error{EPROTO, "bad hello from the proxy: " + err};
  if (h->version != zds::kVersionV1) {
    return Error{EPROTO, "the proxy speaks ZDS version " + std::to_string(h->version) +
                             ", this agent version " + std::to_string(zds::kVersionV1)};
  }
  session_ = std::move(fd);

  // Replay: every pod, then snapshot_sent, after which the proxy closes pods not mentioned.
  replay_errors_.clear();
  size_t added = 0;
  for (const auto& [uid, pod] : pods_) {
    Status s = send_pod(pod, /*keep_if_gone=*/true);
    if (!session_) return Error{EPIPE, "replaying the snapshot: " + s.error().message};
    if (!s) {
      replay_errors_[uid] = s.error().message;
    } else {
      ++added;
    }
  }
  Status s = request(zds::SnapshotSent{}, -1);
  if (!s) return Error{EPROTO, "snapshot_sent: " + s.error().message};
  ++sessions_;
  SM_INFO("zds") << "session " << sessions_ << " with the proxy at " << options_.socket_path
                 << ": snapshot of " << pods_.size() << " pod(s) sent, " << added << " acked"
                 << (replay_errors_.empty()
                         ? ""
                         : ", " + std::to_string(replay_errors_.size()) + " refused");
  for (const auto& [uid, e] : replay_errors_) SM_WARN("zds") << "pod " << uid << ": " << e;
  cv_.notify_all();
  return {};
}

void ZdsClient::close_session(const std::string& why) {
  if (!session_) return;
  SM_INFO("zds") << "session with the proxy at " << options_.socket_path << " closed: " << why;
  session_.reset();
}

Status ZdsClient::request(const zds::Request& req, int attach_fd) {
  if (!session_) return Error{ENOTCONN, "not connected to the proxy"};
  if (auto err = zds::send_packet(session_.get(), zds::encode(req), attach_fd)) {
    close_session(*err);
    return Error{EPIPE, zds::describe(req) + ": " + *err};
  }
  auto deadline = Clock::now() + options_.ack_timeout;
  zds::Received got;
  do {  // a wake-up without a packet (EAGAIN) reads as a timeout: wait out the rest
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    got = zds::receive_packet(session_.get(), static_cast<int>(std::max<int64_t>(left.count(), 0)));
  } while (got.status == zds::ReceiveStatus::kTimeout && Clock::now() < deadline);
  if (got.status != zds::ReceiveStatus::kOk) {
    std::string why = got.status == zds::ReceiveStatus::kTimeout
                          ? "no ack within " + std::to_string(options_.ack_timeout.count()) + " ms"
                      : got.status == zds::ReceiveStatus::kClosed
                          ? "the proxy closed the connection"
                          : got.error;
    // The proxy may or may not have acted: only a new session (a full replay) is certain.
    close_session(why);
    return Error{EPIPE, zds::describe(req) + ": " + why};
  }
  std::string err;
  auto ack = zds::decode_ack(got.packet.bytes, &err);
  if (!ack) {
    close_session("bad ack: " + err);
    return Error{EPROTO, zds::describe(req) + ": bad ack: " + err};
  }
  if (!ack->error.empty())
    return Error{0, "the proxy refused " + zds::describe(req) + ": " + ack->error};
  return {};
}

Status ZdsClient::send_pod(const PodWorkload& pod, bool keep_if_gone) {
  auto netns = open_netns(pod.netns_path);
  if (!netns) {
    if (!keep_if_gone) return netns.error();
    // The agent cannot reach the pod's netns (any more); the proxy keeps it if it has it.
    Status s = request(zds::KeepWorkload{pod.uid}, -1);
    if (!s) return s;
    return Error{netns.error().code, "sent keep only: " + netns.error().message};
  }
  return request(to_add(pod), netns->get());
}

Status ZdsClient::add(const PodWorkload& pod) {
  std::lock_guard lock(mu_);
  if (pod.uid.empty()) return Error{EINVAL, "a pod without a uid"};
  if (!synced_) {
    pods_[pod.uid] = pod;
    return Error{EAGAIN, "pod " + pod.uid +
                             " remembered but not handed over: sync() has not been called yet"};
  }
  if (!session_) {
    pods_[pod.uid] = pod;
    if (Status s = open_session(); !s) {
      close_session(s.error().message);
      return Error{s.error().code, "pod " + pod.uid + " remembered; the proxy is unreachable (" +
                                       s.error().message + "), it gets the pod when it connects"};
    }
    auto it = replay_errors_.find(pod.uid);
    if (it != replay_errors_.end()) return Error{0, it->second};
    return {};
  }
  auto netns = open_netns(pod.netns_path);
  if (!netns) return netns.error();  // not remembered: there is nothing to hand over
  pods_[pod.uid] = pod;
  Status s = request(to_add(pod), netns->get());
  if (s || session_) return s;
  // The connection broke (the proxy restarted?): a new session replays this pod with the rest.
  if (Status r = open_session(); !r) {
    close_session(r.error().message);
    return Error{r.error().code, "pod " + pod.uid + " remembered; the proxy is unreachable (" +
                                     r.error().message + "), it gets the pod when it connects"};
  }
  auto it = replay_errors_.find(pod.uid);
  if (it != replay_errors_.end()) return Error{0, it->second};
  return {};
}

Status ZdsClient::remove(const std::string& uid) {
  std::lock_guard lock(mu_);
  pods_.erase(uid);
  if (!session_) return {};  // the next snapshot leaves it out
  Status s = request(zds::DelWorkload{uid}, -1);
  if (s || session_) return s;
  if (Status r = open_session(); !r) close_session(r.error().message);
  return {};  // either the replay left it out, or the proxy is gone and will not have it
}

Status ZdsClient::sync(const std::vector<PodWorkload>& all) {
  std::lock_guard lock(mu_);
  pods_.clear();
  for (const auto& p : all) pods_[p.uid] = p;
  synced_ = true;
  close_session("a new snapshot needs a new session");
  if (Status s = open_session(); !s) {
    close_session(s.error().message);
    return Error{s.error().code, "snapshot of " + std::to_string(pods_.size()) +
                                     " pod(s) remembered; the proxy is unreachable (" +
                                     s.error().message + "), it gets it when it connects"};
  }
  cv_.notify_all();  // the background thread re-arms its watch
  if (replay_errors_.empty()) return {};
  std::string all_errors;
  for (const auto& [uid, e] : replay_errors_) {
    all_errors += (all_errors.empty() ? "" : "; ") + uid + ": " + e;
  }
  return Error{0, std::to_string(replay_errors_.size()) + " of " + std::to_string(pods_.size()) +
                      " pod(s) refused: " + all_errors};
}

bool ZdsClient::peer_gone() {
  pollfd p{session_.get(), POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0) return true;
  // Nothing is due from the proxy between requests; read it to see whether it is an EOF.
  auto got = zds::receive_packet(session_.get(), 0);
  if (got.status == zds::ReceiveStatus::kClosed || got.status == zds::ReceiveStatus::kError) {
    return true;
  }
  if (got.status == zds::ReceiveStatus::kOk) SM_WARN("zds") << "unexpected message from the proxy";
  return false;
}

void ZdsClient::background() {
  std::unique_lock lock(mu_);
  auto backoff = options_.retry_min;
  auto next_attempt = Clock::now();
  bool warned = false;
  while (!stopping_) {
    if (session_ && peer_gone()) {
      close_session("the proxy went away; reconnecting to replay the snapshot");
      backoff = options_.retry_min;
      next_attempt = Clock::now();
    }
    if (!session_ && synced_ && Clock::now() >= next_attempt) {
      if (Status s = open_session(); s) {
        backoff = options_.retry_min;
        warned = false;
      } else {
        close_session(s.error().message);
        if (!warned) SM_WARN("zds") << "proxy not reachable (retrying): " << s.error().message;
        warned = true;
        next_attempt = Clock::now() + backoff;
        backoff = std::min(backoff * 2, options_.retry_max);
      }
    }
    // Short naps: a dropped connection is noticed within one, whatever the back-off.
    cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
  close_session("client stopped");
}

}  // namespace sockmesh::agent
