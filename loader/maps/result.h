#pragma once
// Errors as values for the loader and the map API. Failures here are ordinary (a pod's netns
// vanished, the maps are not pinned yet, a capability is missing), so they are returned with a
// message that names what is missing, and the errno the kernel gave when there was one.
#include <string>

#include "base/result.h"

namespace sockmesh::maps {

struct Error {
  int code = 0;  // errno from the kernel, 0 when the failure was not a system call's
  std::string message;

  // "<what>: <strerror(code)>" with code = errno, for a failed system call.
  static Error from_errno(int code, const std::string& what);
};

template <typename T>
using Result = sockmesh::Result<T, Error>;
// Success without a value.
using Status = sockmesh::Result<void, Error>;

}  // namespace sockmesh::maps
