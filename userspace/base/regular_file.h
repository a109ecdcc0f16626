#pragma once
// Reading a file whole that must be a regular file: opened non-blocking (opening a FIFO for
// reading would otherwise wait for a writer, forever) and refused at once when it is a FIFO,
// device, socket or directory. Header-only: the static CNI plugin, which links nothing of
// userspace/, uses it too.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>

namespace sockmesh {

inline constexpr size_t kNoFileSizeLimit = std::numeric_limits<size_t>::max();

// Returns 0 and fills `out`, or an errno value: EINVAL when not a regular file, EISDIR for a
// directory, EFBIG when larger than `max_bytes`, else what open/fstat/read said.
inline int read_regular_file(const std::string& path, size_t max_bytes, std::string* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return errno;
  struct stat st {};
  int err = 0;
  if (::fstat(fd, &st) != 0) {
    err = errno;
  } else if (S_ISDIR(st.st_mode)) {
    err = EISDIR;
  } else if (!S_ISREG(st.st_mode)) {
    err = EINVAL;
  } else if (static_cast<size_t>(st.st_size) > max_bytes) {
    err = EFBIG;
  }
  if (err == 0) {
    out->clear();
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        err = errno;
        break;
      }
      if (n == 0) break;
      // The size can grow between fstat and read (a writer appending).
      if (static_cast<size_t>(n) > max_bytes - out->size()) {
        err = EFBIG;
        break;
      }
      out->append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return err;
}

// What read_regular_file's error means, for an operator.
inline std::string regular_file_error_text(int err, size_t max_bytes = kNoFileSizeLimit) {
  if (err == EFBIG) return "larger than " + std::to_string(max_bytes) + " bytes";
  if (err == EINVAL) return "not a regular file (a FIFO, device or socket); refused";
  char buf[128];
  return strerror_r(err, buf, sizeof buf);  // GNU: the message, in buf or not
}

}  // namespace sockmesh
