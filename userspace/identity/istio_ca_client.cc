#include "identity/istio_ca_client.h"

#include <grpcpp/grpcpp.h>

#include "base/log.h"
#include "identity/csr.h"
#include "identity/verify.h"
#include "istio/v1/auth/ca.grpc.pb.h"

namespace sockmesh::identity {
namespace {

constexpr std::string_view kScope = "identity";
namespace pb = ::istio::v1::auth;

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string_view code_name(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

}  // namespace

struct IstioCaClient::Channel {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::IstioCertificateService::Stub> stub;
};

std::shared_ptr<IstioCaClient::Channel> IstioCaClient::make_channel(const std::string& target,
                                                                    const std::string& roots_pem) {
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = roots_pem;
  grpc::ChannelArguments args;
  // A CA that was away is tried again soon: the cache's backoff decides how often we ask.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  auto c = std::make_shared<IstioCaClient::Channel>();
  c->channel = grpc::CreateCustomChannel(target, grpc::SslCredentials(tls), args);
  c->stub = pb::IstioCertificateService::NewStub(c->channel);
  return c;
}

std::optional<std::string> ca_target_of(std::string_view address) {
  constexpr std::string_view kHttps = "https://";
  if (address.substr(0, kHttps.size()) == kHttps) address.remove_prefix(kHttps.size());
  while (!address.empty() && address.back() == '/') address.remove_suffix(1);
  auto colon = address.rfind(':');
  if (address.empty() || colon == std::string_view::npos || colon == 0 ||
      colon + 1 == address.size() || address.find('/') != std::string_view::npos) {
    return std::nullopt;
  }
  for (char c : address.substr(colon + 1)) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return std::string(address);
}

IstioCaClient::IstioCaClient(IstioCaOptions options, std::string target, WatchedRootFile roots)
    : options_(std::move(options)),
      target_(std::move(target)),
      roots_(std::move(roots)),
      channel_(make_channel(target_, roots_.first_pem())) {}

IstioCaClient::~IstioCaClient() = default;

Result<std::shared_ptr<IstioCaClient>> IstioCaClient::create(IstioCaOptions options) {
  auto target = ca_target_of(options.address);
  if (!target) {
    return Error{"CA address '" + options.address + "' is not https://host:port or host:port"};
  }
  if (options.root_ca_file.empty()) return Error{"no CA root file set (--ca-root-ca)"};
  if (options.max_in_flight == 0) options.max_in_flight = 1;
  auto roots = WatchedRootFile::open(options.root_ca_file);
  if (!roots) return roots.error();
  SM_INFO(kScope) << "Istio CA client: address=" << *target
                  << " root_ca=" << options.root_ca_file.string()
                  << " roots=" << roots->roots()->size() << " token_file="
                  << (options.token_file.empty() ? "(none)" : options.token_file.string())
                  << " cluster_id=" << options.cluster_id << " ttl_s=" << options.ttl.count();
  return std::shared_ptr<IstioCaClient>(
      new IstioCaClient(std::move(options), *std::move(target), *std::move(roots)));
}

std::shared_ptr<IstioCaClient::Channel> IstioCaClient::channel() const {
  std::lock_guard lock(mu_);
  return channel_;
}

TrustRootsPtr IstioCaClient::trust_roots() const { return roots_.roots(); }

void IstioCaClient::refresh() {
  auto bundle = roots_.reload(kScope, "CA roots", "new connections and CA calls use them");
  if (!bundle) return;
  auto channel = make_channel(target_, bundle->pem);
  std::lock_guard lock(mu_);
  channel_ = std::move(channel);
}

Result<CertifiedKeyPtr> IstioCaClient::issue(const SpiffeId& id) {
  {
    std::unique_lock lock(slots_mu_);
    slots_cv_.wait(lock, [this] { return in_flight_ < options_.max_in_flight; });
    ++in_flight_;
  }
  auto result = call(id);
  {
    std::lock_guard lock(slots_mu_);
    --in_flight_;
  }
  slots_cv_.notify_one();
  if (options_.on_fetch) options_.on_fetch(result.ok());
  return result;
}

void IstioCaClient::cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
  if (!calls_.empty()) {
    SM_INFO(kScope) << "stopping: cancelling " << calls_.size() << " CA call(s) in flight to "
                    << target_;
  }
  for (auto* ctx : calls_) ctx->TryCancel();
}

Result<CertifiedKeyPtr> IstioCaClient::call(const SpiffeId& id) {
  const std::string name = id.to_string();
  auto request = make_certificate_request(id);
  if (!request) return request.error();

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + options_.call_timeout);
  {
    std::lock_guard lock(mu_);
    if (cancelled_) return Error{"the proxy is stopping: no new CA call"};
    calls_.insert(&ctx);
  }
  struct Unregister {
    IstioCaClient* self;
    grpc::ClientContext* ctx;
    ~Unregister() {
      std::lock_guard lock(self->mu_);
      self->calls_.erase(ctx);
    }
  } unregister{this, &ctx};
  if (!options_.token_file.empty()) {
    auto token = files::read(options_.token_file);
    if (!token)
      return Error{"token file " + options_.token_file.string() + ": " + token.error().message};
    if (!token->has_value()) {
      return Error{"token file " + options_.token_file.string() + ": no such file"};
    }
    std::string bearer = trim(**token);
    if (bearer.empty()) return Error{"token file " + options_.token_file.string() + " is empty"};
    ctx.AddMetadata("authorization", "Bearer " + bearer);
  }
  ctx.AddMetadata("clusterid", options_.cluster_id);

  pb::IstioCertificateRequest req;
  req.set_csr(request->csr_pem);
  req.set_validity_duration(options_.ttl.count());
  if (options_.impersonate) {
    (*req.mutable_metadata()->mutable_fields())["ImpersonatedIdentity"].set_string_value(name);
  }
  pb::IstioCertificateResponse resp;
  std::shared_ptr<Channel> ch = channel();
  grpc::Status st = ch->stub->CreateCertificate(&ctx, req, &resp);
  if (!st.ok()) {
    std::string detail = std::string(code_name(st.error_code())) + ": " + st.error_message();
    switch (st.error_code()) {
      case grpc::StatusCode::UNAUTHENTICATED:
      case grpc::StatusCode::PERMISSION_DENIED:
        return Error{"the CA at " + target_ + " refused our credentials for " + name + " (" +
                     detail + "); check the token in " +
                     (options_.token_file.empty() ? std::string("(no token file set)")
                                                  : options_.token_file.string())};
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return Error{"no answer from the CA at " + target_ + " within " +
                     std::to_string(options_.call_timeout.count()) + " ms (" + detail + ")"};
      case grpc::StatusCode::UNAVAILABLE:
        if (detail.find("CERTIFICATE_VERIFY_FAILED") != std::string::npos ||
            detail.find("andshake") != std::string::npos ||
            detail.find("certificate verify") != std::string::npos) {
          return Error{"TLS to the CA at " + target_ +
                       " failed: its server certificate does not verify against the CA root " +
                       options_.root_ca_file.string() + " (" + detail + ")"};
        }
        return Error{"the CA at " + target_ + " is unreachable (" + detail + ")"};
      default:
        return Error{"the CA at " + target_ + " refused the request for " + name + " (" + detail +
                     ")"};
    }
  }
  std::vector<std::string> chain(resp.cert_chain().begin(), resp.cert_chain().end());
  TrustRootsPtr roots = trust_roots();
  return accept_issued_chain(chain, std::move(request->key), id, *roots, now_from(options_.clock));
}

}  // namespace sockmesh::identity
