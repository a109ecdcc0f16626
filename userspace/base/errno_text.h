#pragma once
// Text for errno values, one definition for the tree (strerror's buffer is shared; these are
// thread-safe).
#include <string>
#include <string_view>

namespace sockmesh {

// strerror(err), thread-safe.
std::string errno_text(int err);

// "<what>: <strerror(errno)>" for the system call that just failed.
std::string errno_text(std::string_view what);

}  // namespace sockmesh
