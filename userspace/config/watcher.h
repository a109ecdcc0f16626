#pragma once
// Keeps a StateStore in step with a local config file.
//
// It polls the path rather than using inotify: re-opening the path on every poll follows editors
// that write a new file and rename it over the old one, and Kubernetes ConfigMap volumes whose
// symlinks are swapped, with no watch to re-arm. A change is applied only after the same content
// has been read on two consecutive polls, so a file caught half-written (an in-place truncate and
// write often parses as a valid, smaller config) is not applied.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "config/local_config.h"
#include "state/store.h"

namespace sockmesh::config {

class ConfigWatcher {
 public:
  static constexpr std::chrono::milliseconds kDefaultInterval{1000};

  // `store` must outlive the watcher.
  ConfigWatcher(std::string path, state::StateStore* store,
                std::chrono::milliseconds interval = kDefaultInterval);
  ~ConfigWatcher();
  ConfigWatcher(const ConfigWatcher&) = delete;
  ConfigWatcher& operator=(const ConfigWatcher&) = delete;

  // Reads and applies the file now, e.g. before start() so that a bad file fails startup. On
  // error the store keeps its snapshot and the error is returned (and logged).
  std::optional<ConfigError> reload();

  // Starts polling on a background thread. Calling it twice is harmless.
  void start();
  // Stops and joins the thread; also done by the destructor. Calling it twice is harmless.
  void stop();

  // Snapshots handed to the store so far.
  uint64_t applied_count() const;
  // The last parse or read error, cleared by the next successful apply.
  std::optional<ConfigError> last_error() const;
  const std::string& path() const { return path_; }

 private:
  void run();
  void poll_locked();
  std::optional<ConfigError> apply_locked(const std::string& text, size_t hash);

  const std::string path_;
  state::StateStore* const store_;
  const std::chrono::milliseconds interval_;

  // Guards all below and serialises reload() with the poller, so snapshots reach the store in the
  // order the file was read. StateStore listeners run under it and must not call back in here.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
  std::optional<size_t> seen_hash_;     // content last parsed, good or bad
  std::optional<size_t> pending_hash_;  // new content read once, waiting to be read again
  int logged_read_error_ = 0;           // errno last logged, so a missing file logs once
  uint64_t applied_ = 0;
  std::optional<ConfigError> last_error_;
};

}  // namespace sockmesh::config
