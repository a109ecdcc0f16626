#include "loader/agent/kube/reflector.h"

#include <algorithm>
#include <cstdio>

#include "base/log.h"

namespace sockmesh::agent::kube {
namespace {

using Json = nlohmann::json;

std::string rv_of(const Json& object) {
  auto meta = object.find("metadata");
  if (meta == object.end() || !meta->is_object()) return "";
  auto rv = meta->find("resourceVersion");
  return rv != meta->end() && rv->is_string() ? rv->get<std::string>() : "";
}

}  // namespace

std::string object_key(const Json& object) {
  const Json& meta = object.at("metadata");
  std::string name = meta.at("name").get<std::string>();
  auto ns = meta.find("namespace");
  if (ns != meta.end() && ns->is_string() && !ns->get<std::string>().empty()) {
    return ns->get<std::string>() + "/" + name;
  }
  return name;
}

std::string url_encode(const std::string& value) {
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

Reflector::Reflector(ApiClient* client, std::string path, std::string selector, OnChange on_change,
                     ReflectorOptions options)
    : client_(client),
      path_(std::move(path)),
      selector_(std::move(selector)),
      on_change_(std::move(on_change)),
      options_(options),
      delay_(options.backoff_min) {}

std::string Reflector::resource_version() const {
  std::lock_guard lock(mu_);
  return resource_version_;
}

void Reflector::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  client_->stop();
}

void Reflector::backoff() {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, delay_, [&] { return stopping_; });
  delay_ = std::min(delay_ * 2, options_.backoff_max);
}

void Reflector::run() {
  bool need_list = true;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
    }
    if (need_list) {
      if (!list()) {
        backoff();
        continue;
      }
    }
    need_list = !watch();
  }
}

bool Reflector::list() {
  std::string url = path_ + (selector_.empty() ? "" : "?" + selector_);
  auto response = client_->get(url);
  if (!response) {
    if (!client_->stopping()) SM_WARN("kube") << "list " << url << ": " << response.error().message;
    return false;
  }
  if (response->status != 200) {
    SM_WARN("kube") << "list " << url << ": HTTP " << response->status << ": "
                    << response->body.substr(0, 300);
    return false;
  }
  Objects fresh;
  std::string rv;
  try {
    Json j = Json::parse(response->body);
    rv = j.at("metadata").at("resourceVersion").get<std::string>();
    for (auto& item : j.at("items")) {
      std::string key = object_key(item);
      fresh[key] = std::move(item);
    }
  } catch (const Json::exception& e) {
    SM_WARN("kube") << "list " << url << ": unexpected answer: " << e.what();
    return false;
  }
  objects_ = std::move(fresh);
  {
    std::lock_guard lock(mu_);
    resource_version_ = rv;
  }
  ++lists_;
  SM_DEBUG("kube") << "listed " << url << ": " << objects_.size() << " at resourceVersion " << rv;
  on_change_(objects_);
  return true;
}

bool Reflector::apply_event(std::string_view line, bool* need_relist) {
  Json event = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (event.is_discarded() || !event.is_object()) {
    SM_WARN("kube") << "watch " << path_ << ": a line that is not JSON; watching again";
    return false;
  }
  std::string type = event.value("type", "");
  const Json& object = event.contains("object") ? event["object"] : Json();
  if (type == "ERROR") {
    long code = object.is_object() ? object.value("code", 0L) : 0L;
    if (code == 410) {
      SM_INFO("kube") << "watch " << path_ << ": resourceVersion too old (410 Gone); listing again";
    } else {
      SM_WARN("kube") << "watch " << path_ << ": error event " << object.dump();
      failed_ = true;
    }
    *need_relist = true;
    return false;
  }
  std::string rv = rv_of(object);
  try {
    if (type == "ADDED" || type == "MODIFIED") {
      objects_[object_key(object)] = object;
    } else if (type == "DELETED") {
      objects_.erase(object_key(object));
    } else if (type != "BOOKMARK") {
      SM_WARN("kube") << "watch " << path_ << ": unknown event type " << type;
      return true;
    }
  } catch (const Json::exception& e) {
    SM_WARN("kube") << "watch " << path_ << ": malformed object: " << e.what();
    return true;
  }
  if (!rv.empty()) {
    std::lock_guard lock(mu_);
    resource_version_ = rv;
  }
  if (type != "BOOKMARK") on_change_(objects_);
  delay_ = options_.backoff_min;  // the server is answering
  return true;
}

bool Reflector::watch() {
  std::string url =
      path_ + "?" + (selector_.empty() ? "" : selector_ + "&") +
      "watch=1&allowWatchBookmarks=true&resourceVersion=" + url_encode(resource_version()) +
      "&timeoutSeconds=" + std::to_string(options_.watch_timeout.count());
  ++watches_;
  bool need_relist = false;
  failed_ = false;
  std::string error_body;
  auto status = client_->stream_lines(
      url, [&](std::string_view line) { return apply_event(line, &need_relist); },
      options_.watch_timeout + std::chrono::seconds(30), &error_body);
  if (!status) {
    if (client_->stopping()) return true;
    SM_WARN("kube") << "watch " << path_ << ": " << status.error().message
                    << "; watching again from resourceVersion " << resource_version();
    backoff();
    return true;
  }
  if (*status == 410) {
    SM_INFO("kube") << "watch " << path_ << ": 410 Gone; listing again";
    return false;
  }
  if (*status != 200) {
    SM_WARN("kube") << "watch " << path_ << ": HTTP " << *status << ": "
                    << error_body.substr(0, 300);
    backoff();
    return false;
  }
  if (failed_) backoff();
  return !need_relist;
}

}  // namespace sockmesh::agent::kube
