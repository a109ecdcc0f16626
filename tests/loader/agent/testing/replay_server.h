#pragma once
// A local HTTP/1.1 server that replays recorded Kubernetes API answers: for each request, the first
// unused exchange whose target matches is sent back (a list as one body, a watch as chunks of
// newline-delimited events, an error status). A watch that matches nothing left is held open
// without an answer, as an idle watch is, until the server stops; any other request gets 404.
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sockmesh::agent::testing {

struct Exchange {
  std::string path;    // the request target must start with this ("/api/v1/namespaces?")
  bool watch = false;  // the target has watch=1 (or must not)
  std::vector<std::string> must_contain;  // further substrings of the target
  int status = 200;
  std::vector<std::string> chunks;  // the body; a watch sends one chunk per entry
  std::chrono::milliseconds gap{20};
  bool used = false;
};

struct Request {
  std::string target;
  std::string authorization;
};

class ReplayServer {
 public:
  explicit ReplayServer(std::vector<Exchange> script);
  ~ReplayServer();
  ReplayServer(const ReplayServer&) = delete;
  ReplayServer& operator=(const ReplayServer&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<Request> requests() const;
  // Waits until `n` requests have come in.
  bool wait_requests(size_t n, std::chrono::milliseconds timeout) const;
  bool all_used() const;

 private:
  void accept_loop();
  void serve(int fd);

  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::vector<Exchange> script_;
  std::vector<Request> requests_;
  std::vector<std::thread> threads_;
  std::vector<int> fds_;
  std::thread acceptor_;
};

// The file's text, from tests/loader/agent/testdata/kube.
std::string recorded(const std::string& name);

}  // namespace sockmesh::agent::testing
