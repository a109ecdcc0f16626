#pragma once
// CNI errors: the spec's codes, printed as JSON on stdout ({"cniVersion", "code", "msg",
// "details"}) with a non-zero exit status.
#include <string>

namespace sockmesh::cni {

// Codes of the CNI specification (1.0.0, "Error" section); 100 and up are the plugin's own.
enum class ErrorCode : int {
  kIncompatibleVersion = 1,
  kUnsupportedField = 2,
  kUnknownContainer = 3,
  kInvalidEnvironment = 4,
  kIoFailure = 5,
  kDecodingFailure = 6,
  kInvalidNetworkConfig = 7,
  kTryAgainLater = 11,
  kEnrollmentFailed = 100,  // the node agent tried to enroll the pod and failed
};

struct CniError {
  ErrorCode code;
  std::string msg;      // what happened and what to do, one line
  std::string details;  // more context (the agent's message, the parser's position)
};

}  // namespace sockmesh::cni
