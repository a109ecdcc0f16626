#include "xds/delta_client.h"

#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "base/log.h"
#include "envoy/service/discovery/v3/ads.grpc.pb.h"

namespace sockmesh::xds {
namespace {

using envoy::service::discovery::v3::AggregatedDiscoveryService;
using envoy::service::discovery::v3::DeltaDiscoveryRequest;
using envoy::service::discovery::v3::DeltaDiscoveryResponse;

constexpr const char* kTypes[] = {kAddressType, kAuthorizationType};

bool read_whole_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return static_cast<bool>(in) || in.eof();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// gRPC wants host:port; operators write istiod's address as ztunnel does, with a scheme.
std::string grpc_target(const std::string& address) {
  for (const char* scheme : {"https://", "http://"}) {
    if (address.rfind(scheme, 0) == 0) return address.substr(std::string(scheme).size());
  }
  return address;
}

const char* code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK:
      return "OK";
    case grpc::CANCELLED:
      return "CANCELLED";
    case grpc::UNKNOWN:
      return "UNKNOWN";
    case grpc::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::ABORTED:
      return "ABORTED";
    case grpc::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::INTERNAL:
      return "INTERNAL";
    case grpc::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

void set_string(google::protobuf::Struct* s, const std::string& key, const std::string& value) {
  (*s->mutable_fields())[key].set_string_value(value);
}

}  // namespace

DeltaClient::DeltaClient(DeltaClientOptions options, state::StateStore* store)
    : options_(std::move(options)), store_(store) {
  for (const char* t : kTypes) status_.types[t];
}

DeltaClient::~DeltaClient() { stop(); }

std::string DeltaClient::node_id(const DeltaClientOptions& o) {
  return "ztunnel~" + o.instance_ip + "~" + o.pod_name + "." + o.pod_namespace + "~" +
         o.pod_namespace + ".svc.cluster.local";
}

void DeltaClient::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { run(); });
}

void DeltaClient::stop() {
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
    if (active_ != nullptr) active_->TryCancel();
  }
  cv_.notify_all();
  thread_.join();
}

bool DeltaClient::synced() const {
  std::lock_guard lock(mu_);
  return status_.synced;
}

DeltaClientStatus DeltaClient::status() const {
  std::lock_guard lock(mu_);
  return status_;
}

void DeltaClient::run() {
  pthread_setname_np(pthread_self(), "sm-xds");
  std::mt19937_64 rng(std::random_device{}());
  auto backoff = options_.initial_backoff;
  while (true) {
    bool answered = run_stream();
    std::unique_lock lock(mu_);
    if (stopping_) break;
    if (answered) backoff = options_.initial_backoff;
    // Full jitter over the upper half, so a fleet of proxies does not reconnect in step.
    auto half = backoff.count() / 2;
    std::uniform_int_distribution<long long> pick(half, std::max<long long>(half, backoff.count()));
    auto wait = std::chrono::milliseconds(pick(rng));
    SM_INFO("xds") << "reconnecting to " << options_.address << " in " << wait.count()
                   << " ms; serving the last state meanwhile";
    if (cv_.wait_for(lock, wait, [this] { return stopping_; })) break;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void DeltaClient::stream_ended(const std::string& reason, const std::string& message) {
  std::lock_guard lock(mu_);
  status_.connected = false;
  status_.last_error = message;
  ++status_.terminations[reason];
}

bool DeltaClient::run_stream() {
  std::string token;
  if (!options_.token_file.empty()) {
    if (!read_whole_file(options_.token_file, &token)) {
      std::string why = "cannot read the token file " + options_.token_file +
                        " (--xds-token-file / AUTH_TOKEN): " + std::strerror(errno);
      SM_ERROR("xds") << why;
      stream_ended("token_unreadable", why);
      return false;
    }
    token = trim(token);
  }
  std::string root_pem;
  if (!read_whole_file(options_.root_ca_file, &root_pem) || root_pem.empty()) {
    std::string why =
        "cannot read istiod's root CA " + options_.root_ca_file + " (--xds-root-ca / XDS_ROOT_CA)";
    SM_ERROR("xds") << why;
    stream_ended("root_ca_unreadable", why);
    return false;
  }

  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = root_pem;
  // Keepalive PINGs, so an istiod that vanishes without a FIN (a node gone, a partition) ends
  // the stream in about 40 s instead of leaving Read() blocked until the kernel gives up.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, options_.max_message_bytes);
  auto channel =
      grpc::CreateCustomChannel(grpc_target(options_.address), grpc::SslCredentials(ssl), args);
  auto stub = AggregatedDiscoveryService::NewStub(channel);
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.AddMetadata("clusterid", options_.cluster_id);
  {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    active_ = &ctx;
    ++status_.streams;
  }
  auto stream = stub->DeltaAggregatedResources(&ctx);

  bool ok = true;
  for (const char* type : kTypes) {
    DeltaDiscoveryRequest req;
    req.set_type_url(type);
    // Every initial request carries the Node, and no resource names (a wildcard subscription),
    // as ztunnel's do.
    {
      auto* node = req.mutable_node();
      node->set_id(node_id(options_));
      node->set_cluster(options_.cluster_id);
      auto* md = node->mutable_metadata();
      set_string(md, "NAME", options_.pod_name);
      set_string(md, "NAMESPACE", options_.pod_namespace);
      set_string(md, "INSTANCE_IPS", options_.instance_ip);
      set_string(md, "NODE_NAME", options_.node_name);
      set_string(md, "CLUSTER_ID", options_.cluster_id);
    }
    for (const auto& [name, version] : resources_.versions(type)) {
      (*req.mutable_initial_resource_versions())[name] = version;
    }
    if (!stream->Write(req)) {
      ok = false;
      break;
    }
  }

  bool answered = false;
  DeltaDiscoveryResponse resp;
  while (ok && stream->Read(&resp)) {
    if (!answered) {
      answered = true;
      std::lock_guard lock(mu_);
      status_.connected = true;
      SM_INFO("xds") << "connected to " << options_.address << " (stream " << status_.streams
                     << ")";
    }
    DeltaDiscoveryRequest reply;
    reply.set_type_url(resp.type_url());
    reply.set_response_nonce(resp.nonce());
    auto applied = resources_.apply(resp);
    if (!applied) {
      std::string why = applied.error().to_string();
      SM_ERROR("xds") << "NACK " << resp.type_url() << " nonce " << resp.nonce() << ": " << why
                      << "; keeping the previous state";
      reply.mutable_error_detail()->set_code(grpc::INVALID_ARGUMENT);
      reply.mutable_error_detail()->set_message(why);
      std::lock_guard lock(mu_);
      auto& t = status_.types[resp.type_url()];
      ++t.nacks;
      t.nacked_nonce = resp.nonce();
      t.nack_error = why;
    } else {
      bool publish = false;
      {
        std::lock_guard lock(mu_);
        auto& t = status_.types[resp.type_url()];
        t.answered = true;
        ++t.acks;
        t.acked_version = resp.system_version_info();
        t.acked_nonce = resp.nonce();
        bool all = true;
        for (const char* type : kTypes) all = all && status_.types[type].answered;
        if (all && !status_.synced) {
          SM_INFO("xds") << "first complete sync from " << options_.address;
        }
        status_.synced = all;
        publish = all;
        status_.workloads = resources_.workload_count();
        status_.services = resources_.service_count();
        status_.policies = resources_.policy_count();
      }
      SM_INFO("xds") << "ACK " << resp.type_url() << " nonce " << resp.nonce() << ": "
                     << applied->changed << " changed, " << applied->removed << " removed";
      // Outside mu_: the store's listeners re-check live connections and may take a while.
      if (publish) store_->set(resources_.snapshot());
    }
    if (!stream->Write(reply)) break;
  }
  grpc::Status st = stream->Finish();
  {
    std::lock_guard lock(mu_);
    active_ = nullptr;
    if (stopping_) return answered;
  }
  std::string reason = code_name(st.error_code());
  std::string message = reason + ": " + st.error_message();
  if (st.error_code() == grpc::UNAUTHENTICATED || st.error_code() == grpc::PERMISSION_DENIED) {
    message += " (istiod refused the token from " +
               (options_.token_file.empty() ? std::string("<none>") : options_.token_file) + ")";
  } else if (st.error_code() == grpc::RESOURCE_EXHAUSTED) {
    message += " (a response from istiod is over --xds-max-message-bytes, " +
               std::to_string(options_.max_message_bytes) +
               " bytes: the same push fails on every reconnect until the limit is raised)";
  } else if (st.error_message().find("andshake") != std::string::npos ||
             st.error_message().find("CERTIFICATE_VERIFY") != std::string::npos) {
    message += " (TLS with istiod failed: is its certificate signed by " + options_.root_ca_file +
               " and valid for the address " + options_.address + "?)";
  }
  SM_WARN("xds") << "stream to " << options_.address << " ended: " << message;
  stream_ended(reason, message);
  return answered;
}

}  // namespace sockmesh::xds
