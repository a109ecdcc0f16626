#include "cni/plugin/agent_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sockmesh::cni {
namespace {

// The plugin is a short-lived process: a plain fd closed on every path is enough here.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

int64_t now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

AgentCall failure(CallStatus status, std::string error) {
  AgentCall call;
  call.status = status;
  call.error = std::move(error);
  return call;
}

}  // namespace

AgentCall call_agent(const std::string& socket_path, const PodEvent& event, int timeout_ms) {
  const int64_t deadline = now_ms() + timeout_ms;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) {
    return failure(CallStatus::kUnreachable, "agent socket path too long: " + socket_path);
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);

  Fd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) {
    return failure(CallStatus::kUnreachable, std::string("socket: ") + std::strerror(errno));
  }
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    // ENOENT: no socket file; ECONNREFUSED: a stale file, nobody listening; EAGAIN: backlog full.
    return failure(CallStatus::kUnreachable,
                   "connect " + socket_path + ": " + std::strerror(errno));
  }
  const std::string request = encode(event);
  if (send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return failure(CallStatus::kUnreachable,
                   "send to " + socket_path + ": " + std::strerror(errno));
  }

  std::string buffer(kMaxMessageBytes, '\0');
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      return failure(CallStatus::kTimedOut, "no answer from the node agent at " + socket_path +
                                                " within " + std::to_string(timeout_ms) + " ms");
    }
    pollfd p{fd.get(), POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      return failure(CallStatus::kUnreachable, std::string("poll: ") + std::strerror(errno));
    }
    if (ready == 0) continue;
    ssize_t n = recv(fd.get(), buffer.data(), buffer.size(), MSG_TRUNC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return failure(CallStatus::kUnreachable,
                     "receive from " + socket_path + ": " + std::strerror(errno));
    }
    if (n == 0) {
      return failure(CallStatus::kUnreachable,
                     "the node agent closed the connection without answering");
    }
    if (static_cast<size_t>(n) > buffer.size()) {
      return failure(CallStatus::kBadReply, "the node agent's answer is larger than " +
                                                std::to_string(kMaxMessageBytes) + " bytes");
    }
    std::string error;
    auto reply =
        decode_agent_reply(std::string_view(buffer.data(), static_cast<size_t>(n)), &error);
    if (!reply) return failure(CallStatus::kBadReply, "the node agent's answer: " + error);
    AgentCall call;
    call.status = CallStatus::kAnswered;
    call.reply = std::move(*reply);
    return call;
  }
}

}  // namespace sockmesh::cni
