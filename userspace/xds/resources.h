#pragma once
// The resources the xDS client holds, by type and name, and the state::Snapshot they make.
//
// A Delta response is applied all or nothing: every added or changed resource is converted into a
// copy of the current set, removals are applied to the copy, and only when nothing failed does
// the copy replace the set. A NACKed response therefore changes nothing.
#include <map>
#include <optional>
#include <string>

#include "envoy/service/discovery/v3/discovery.pb.h"
#include "state/snapshot.h"
#include "xds/convert.h"

namespace sockmesh::xds {

class XdsResources {
 public:
  struct Applied {
    size_t changed = 0;
    size_t removed = 0;
  };

  // Applies one response of either known type. On error the set is unchanged.
  Result<Applied, ConvertError> apply(
      const envoy::service::discovery::v3::DeltaDiscoveryResponse& r);

  // name -> version of every resource of `type_url` held, for initial_resource_versions.
  std::map<std::string, std::string> versions(const std::string& type_url) const;

  state::SnapshotPtr snapshot() const;

  size_t workload_count() const;
  size_t service_count() const;
  size_t policy_count() const { return policies_.size(); }

 private:
  struct AddressEntry {
    std::string version;
    Address value;
  };
  struct PolicyEntry {
    std::string version;
    state::Policy value;
  };
  std::map<std::string, AddressEntry> addresses_;
  std::map<std::string, PolicyEntry> policies_;
};

}  // namespace sockmesh::xds
