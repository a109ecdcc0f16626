#include "loader/agent/cni_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "base/log.h"

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

maps::Result<UnixListener> CniEventServer::claim(const std::string& socket_path) {
  return UnixListener::open({.path = socket_path, .what = "CNI events", .backlog = 128});
}

maps::Status CniEventServer::start() {
  auto listener = claim(path_);
  if (!listener) return listener.error();
  return start(std::move(*listener));
}

maps::Status CniEventServer::start(UnixListener listener) {
  if (listener.path() != path_) {
    return Error{EINVAL, "CNI event socket " + listener.path() + " is not " + path_};
  }
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return Error::from_errno(errno, "eventfd");
  listener_ = std::move(listener);
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
  listener_.close();  // removes the socket file only if it is still ours
}

void CniEventServer::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listener_.fd(), POLLIN, 0}, {wakeup_.get(), POLLIN, 0}};
    int ready = poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || (fds[1].revents & POLLIN)) return;
    if (!(fds[0].revents & POLLIN)) continue;
    UniqueFd connection(accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC));
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
