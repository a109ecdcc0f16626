#include "xds/resources.h"

namespace sockmesh::xds {

Result<XdsResources::Applied, ConvertError> XdsResources::apply(
    const envoy::service::discovery::v3::DeltaDiscoveryResponse& r) {
  const std::string& type = r.type_url();
  bool is_address = type == kAddressType;
  if (!is_address && type != kAuthorizationType) {
    return ConvertError{"", "type_url", "unknown type '" + type + "'"};
  }
  Applied applied;
  auto addresses = addresses_;
  auto policies = policies_;
  for (int i = 0; i < r.resources_size(); ++i) {
    const auto& res = r.resources(i);
    const std::string& name = res.name();
    if (name.empty()) {
      return ConvertError{"", "resources[" + std::to_string(i) + "].name", "must not be empty"};
    }
    if (res.resource().type_url() != type) {
      return ConvertError{name, "resource.type_url",
                          "expected '" + type + "', got '" + res.resource().type_url() + "'"};
    }
    if (is_address) {
      istio::workload::Address msg;
      if (!res.resource().UnpackTo(&msg)) {
        return ConvertError{name, "resource", "not a valid istio.workload.Address message"};
      }
      auto converted = convert_address(name, msg);
      if (!converted) return converted.error();
      addresses[name] = AddressEntry{res.version(), std::move(*converted)};
    } else {
      istio::security::Authorization msg;
      if (!res.resource().UnpackTo(&msg)) {
        return ConvertError{name, "resource", "not a valid istio.security.Authorization message"};
      }
      auto converted = convert_authorization(name, msg);
      if (!converted) return converted.error();
      policies[name] = PolicyEntry{res.version(), std::move(*converted)};
    }
    ++applied.changed;
  }
  for (const auto& name : r.removed_resources()) {
    // Removing an unknown name is not an error: the server may not know what we dropped.
    applied.removed += is_address ? addresses.erase(name) : policies.erase(name);
  }
  addresses_ = std::move(addresses);
  policies_ = std::move(policies);
  return applied;
}

std::map<std::string, std::string> XdsResources::versions(const std::string& type_url) const {
  std::map<std::string, std::string> out;
  if (type_url == kAddressType) {
    for (const auto& [name, e] : addresses_) out[name] = e.version;
  } else if (type_url == kAuthorizationType) {
    for (const auto& [name, e] : policies_) out[name] = e.version;
  }
  return out;
}

state::SnapshotPtr XdsResources::snapshot() const {
  std::vector<state::Workload> workloads;
  std::vector<state::Service> services;
  std::vector<state::Policy> policies;
  for (const auto& [_, e] : addresses_) {
    if (const auto* w = std::get_if<state::Workload>(&e.value)) {
      workloads.push_back(*w);
    } else {
      services.push_back(std::get<state::Service>(e.value));
    }
  }
  for (const auto& [_, e] : policies_) {
    policies.push_back(e.value);
  }
  return std::make_shared<const state::Snapshot>(std::move(workloads), std::move(services),
                                                 std::move(policies));
}

size_t XdsResources::workload_count() const {
  size_t n = 0;
  for (const auto& [_, e] : addresses_) n += std::holds_alternative<state::Workload>(e.value);
  return n;
}

size_t XdsResources::service_count() const { return addresses_.size() - workload_count(); }

}  // namespace sockmesh::xds
