#pragma once
// The sk_lookup program in an enrolled pod's network namespace (bpf/lookup.bpf.c; one instance and
// one BPF link per netns, the link pinned under <pin root>/links/sk_lookup_<netns cookie>): it
// hands a SYN that reuses the tuple of a TIME_WAIT socket to the proxy's listener. The link lives
// as long as its pin; a netns that goes away takes the attachment with it, and unenroll removes
// the pin.
#include <cstdint>
#include <string>

#include "loader/maps/result.h"

namespace sockmesh::loader {

using maps::Error;
using maps::Result;
using maps::Status;

// Loads an instance for the netns `netns_fd` (whose cookie is `cookie`) and attaches it, or moves
// that netns's existing link to it when the program changed. True when something changed.
Result<bool> attach_pod_lookup(const std::string& pin_root, int netns_fd, uint64_t cookie);

// Removes the link of the netns with `cookie` (none is fine). True when one was removed.
Result<bool> detach_pod_lookup(const std::string& pin_root, uint64_t cookie);

// Removes every pod's link under the pin root (uninstall).
Status remove_pod_lookup_links(const std::string& pin_root);

}  // namespace sockmesh::loader
