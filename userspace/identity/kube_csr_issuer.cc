#include "identity/kube_csr_issuer.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "base/log.h"
#include "identity/csr.h"
#include "identity/verify.h"

namespace sockmesh::identity {
namespace {

constexpr std::string_view kScope = "identity";
constexpr const char* kCsrPath = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
using Json = nlohmann::json;
// The API server refuses a shorter spec.expirationSeconds.
constexpr std::chrono::seconds kMinExpiration{600};

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string base64_encode(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

std::optional<std::string> base64_decode(std::string_view in) {
  std::string clean;
  for (char c : in) {
    if (c != '\n' && c != '\r' && c != ' ') clean.push_back(c);
  }
  if (clean.empty() || clean.size() % 4 != 0) return std::nullopt;
  std::string out(clean.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(clean.data()),
                          static_cast<int>(clean.size()));
  if (n < 0) return std::nullopt;
  size_t pad = clean.size() - clean.find_last_not_of('=') - 1;
  if (pad > 2) return std::nullopt;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

std::string random_suffix() {
  unsigned char bytes[8];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return "0000000000000000";
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : bytes) {
    s.push_back(hex[b >> 4]);
    s.push_back(hex[b & 15]);
  }
  return s;
}

// "reason: message" of a Kubernetes Status object, or the text itself (shortened).
std::string status_detail(const std::string& body) {
  std::string detail;
  auto j = Json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    detail = j["message"].get<std::string>();
    if (j.contains("reason") && j["reason"].is_string()) {
      detail = j["reason"].get<std::string>() + ": " + detail;
    }
  } else {
    detail = body.substr(0, 200);
  }
  return detail;
}

std::string status_text(long status, const std::string& body) {
  std::string detail = status_detail(body);
  return "HTTP " + std::to_string(status) + (detail.empty() ? "" : " (" + detail + ")");
}

// One HTTP request with libcurl. With on_line set, a 200 body is handed over line by line
// (a watch); on_line returning false ends the transfer.
struct Request {
  std::string method = "GET";
  std::string url;
  std::string body;  // for POST
  std::chrono::milliseconds timeout{10000};
  std::chrono::milliseconds connect_timeout{10000};
  const std::atomic<bool>* abort = nullptr;  // checked about once a second while running
  const std::function<bool(std::string_view)>* on_line = nullptr;
};

struct Transfer {
  CURL* curl = nullptr;
  const Request* req = nullptr;
  std::string pending;
  std::string body;
  bool stopped_by_reader = false;
};

size_t on_data(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t n = size * count;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (t->req->on_line == nullptr || status != 200) {
    if (t->body.size() < (1u << 20)) t->body.append(data, n);
    return n;
  }
  t->pending.append(data, n);
  size_t start = 0;
  for (size_t nl = t->pending.find('\n'); nl != std::string::npos;
       nl = t->pending.find('\n', start)) {
    std::string_view line(t->pending.data() + start, nl - start);
    start = nl + 1;
    if (line.empty()) continue;
    if (!(*t->req->on_line)(line)) {
      t->stopped_by_reader = true;
      return 0;
    }
  }
  t->pending.erase(0, start);
  if (t->pending.size() > (4u << 20)) return 0;  // one watch event larger than 4 MiB: give up
  return n;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  return t->req->abort != nullptr && t->req->abort->load() ? 1 : 0;
}

enum class Outcome { kDone, kTimedOut, kAborted, kFailed };

struct Answer {
  Outcome outcome = Outcome::kFailed;
  long status = 0;
  std::string body;
  std::string error;  // transport error text
};

Answer perform(const Request& req, const KubeCsrOptions& o) {
  curl_init_once();
  Answer a;
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (!curl) {
    a.error = "curl_easy_init failed";
    return a;
  }
  CURL* c = curl.get();
  Transfer t;
  t.curl = c;
  t.req = &req;
  char detail[CURL_ERROR_SIZE] = {};
  curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "https,http");
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, detail);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(req.connect_timeout.count()));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(std::max<int64_t>(1, req.timeout.count())));
  if (!o.api_ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, o.api_ca_file.c_str());
  curl_slist* headers = curl_slist_append(nullptr, "Accept: application/json");
  headers = curl_slist_append(headers, "User-Agent: sockmesh-proxy");
  std::unique_ptr<curl_slist, SlistDeleter> header_list(headers);
  if (!o.token_file.empty()) {
    auto token = files::read(o.token_file);
    std::string bearer = token && token->has_value() ? trim(**token) : std::string();
    if (bearer.empty()) {
      a.error = "token file " + o.token_file.string() +
                (!token               ? ": " + token.error().message
                 : token->has_value() ? " is empty"
                                      : ": no such file");
      return a;
    }
    header_list.reset(
        curl_slist_append(header_list.release(), ("Authorization: Bearer " + bearer).c_str()));
  }
  if (req.method == "POST") {
    header_list.reset(curl_slist_append(header_list.release(), "Content-Type: application/json"));
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, req.body.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(req.body.size()));
  } else if (req.method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, header_list.get());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
  CURLcode rc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a.status);
  a.body = std::move(t.body);
  if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && t.stopped_by_reader)) {
    a.outcome = Outcome::kDone;
  } else if (rc == CURLE_ABORTED_BY_CALLBACK) {
    a.outcome = Outcome::kAborted;
  } else if (rc == CURLE_OPERATION_TIMEDOUT && a.status != 0) {
    a.outcome = Outcome::kTimedOut;  // the answer had started: a watch that saw no decision
  } else {
    a.error = detail[0] != '\0' ? detail : curl_easy_strerror(rc);
    a.outcome = rc == CURLE_OPERATION_TIMEDOUT ? Outcome::kTimedOut : Outcome::kFailed;
  }
  return a;
}

// What one CertificateSigningRequest object says about its outcome.
struct Decision {
  enum Kind { kPending, kIssued, kRefused } kind = kPending;
  std::string certificate_pem;  // kIssued
  std::string refusal;          // kRefused: "Denied (reason: message)"
};

Decision decide(const Json& object) {
  Decision d;
  if (!object.is_object()) return d;
  const Json* status = object.contains("status") ? &object["status"] : nullptr;
  if (status == nullptr || !status->is_object()) return d;
  bool approved = false;
  if (status->contains("conditions") && (*status)["conditions"].is_array()) {
    for (const auto& c : (*status)["conditions"]) {
      if (!c.is_object() || !c.contains("type") || !c["type"].is_string()) continue;
      std::string type = c["type"].get<std::string>();
      std::string st = c.contains("status") && c["status"].is_string()
                           ? c["status"].get<std::string>()
                           : std::string("True");
      if (st == "False") continue;
      if (type == "Denied" || type == "Failed") {
        auto field = [&c](const char* k) {
          return c.contains(k) && c[k].is_string() ? c[k].get<std::string>() : std::string();
        };
        d.kind = Decision::kRefused;
        d.refusal = type + " (reason: " + (field("reason").empty() ? "none" : field("reason")) +
                    ", message: " + (field("message").empty() ? "none" : field("message")) + ")";
        return d;
      }
      if (type == "Approved") approved = true;
    }
  }
  if (approved && status->contains("certificate") && (*status)["certificate"].is_string() &&
      !(*status)["certificate"].get<std::string>().empty()) {
    auto pem = base64_decode((*status)["certificate"].get<std::string>());
    d.kind = Decision::kIssued;
    d.certificate_pem = pem.value_or(std::string());
  }
  return d;
}

}  // namespace

std::string in_cluster_api_server(const std::map<std::string, std::string>& env) {
  auto host = env.find("KUBERNETES_SERVICE_HOST");
  auto port = env.find("KUBERNETES_SERVICE_PORT");
  if (host == env.end() || port == env.end() || host->second.empty() || port->second.empty()) {
    return "";
  }
  std::string h = host->second;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";
  return "https://" + h + ":" + port->second;
}

std::string csr_object_json(const std::string& name, const std::string& csr_pem,
                            const std::string& signer_name, const SpiffeId& id,
                            std::chrono::seconds expiration) {
  Json j = {
      {"apiVersion", "certificates.k8s.io/v1"},
      {"kind", "CertificateSigningRequest"},
      {"metadata",
       {{"name", name},
        {"labels", {{"app.kubernetes.io/managed-by", "sockmesh"}}},
        {"annotations", {{"sockmesh.io/identity", id.to_string()}}}}},
      {"spec",
       {{"request", base64_encode(csr_pem)},
        {"signerName", signer_name},
        {"expirationSeconds", expiration.count()},
        {"usages", {"digital signature", "key encipherment", "client auth", "server auth"}}}},
  };
  return j.dump();
}

KubeCsrIssuer::KubeCsrIssuer(KubeCsrOptions options, WatchedRootFile roots)
    : options_(std::move(options)), roots_(std::move(roots)) {}

KubeCsrIssuer::~KubeCsrIssuer() = default;

Result<std::shared_ptr<KubeCsrIssuer>> KubeCsrIssuer::create(KubeCsrOptions options) {
  while (!options.api_server.empty() && options.api_server.back() == '/') {
    options.api_server.pop_back();
  }
  if (options.api_server.empty()) {
    return Error{
        "no Kubernetes API server: set --k8s-api-server, or run in a pod "
        "(KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT)"};
  }
  if (options.api_server.rfind("https://", 0) != 0 && options.api_server.rfind("http://", 0) != 0) {
    return Error{"Kubernetes API server '" + options.api_server + "' is not https://host:port"};
  }
  if (options.signer_name.empty()) return Error{"no signer name set (--k8s-signer-name)"};
  if (options.root_ca_file.empty()) return Error{"no root file set (--ca-root-ca)"};
  if (!options.api_ca_file.empty() && !std::filesystem::exists(options.api_ca_file)) {
    return Error{"Kubernetes API CA file " + options.api_ca_file.string() + ": no such file"};
  }
  if (options.max_in_flight == 0) options.max_in_flight = 1;
  auto roots = WatchedRootFile::open(options.root_ca_file);
  if (!roots) return roots.error();
  if (options.ttl < kMinExpiration) {
    SM_WARN(kScope) << "secret TTL " << options.ttl.count()
                    << " s is below the CSR API's minimum expirationSeconds; asking for "
                    << kMinExpiration.count() << " s";
  }
  SM_INFO(kScope) << "Kubernetes CSR issuer: api_server=" << options.api_server
                  << " signer=" << options.signer_name << " api_ca="
                  << (options.api_ca_file.empty() ? "(system)" : options.api_ca_file.string())
                  << " root_ca=" << options.root_ca_file.string()
                  << " roots=" << roots->roots()->size() << " token_file="
                  << (options.token_file.empty() ? "(none)" : options.token_file.string())
                  << " ttl_s=" << options.ttl.count()
                  << " approval_timeout_ms=" << options.approval_timeout.count();
  return std::shared_ptr<KubeCsrIssuer>(new KubeCsrIssuer(std::move(options), *std::move(roots)));
}

TrustRootsPtr KubeCsrIssuer::trust_roots() const { return roots_.roots(); }

void KubeCsrIssuer::refresh() { roots_.reload(kScope, "roots", "new connections use them"); }

void KubeCsrIssuer::cancel() {
  if (!cancelled_.exchange(true)) {
    std::lock_guard lock(slots_mu_);
    if (in_flight_ > 0) {
      SM_INFO(kScope) << "stopping: abandoning " << in_flight_
                      << " certificate signing request(s) in flight";
    }
  }
}

Result<CertifiedKeyPtr> KubeCsrIssuer::issue(const SpiffeId& id) {
  {
    std::unique_lock lock(slots_mu_);
    slots_cv_.wait(lock, [this] { return in_flight_ < options_.max_in_flight; });
    ++in_flight_;
  }
  auto result = run(id);
  {
    std::lock_guard lock(slots_mu_);
    --in_flight_;
  }
  slots_cv_.notify_one();
  if (options_.on_fetch) options_.on_fetch(result.ok());
  return result;
}

Result<CertifiedKeyPtr> KubeCsrIssuer::run(const SpiffeId& id) {
  const std::string who = id.to_string();
  if (cancelled_) return Error{"the proxy is stopping: no new certificate signing request"};
  auto request = make_certificate_request(id);
  if (!request) return request.error();
  const std::string name = options_.name_prefix + random_suffix();
  std::chrono::seconds expiration = std::max(options_.ttl, kMinExpiration);

  Request post;
  post.method = "POST";
  post.url = options_.api_server + kCsrPath;
  post.body = csr_object_json(name, request->csr_pem, options_.signer_name, id, expiration);
  post.timeout = options_.request_timeout;
  post.connect_timeout = options_.request_timeout;
  post.abort = &cancelled_;
  Answer created = perform(post, options_);
  if (created.outcome == Outcome::kAborted) {
    delete_csr(name);  // it may have been created before we gave up
    return Error{"the proxy is stopping: CSR " + name + " for " + who + " abandoned"};
  }
  if (created.outcome != Outcome::kDone) {
    if (created.status != 0 || created.outcome == Outcome::kTimedOut) delete_csr(name);
    return Error{"creating CSR " + name + " for " + who + " at " + options_.api_server +
                 " failed: " + created.error};
  }
  if (created.status != 200 && created.status != 201 && created.status != 202) {
    std::string hint = created.status == 401 || created.status == 403
                           ? "; check the token in " +
                                 (options_.token_file.empty() ? std::string("(no token file set)")
                                                              : options_.token_file.string()) +
                                 " and its RBAC (create on certificatesigningrequests)"
                           : "";
    return Error{"the Kubernetes API refused CSR " + name + " for " + who + ": " +
                 status_text(created.status, created.body) + hint};
  }
  SM_DEBUG(kScope) << "created CSR " << name << " for " << who << " signer " << options_.signer_name
                   << " expirationSeconds " << expiration.count();

  auto pem = wait_for_certificate(name, id);
  delete_csr(name);
  if (!pem) return pem.error();
  TrustRootsPtr roots = trust_roots();
  auto accepted =
      accept_issued_chain({*pem}, std::move(request->key), id, *roots, now_from(options_.clock));
  if (!accepted) {
    return Error{"CSR " + name + " for " + who + " (signer " + options_.signer_name +
                 "): the issued certificate is refused: " + accepted.error().message};
  }
  SM_INFO(kScope) << "CSR " << name << " for " << who << " issued by " << options_.signer_name
                  << ": serial " << (*accepted)->serial();
  return accepted;
}

Result<std::string> KubeCsrIssuer::wait_for_certificate(const std::string& name,
                                                        const SpiffeId& id) {
  using std::chrono::steady_clock;
  const std::string who = id.to_string();
  const auto deadline = steady_clock::now() + options_.approval_timeout;
  Decision decision;
  std::string event_error;
  std::function<bool(std::string_view)> on_line = [&](std::string_view line) {
    auto event = Json::parse(line, nullptr, false);
    if (!event.is_object() || !event.contains("type") || !event["type"].is_string()) return true;
    std::string type = event["type"].get<std::string>();
    const Json& object = event.contains("object") ? event["object"] : Json();
    if (type == "ERROR") {
      event_error = "the watch failed: " + status_detail(object.dump());
      return false;
    }
    if (type == "DELETED") {
      event_error = "it was deleted before a certificate was issued";
      return false;
    }
    decision = decide(object);
    return decision.kind == Decision::kPending;
  };
  // Re-watch when the server ends a watch early, until the deadline; bounded by it and by a
  // count, in case a server closes each watch at once.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady_clock::now());
    if (left <= std::chrono::milliseconds(0)) break;
    Request watch;
    watch.url = options_.api_server + kCsrPath + "?watch=true&fieldSelector=metadata.name%3D" +
                name + "&timeoutSeconds=" + std::to_string((left.count() + 999) / 1000);
    watch.timeout = left;
    watch.connect_timeout = std::min(left, options_.request_timeout);
    watch.abort = &cancelled_;
    watch.on_line = &on_line;
    Answer a = perform(watch, options_);
    if (decision.kind == Decision::kIssued) {
      if (decision.certificate_pem.empty()) {
        return Error{"CSR " + name + " for " + who +
                     " was approved, but status.certificate is not base64"};
      }
      return decision.certificate_pem;
    }
    if (decision.kind == Decision::kRefused) {
      return Error{"CSR " + name + " for " + who + " (signer " + options_.signer_name + ") was " +
                   decision.refusal};
    }
    if (!event_error.empty()) return Error{"CSR " + name + " for " + who + ": " + event_error};
    if (a.outcome == Outcome::kAborted) {
      return Error{"the proxy is stopping: CSR " + name + " for " + who + " abandoned"};
    }
    if (a.outcome == Outcome::kTimedOut) break;
    if (a.outcome == Outcome::kFailed) {
      return Error{"watching CSR " + name + " for " + who + " failed: " + a.error};
    }
    if (a.status != 200) {
      return Error{"watching CSR " + name + " for " + who +
                   " failed: " + status_text(a.status, a.body)};
    }
    // 200 and the stream ended without a decision: watch again while time is left. A short
    // pause keeps a server that closes at once from being asked in a tight loop.
    if (steady_clock::now() + std::chrono::milliseconds(100) < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return Error{"CSR " + name + " for " + who + " (signer " + options_.signer_name +
               ") was neither approved nor denied within " +
               std::to_string(options_.approval_timeout.count()) +
               " ms; is there an approver for this signer?"};
}

void KubeCsrIssuer::delete_csr(const std::string& name) {
  Request del;
  del.method = "DELETE";
  del.url = options_.api_server + kCsrPath + std::string("/") + name;
  // Not abortable: a stopping proxy still removes its CSR, within a short bound.
  del.timeout = std::min(options_.request_timeout, std::chrono::milliseconds(3000));
  del.connect_timeout = del.timeout;
  Answer a = perform(del, options_);
  if (a.outcome != Outcome::kDone) {
    SM_WARN(kScope) << "could not delete CSR " << name << ": " << a.error;
  } else if (a.status != 200 && a.status != 202 && a.status != 404) {
    SM_WARN(kScope) << "could not delete CSR " << name << ": " << status_text(a.status, a.body);
  } else {
    SM_DEBUG(kScope) << "deleted CSR " << name;
  }
}

}  // namespace sockmesh::identity
