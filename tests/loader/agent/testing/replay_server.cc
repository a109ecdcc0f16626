#include "testing/replay_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace sockmesh::agent::testing {
namespace {

bool send_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

const char* reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 404:
      return "Not Found";
    case 410:
      return "Gone";
    case 500:
      return "Internal Server Error";
    default:
      return "Status";
  }
}

}  // namespace

std::string recorded(const std::string& name) {
  const char* src = std::getenv("SOCKMESH_SOURCE_DIR");
  std::string dir = std::string(src ? src : ".") + "/tests/loader/agent/testdata/kube/";
  std::ifstream in(dir + name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ReplayServer::ReplayServer(std::vector<Exchange> script) : script_(std::move(script)) {
  listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  listen(listener_, 16);
  socklen_t len = sizeof(addr);
  getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

ReplayServer::~ReplayServer() {
  stopping_ = true;
  shutdown(listener_, SHUT_RDWR);
  acceptor_.join();
  {
    std::lock_guard lock(mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  }
  for (auto& t : threads_) t.join();
  for (int fd : fds_) close(fd);
  close(listener_);
}

void ReplayServer::accept_loop() {
  while (!stopping_) {
    int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard lock(mu_);
    fds_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

std::vector<Request> ReplayServer::requests() const {
  std::lock_guard lock(mu_);
  return requests_;
}

bool ReplayServer::wait_requests(size_t n, std::chrono::milliseconds timeout) const {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (requests().size() >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool ReplayServer::all_used() const {
  std::lock_guard lock(mu_);
  for (const auto& e : script_) {
    if (!e.used) return false;
  }
  return true;
}

void ReplayServer::serve(int fd) {
  // One request per connection is all the client sends at a time; keep-alive is not needed.
  for (;;) {
    std::string head;
    char c;
    while (head.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = recv(fd, &c, 1, 0);
      if (n <= 0) return;
      head.push_back(c);
    }
    Request request;
    std::istringstream lines(head);
    std::string method;
    lines >> method >> request.target;
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("Authorization:", 0) == 0) {
        request.authorization = line.substr(15);
        while (!request.authorization.empty() && request.authorization.back() == '\r') {
          request.authorization.pop_back();
        }
      }
    }
    const bool is_watch = request.target.find("watch=1") != std::string::npos;
    Exchange answer;
    bool found = false;
    {
      std::lock_guard lock(mu_);
      requests_.push_back(request);
      for (auto& e : script_) {
        if (e.used || e.watch != is_watch || request.target.rfind(e.path, 0) != 0) continue;
        bool all = true;
        for (const auto& s : e.must_contain) all &= request.target.find(s) != std::string::npos;
        if (!all) continue;
        e.used = true;
        answer = e;
        found = true;
        break;
      }
    }
    if (!found && !is_watch) {
      std::string body = R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",)"
                         R"("message":"not found","reason":"NotFound","code":404})";
      if (!send_all(fd,
                    "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                    "Content-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body)) {
        return;
      }
      continue;
    }
    if (!found) {
      // Nothing left to replay: an idle watch that never answers.
      while (!stopping_) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 50) > 0) {
          if (recv(fd, &c, 1, MSG_PEEK) <= 0) return;
        }
      }
      return;
    }
    std::string status_line = "HTTP/1.1 " + std::to_string(answer.status) + " " +
                              reason(answer.status) + "\r\nContent-Type: application/json\r\n";
    if (!is_watch || answer.status != 200) {
      std::string body;
      for (const auto& chunk : answer.chunks) body += chunk;
      if (!send_all(fd, status_line + "Content-Length: " + std::to_string(body.size()) +
                            "\r\n\r\n" + body)) {
        return;
      }
      continue;
    }
    if (!send_all(fd, status_line + "Transfer-Encoding: chunked\r\n\r\n")) return;
    for (const auto& chunk : answer.chunks) {
      std::this_thread::sleep_for(answer.gap);
      std::ostringstream size;
      size << std::hex << chunk.size();
      if (!send_all(fd, size.str() + "\r\n" + chunk + "\r\n")) return;
    }
    // The server ends the watch (its timeoutSeconds ran out, say).
    if (!send_all(fd, "0\r\n\r\n")) return;
  }
}

}  // namespace sockmesh::agent::testing
