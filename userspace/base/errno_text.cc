#include "base/errno_text.h"

#include <cerrno>
#include <cstring>

namespace sockmesh {

std::string errno_text(int err) {
  char buf[128];
  // GNU strerror_r returns the message pointer (which may or may not be buf).
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return msg;
}

std::string errno_text(std::string_view what) {
  int err = errno;
  return std::string(what) + ": " + errno_text(err);
}

}  // namespace sockmesh
