#pragma once
// sockmesh-cni's commands, as a function of the environment and stdin, so that tests can run it in
// process as well as through the binary.
//
// What the runtime gets:
//   ADD    the previous result, unchanged, once the node agent enrolled the pod or decided that
//          it is not to be enrolled. Error 11 (try again later) when the agent cannot be asked and
//          the pod may belong to the mesh; error 100 when the agent failed to enroll it.
//   CHECK  nothing on success; the same errors as ADD (the agent re-enrolls a pod that lost it).
//   DEL    nothing, always (whatever the agent's state), once the agent was told or could not be.
//   VERSION the versions this plugin speaks.
// Input errors: 4 (a CNI_* variable missing or CNI_COMMAND unknown), 6 (stdin is not the JSON
// expected), 1 (a cniVersion this plugin does not speak, or CHECK before 0.4.0), 7 (not chained
// after a network plugin, or a bad setting).
//
// Without the agent (down, starting, not answering in time) the plugin decides alone, and only in
// the direction that cannot harm the pod: it lets the pod start outside the mesh when its
// namespace is in `exclude_namespaces`, or when the agent's last published hints list the
// namespace as known and not ambient; every other pod fails ADD with code 11 so that the runtime
// retries until the agent is back. (A pod that opts in by its own label in a namespace that is not
// ambient starts outside the mesh in that window; the agent enrolls it when it is back.)
#include <optional>
#include <string>
#include <string_view>

#include "cni/event/pod_event.h"

#include "cni/plugin/netconf.h"

namespace sockmesh::cni {

struct PluginOutput {
  int exit_code = 0;
  std::string stdout_text;
  std::string stderr_text;  // diagnostics for the runtime's log
};

PluginOutput run_plugin(const CniEnv& env, std::string_view stdin_text);

// The namespace hints the agent last published (used when the agent cannot be asked); nullopt
// and *error when the file is missing, unreadable, not a regular file (a FIFO is refused at once,
// not waited on) or not valid hints.
std::optional<NamespaceHints> read_namespace_hints(const std::string& path, std::string* error);

}  // namespace sockmesh::cni
