#include "config/watcher.h"

#include <cerrno>
#include <cstring>
#include <functional>
#include <utility>

#include "base/log.h"
#include "config/read_file.h"

namespace sockmesh::config {
namespace {

ConfigError read_error(const std::string& path, int err) {
  std::string why = read_config_error_text(err);
  return ConfigError{path, 0, 0, "", "cannot read: " + why};
}

}  // namespace

ConfigWatcher::ConfigWatcher(std::string path, state::StateStore* store,
                             std::chrono::milliseconds interval)
    : path_(std::move(path)), store_(store), interval_(interval) {}

ConfigWatcher::~ConfigWatcher() { stop(); }

std::optional<ConfigError> ConfigWatcher::reload() {
  std::lock_guard lock(mu_);
  std::string text;
  if (int err = read_config_file(path_, &text); err != 0) {
    last_error_ = read_error(path_, err);
    SM_ERROR("config") << last_error_->to_string() << "; keeping the current configuration";
    return last_error_;
  }
  pending_hash_.reset();
  return apply_locked(text, std::hash<std::string>{}(text));
}

void ConfigWatcher::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { run(); });
}

void ConfigWatcher::stop() {
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t ConfigWatcher::applied_count() const {
  std::lock_guard lock(mu_);
  return applied_;
}

std::optional<ConfigError> ConfigWatcher::last_error() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

void ConfigWatcher::run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (cv_.wait_for(lock, interval_, [this] { return stopping_; })) break;
    poll_locked();
  }
}

void ConfigWatcher::poll_locked() {
  std::string text;
  if (int err = read_config_file(path_, &text); err != 0) {
    // ENOENT is normal for a moment during a rename-replace; either way the old config stays.
    if (err != logged_read_error_) {
      logged_read_error_ = err;
      SM_WARN("config") << read_error(path_, err).to_string()
                        << "; keeping the current configuration";
    }
    pending_hash_.reset();
    return;
  }
  if (logged_read_error_ != 0) {
    SM_INFO("config") << path_ << " is readable again";
    logged_read_error_ = 0;
  }
  size_t hash = std::hash<std::string>{}(text);
  if (hash == seen_hash_) {
    pending_hash_.reset();
    return;
  }
  if (hash != pending_hash_) {
    pending_hash_ = hash;
    return;
  }
  pending_hash_.reset();
  apply_locked(text, hash);
}

std::optional<ConfigError> ConfigWatcher::apply_locked(const std::string& text, size_t hash) {
  // Remember bad content too, so a broken file is reported once rather than on every poll.
  seen_hash_ = hash;
  ParseResult result = parse_local_config(text, path_);
  if (const ConfigError* e = error_of(result)) {
    last_error_ = *e;
    SM_ERROR("config") << e->to_string() << "; keeping the previous configuration";
    return last_error_;
  }
  state::SnapshotPtr snapshot = snapshot_of(result);
  SM_INFO("config") << "loaded " << path_ << " workloads=" << snapshot->workloads().size()
                    << " services=" << snapshot->services().size()
                    << " policies=" << snapshot->policies().size();
  store_->set(std::move(snapshot));
  ++applied_;
  last_error_.reset();
  return std::nullopt;
}

}  // namespace sockmesh::config
