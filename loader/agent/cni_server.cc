#include "loader/agent/cni_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "base/log.h"
#include "loader/agent/files.h"

namespace sockmesh::agent {
namespace {

using maps::Error;
using maps::UniqueFd;

// A plugin sends its event right after connecting; one that does not is not a plugin.
constexpr int kRequestTimeoutMs = 5000;

}  // namespace

CniEventServer::CniEventServer(std::string socket_path, Handler handler, LostHandler lost)
    : path_(std::move(socket_path)), handler_(std::move(handler)), lost_(std::move(lost)) {}

CniEventServer::~CniEventServer() { stop(); }

maps::Status CniEventServer::start() {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path_.size() >= sizeof(addr.sun_path)) return Error{ENAMETOOLONG, "socket path " + path_};
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  if (auto slash = path_.rfind('/'); slash != std::string::npos && slash > 0) {
    if (auto s = make_dirs(path_.substr(0, slash)); !s) return s;
  }
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) return Error::from_errno(errno, "creating the CNI event socket");
  // A socket file left by an earlier agent: nobody can be listening on it, or bind would be the
  // least of our worries (two agents on one node).
  unlink(path_.c_str());
  mode_t old_mask = umask(0077);
  int rc = bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old_mask);
  if (rc != 0) return Error::from_errno(errno, "binding " + path_);
  if (listen(fd.get(), 128) != 0) return Error::from_errno(errno, "listening on " + path_);
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return Error::from_errno(errno, "eventfd");
  listener_ = std::move(fd);
  wakeup_ = std::move(wake);
  started_ = true;
  acceptor_ = std::thread([this] { accept_loop(); });
  SM_INFO("agent") << "listening for CNI events on " << path_;
  return {};
}

void CniEventServer::stop() {
  if (!started_) return;
  started_ = false;
  uint64_t one = 1;
  (void)!write(wakeup_.get(), &one, sizeof(one));
  if (acceptor_.joinable()) acceptor_.join();
  std::list<Worker> workers;
  {
    std::lock_guard lock(mu_);
    workers.swap(workers_);
  }
  for (auto& w : workers) w.thread.join();
  listener_.reset();
  unlink(path_.c_str());
}

void CniEventServer::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wakeup_.get(), POLLIN, 0}};
    int ready = poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || (fds[1].revents & POLLIN)) return;
    if (!(fds[0].revents & POLLIN)) continue;
    UniqueFd connection(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        SM_WARN("agent") << "accepting a CNI event: " << std::strerror(errno);
      }
      continue;
    }
    std::lock_guard lock(mu_);
    // Finished workers are joined as new ones start, so threads do not pile up.
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    workers_.push_back(Worker{std::thread([this, done, c = std::move(connection)]() mutable {
                                serve(std::move(c));
                                done->store(true);
                              }),
                              done});
  }
}

void CniEventServer::serve(UniqueFd connection) {
  pollfd p{connection.get(), POLLIN, 0};
  if (poll(&p, 1, kRequestTimeoutMs) <= 0) return;
  std::string buffer(cni::kMaxMessageBytes, '\0');
  ssize_t n = recv(connection.get(), buffer.data(), buffer.size(), MSG_TRUNC);
  if (n <= 0) return;
  ++served_;
  cni::AgentReply reply;
  std::optional<cni::PodEvent> event;
  if (static_cast<size_t>(n) > buffer.size()) {
    reply = {cni::Outcome::kFailed,
             "event larger than " + std::to_string(cni::kMaxMessageBytes) + " bytes"};
  } else {
    std::string error;
    event = cni::decode_pod_event(std::string_view(buffer.data(), static_cast<size_t>(n)), &error);
    if (!event) {
      SM_WARN("agent") << "malformed CNI event: " << error;
      reply = {cni::Outcome::kFailed, "malformed event: " + error};
    } else {
      reply = handler_(*event);
    }
  }
  std::string bytes = cni::encode(reply);
  if (send(connection.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(bytes.size())) {
    SM_WARN("agent") << "the plugin left before the answer (" << std::strerror(errno) << ")";
    if (event && lost_) lost_(*event);
  }
}

}  // namespace sockmesh::agent
