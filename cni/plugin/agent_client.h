#pragma once
// The plugin's side of the event socket (cni/event/pod_event.h): one request, one reply, within a
// deadline. Distinguishes "nobody listens" (the agent is down) from "it listens but did not answer
// in time" only in the message: both mean the agent could not decide.
#include <string>

#include "cni/event/pod_event.h"

namespace sockmesh::cni {

enum class CallStatus {
  kAnswered,     // reply holds the agent's answer
  kUnreachable,  // no socket, nobody listening, or the connection failed
  kTimedOut,     // connected, but no answer before the deadline
  kBadReply,     // an answer that is not a valid AgentReply
};

struct AgentCall {
  CallStatus status = CallStatus::kUnreachable;
  AgentReply reply;
  std::string error;  // for everything but kAnswered: what went wrong, for the operator
};

AgentCall call_agent(const std::string& socket_path, const PodEvent& event, int timeout_ms);

}  // namespace sockmesh::cni
