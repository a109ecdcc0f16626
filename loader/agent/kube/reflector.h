#pragma once
// One collection of the Kubernetes API (namespaces, the pods of a node) kept in step by list and
// watch, the way client-go's reflector does it: list at resourceVersion R, watch from R with
// bookmarks (allowWatchBookmarks), move R with every event and bookmark, re-watch from R when a
// watch ends, and list again when the server answers 410 Gone (R is older than it keeps).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "loader/agent/kube/api_client.h"

namespace sockmesh::agent::kube {

struct ReflectorOptions {
  std::chrono::seconds watch_timeout{300};  // timeoutSeconds of each watch request
  std::chrono::milliseconds backoff_min{200};
  std::chrono::milliseconds backoff_max{30000};
};

class Reflector {
 public:
  using Objects = std::map<std::string, nlohmann::json>;  // by "namespace/name" (or "name")
  // The whole collection after the initial list, each relist, and each event; on run()'s thread.
  using OnChange = std::function<void(const Objects&)>;

  // `path`: "/api/v1/namespaces"; `selector`: URL-encoded query parameters to add to both list
  // and watch ("fieldSelector=spec.nodeName%3Dnode-a"), may be empty.
  Reflector(ApiClient* client, std::string path, std::string selector, OnChange on_change,
            ReflectorOptions options = {});

  // Lists and watches until stop(). Blocks.
  void run();
  void stop();

  std::string resource_version() const;
  uint64_t lists() const { return lists_.load(); }
  uint64_t watches() const { return watches_.load(); }

 private:
  bool list();
  // Returns false when a relist is needed.
  bool watch();
  bool apply_event(std::string_view line, bool* need_relist);
  void backoff();

  ApiClient* const client_;
  const std::string path_;
  const std::string selector_;
  const OnChange on_change_;
  const ReflectorOptions options_;

  Objects objects_;
  mutable std::mutex mu_;  // guards resource_version_ and the stop flag
  std::condition_variable cv_;
  std::string resource_version_;
  bool stopping_ = false;
  std::chrono::milliseconds delay_;
  bool failed_ = false;  // the last watch ended with an error event other than 410
  std::atomic<uint64_t> lists_{0};
  std::atomic<uint64_t> watches_{0};
};

// "namespace/name" of an object, or "name" for a cluster-scoped one.
std::string object_key(const nlohmann::json& object);

// URL-encodes a query parameter value.
std::string url_encode(const std::string& value);

}  // namespace sockmesh::agent::kube
