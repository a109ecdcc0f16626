#pragma once
// The identity module's results: the project's Result (base/result.h) with a message-only Error.
#include "base/result.h"

namespace sockmesh::identity {

using sockmesh::Error;
template <typename T, typename E = Error>
using Result = sockmesh::Result<T, E>;
using Status = Result<void>;

}  // namespace sockmesh::identity
