#include "loader/agent/kube/api_client.h"

#include <curl/curl.h>

#include <cerrno>
#include <memory>
#include <mutex>

namespace sockmesh::agent::kube {
namespace {

using maps::Error;

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using Curl = std::unique_ptr<CURL, CurlDeleter>;
using Slist = std::unique_ptr<curl_slist, SlistDeleter>;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Transfer {
  CURL* curl = nullptr;
  const std::function<bool(std::string_view)>* on_line = nullptr;  // null: collect the body
  std::string pending;                                             // a line not yet complete
  std::string body;  // whole body (get) or the body of a non-200 answer (stream)
  const std::atomic<bool>* stopping = nullptr;
  bool stopped_by_reader = false;
};

size_t on_data(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t n = size * count;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (t->on_line == nullptr || status != 200) {
    t->body.append(data, n);
    return n;
  }
  t->pending.append(data, n);
  size_t start = 0;
  for (size_t nl = t->pending.find('\n'); nl != std::string::npos;
       nl = t->pending.find('\n', start)) {
    std::string_view line(t->pending.data() + start, nl - start);
    start = nl + 1;
    if (line.empty()) continue;
    if (!(*t->on_line)(line)) {
      t->stopped_by_reader = true;
      return 0;  // aborts the transfer
    }
  }
  t->pending.erase(0, start);
  return n;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  return t->stopping->load() ? 1 : 0;
}

}  // namespace

ApiClient::ApiClient(ClusterAccess access, std::chrono::milliseconds request_timeout)
    : access_(std::move(access)), request_timeout_(request_timeout) {
  global_init();
}

namespace {

// Sets URL, headers, TLS and callbacks shared by both kinds of request.
Slist prepare(CURL* curl, const ClusterAccess& a, const std::string& path, Transfer* t) {
  std::string url = a.server + path;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "https,http");
  curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, "");
  curl_slist* headers = curl_slist_append(nullptr, "Accept: application/json");
  std::string token = a.bearer_token();
  if (!token.empty()) {
    headers = curl_slist_append(headers, ("Authorization: Bearer " + token).c_str());
  }
  headers = curl_slist_append(headers, "User-Agent: sockmesh-agent");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (a.insecure_skip_tls_verify) {
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!a.ca_data.empty()) {
    curl_blob blob{const_cast<char*>(a.ca_data.data()), a.ca_data.size(), CURL_BLOB_COPY};
    curl_easy_setopt(curl, CURLOPT_CAINFO_BLOB, &blob);
  } else if (!a.ca_file.empty()) {
    curl_easy_setopt(curl, CURLOPT_CAINFO, a.ca_file.c_str());
  }
  if (!a.client_cert_data.empty()) {
    curl_blob cert{const_cast<char*>(a.client_cert_data.data()), a.client_cert_data.size(),
                   CURL_BLOB_COPY};
    curl_easy_setopt(curl, CURLOPT_SSLCERT_BLOB, &cert);
    curl_easy_setopt(curl, CURLOPT_SSLCERTTYPE, "PEM");
  } else if (!a.client_cert_file.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLCERT, a.client_cert_file.c_str());
  }
  if (!a.client_key_data.empty()) {
    curl_blob key{const_cast<char*>(a.client_key_data.data()), a.client_key_data.size(),
                  CURL_BLOB_COPY};
    curl_easy_setopt(curl, CURLOPT_SSLKEY_BLOB, &key);
    curl_easy_setopt(curl, CURLOPT_SSLKEYTYPE, "PEM");
  } else if (!a.client_key_file.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLKEY, a.client_key_file.c_str());
  }
  t->curl = curl;
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, t);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, t);
  return Slist(headers);
}

Error transfer_error(CURLcode code, const char* detail, const std::string& path) {
  std::string what = detail[0] != '\0' ? detail : curl_easy_strerror(code);
  return Error{ECOMM, "GET " + path + ": " + what};
}

}  // namespace

maps::Result<HttpResponse> ApiClient::get(const std::string& path) {
  if (stopping_) return Error{ECANCELED, "GET " + path + ": stopping"};
  Curl curl(curl_easy_init());
  if (!curl) return Error{ENOMEM, "curl_easy_init failed"};
  Transfer t;
  t.stopping = &stopping_;
  char detail[CURL_ERROR_SIZE] = {};
  Slist headers = prepare(curl.get(), access_, path, &t);
  curl_easy_setopt(curl.get(), CURLOPT_ERRORBUFFER, detail);
  curl_easy_setopt(curl.get(), CURLOPT_TIMEOUT_MS, static_cast<long>(request_timeout_.count()));
  CURLcode rc = curl_easy_perform(curl.get());
  if (rc != CURLE_OK) return transfer_error(rc, detail, path);
  HttpResponse response;
  curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &response.status);
  response.body = std::move(t.body);
  return response;
}

maps::Result<long> ApiClient::stream_lines(const std::string& path,
                                           const std::function<bool(std::string_view)>& on_line,
                                           std::chrono::seconds idle_timeout,
                                           std::string* error_body) {
  if (stopping_) return Error{ECANCELED, "GET " + path + ": stopping"};
  Curl curl(curl_easy_init());
  if (!curl) return Error{ENOMEM, "curl_easy_init failed"};
  Transfer t;
  t.on_line = &on_line;
  t.stopping = &stopping_;
  char detail[CURL_ERROR_SIZE] = {};
  Slist headers = prepare(curl.get(), access_, path, &t);
  curl_easy_setopt(curl.get(), CURLOPT_ERRORBUFFER, detail);
  // A watch has no overall timeout: the server ends it (timeoutSeconds); a dead connection is
  // one that carried nothing, not even a bookmark, for idle_timeout.
  curl_easy_setopt(curl.get(), CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl.get(), CURLOPT_LOW_SPEED_TIME, static_cast<long>(idle_timeout.count()));
  CURLcode rc = curl_easy_perform(curl.get());
  long status = 0;
  curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &status);
  if (error_body != nullptr) *error_body = std::move(t.body);
  if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && t.stopped_by_reader)) return status;
  if (rc == CURLE_ABORTED_BY_CALLBACK) return Error{ECANCELED, "GET " + path + ": stopping"};
  // The stream broke after a good start: the caller re-watches from its last resourceVersion.
  return transfer_error(rc, detail, path);
}

}  // namespace sockmesh::agent::kube
