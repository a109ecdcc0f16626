#pragma once
// GETs against the Kubernetes API with libcurl: whole responses (list, get) and line-delimited
// streams (watch). Authentication and TLS come from ClusterAccess.
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "loader/agent/kube/cluster_access.h"
#include "loader/maps/result.h"

namespace sockmesh::agent::kube {

struct HttpResponse {
  long status = 0;
  std::string body;
};

class ApiClient {
 public:
  explicit ApiClient(ClusterAccess access,
                     std::chrono::milliseconds request_timeout = std::chrono::seconds(30));
  ApiClient(const ApiClient&) = delete;
  ApiClient& operator=(const ApiClient&) = delete;

  // GET <server><path>. Transport failures are errors; every HTTP status is a response.
  maps::Result<HttpResponse> get(const std::string& path);

  // GET <server><path> and hand each line of a 200 body to `on_line` (return false to stop
  // reading). Ends when the server closes, nothing arrives for `idle_timeout`, or stop(). Returns
  // the HTTP status; the body of a non-200 answer is in `*error_body`.
  maps::Result<long> stream_lines(const std::string& path,
                                  const std::function<bool(std::string_view)>& on_line,
                                  std::chrono::seconds idle_timeout, std::string* error_body);

  // Ends running and later requests soon, from any thread.
  void stop() { stopping_ = true; }
  bool stopping() const { return stopping_.load(); }
  const ClusterAccess& access() const { return access_; }

 private:
  const ClusterAccess access_;
  const std::chrono::milliseconds request_timeout_;
  std::atomic<bool> stopping_{false};
};

}  // namespace sockmesh::agent::kube
