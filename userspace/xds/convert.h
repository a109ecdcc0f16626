#pragma once
// istiod's xDS resources (istio.workload.Address, istio.security.Authorization) into the `state`
// model the local config file produces, so both sources feed the data plane the same structs.
//
// Conversion is strict in the way the local config parser is: a field sockmesh cannot honour
// (a waypoint, a CIDR VIP, a port out of range) is an error naming the resource and the field,
// which the client turns into a NACK, because ignoring it would change where traffic goes or who
// may connect. Fields sockmesh does not read at all are ignored, as protobuf ignores unknown ones.
#include <optional>
#include <string>
#include <variant>

#include "base/result.h"
#include "istio/security/authorization.pb.h"
#include "istio/workload/workload.pb.h"
#include "state/model.h"

namespace sockmesh::xds {

inline constexpr char kAddressType[] = "type.googleapis.com/istio.workload.Address";
inline constexpr char kAuthorizationType[] = "type.googleapis.com/istio.security.Authorization";

struct ConvertError {
  std::string resource;  // the xDS resource name
  std::string field;     // path such as "workload.addresses[1]"; empty for the whole resource
  std::string message;

  // "resource 'x': workload.addresses[1]: message"
  std::string to_string() const;
};

using Address = std::variant<state::Workload, state::Service>;

Result<Address, ConvertError> convert_address(const std::string& resource_name,
                                              const istio::workload::Address& address);

// A dry-run policy is converted like any other, with state::Policy::dry_run set.
Result<state::Policy, ConvertError> convert_authorization(
    const std::string& resource_name, const istio::security::Authorization& authorization);

// An IP from its 4 or 16 wire bytes; nullopt for any other length.
std::optional<IpAddress> ip_from_bytes(const std::string& bytes);

}  // namespace sockmesh::xds
