#include "loader/maps/workload_map.h"

#include <linux/bpf.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "base/log.h"

namespace sockmesh::maps {
namespace {

constexpr MapShape kWorkloadShape{BPF_MAP_TYPE_HASH, sizeof(sm_ip), sizeof(sm_workload)};
constexpr uint32_t kPolicyFlags = SM_WL_ENROLLED | SM_WL_CAPTURE_INBOUND | SM_WL_CAPTURE_DNS;

template <size_t N>
Status copy_field(char (&out)[N], const std::string& value, const char* field) {
  if (value.size() >= N) {
    return Error{EINVAL, std::string("workload ") + field + " \"" + value + "\" is " +
                             std::to_string(value.size()) + " bytes; at most " +
                             std::to_string(N - 1) + " fit"};
  }
  if (value.find('\0') != std::string::npos) {
    return Error{EINVAL, std::string("workload ") + field + " holds a NUL byte"};
  }
  std::memset(out, 0, N);
  std::memcpy(out, value.data(), value.size());
  return {};
}

template <size_t N>
std::string read_field(const char (&in)[N]) {
  return std::string(in, strnlen(in, N));
}

}  // namespace

std::string WorkloadRecord::spiffe_id() const {
  return "spiffe://" + trust_domain + "/ns/" + namespace_name + "/sa/" + service_account;
}

Result<sm_workload> WorkloadRecord::to_kernel() const {
  sm_workload raw{};
  if (auto s = copy_field(raw.uid, uid, "uid"); !s) return s.error();
  if (auto s = copy_field(raw.namespace_name, namespace_name, "namespace"); !s) return s.error();
  if (auto s = copy_field(raw.service_account, service_account, "service account"); !s) {
    return s.error();
  }
  if (auto s = copy_field(raw.trust_domain, trust_domain, "trust domain"); !s) return s.error();
  raw.flags = loader_flags & ~kPolicyFlags;
  if (enrolled) raw.flags |= SM_WL_ENROLLED;
  if (capture_inbound) raw.flags |= SM_WL_CAPTURE_INBOUND;
  if (capture_dns) raw.flags |= SM_WL_CAPTURE_DNS;
  raw.ifindex = ifindex;
  raw.netns_cookie = netns_cookie;
  return raw;
}

WorkloadRecord WorkloadRecord::from_kernel(const sm_workload& raw) {
  WorkloadRecord r;
  r.uid = read_field(raw.uid);
  r.namespace_name = read_field(raw.namespace_name);
  r.service_account = read_field(raw.service_account);
  r.trust_domain = read_field(raw.trust_domain);
  r.enrolled = (raw.flags & SM_WL_ENROLLED) != 0;
  r.capture_inbound = (raw.flags & SM_WL_CAPTURE_INBOUND) != 0;
  r.capture_dns = (raw.flags & SM_WL_CAPTURE_DNS) != 0;
  r.loader_flags = raw.flags & ~kPolicyFlags;
  r.ifindex = raw.ifindex;
  r.netns_cookie = raw.netns_cookie;
  return r;
}

sm_ip to_kernel(const IpAddress& ip) {
  sm_ip raw{};
  std::memcpy(raw.addr, ip.bytes16().data(), sizeof(raw.addr));
  return raw;
}

IpAddress from_kernel(const sm_ip& ip) {
  std::array<uint8_t, 16> bytes{};
  std::memcpy(bytes.data(), ip.addr, bytes.size());
  return IpAddress::from_bytes16(bytes);
}

Result<WorkloadMapReader> WorkloadMapReader::open(const std::string& pin_root) {
  auto map = PinnedMap::open(pin_root, SM_MAP_WORKLOADS, Access::kReadOnly, kWorkloadShape);
  if (!map) return map.error();
  return WorkloadMapReader(std::move(map).value());
}

std::optional<WorkloadRecord> WorkloadMapReader::lookup(const IpAddress& ip) const {
  sm_ip key = to_kernel(ip);
  sm_workload raw{};
  int err = map_.lookup(&key, &raw);
  if (err == 0) return WorkloadRecord::from_kernel(raw);
  if (err != -ENOENT) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      SM_WARN("maps") << "workload map lookup failed, treating as absent: map=" << map_.path()
                      << " ip=" << ip.to_string() << " error=" << std::strerror(-err);
    }
  }
  return std::nullopt;
}

Result<std::vector<std::pair<IpAddress, WorkloadRecord>>> WorkloadMapReader::list() const {
  std::vector<std::pair<IpAddress, WorkloadRecord>> out;
  auto keys = map_.keys<sm_ip>();
  if (!keys) return keys.error();
  for (const auto& k : *keys) {
    sm_workload raw{};
    if (map_.lookup(&k, &raw) == 0) out.emplace_back(from_kernel(k), WorkloadRecord::from_kernel(raw));
  }
  return out;
}

Result<WorkloadMap> WorkloadMap::open(const std::string& pin_root) {
  auto map = PinnedMap::open(pin_root, SM_MAP_WORKLOADS, Access::kReadWrite, kWorkloadShape);
  if (!map) return map.error();
  return WorkloadMap(std::move(map).value());
}

Status WorkloadMap::enroll(const IpAddress& ip, const WorkloadRecord& record) {
  auto raw = record.to_kernel();
  if (!raw) return raw.error();
  sm_ip key = to_kernel(ip);
  int err = map_.update(&key, &raw.value(), BPF_ANY);
  if (err == -E2BIG || err == -ENOMEM) {
    return Error::from_errno(-err, "workload map " + map_.path() + " is full (" +
                                       std::to_string(map_.max_entries()) + " entries)");
  }
  if (err != 0) return Error::from_errno(-err, "writing " + ip.to_string() + " to " + map_.path());
  return {};
}

Result<bool> WorkloadMap::remove(const IpAddress& ip) {
  sm_ip key = to_kernel(ip);
  int err = map_.remove(&key);
  if (err == -ENOENT) return false;
  if (err != 0)
    return Error::from_errno(-err, "removing " + ip.to_string() + " from " + map_.path());
  return true;
}

}  // namespace sockmesh::maps
