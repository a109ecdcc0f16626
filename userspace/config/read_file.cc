#include "config/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sockmesh::config {

int read_config_file(const std::string& path, std::string* out) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever; it is
  // refused below as not a regular file (and a regular file ignores the flag).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return errno;
  struct stat st {};
  int err = 0;
  if (::fstat(fd, &st) != 0) {
    err = errno;
  } else if (S_ISDIR(st.st_mode)) {
    err = EISDIR;
  } else if (!S_ISREG(st.st_mode)) {
    // A FIFO or device could block the watcher thread forever.
    err = EINVAL;
  } else if (static_cast<size_t>(st.st_size) > kMaxConfigFileBytes) {
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
      if (out->size() + static_cast<size_t>(n) > kMaxConfigFileBytes) {
        err = EFBIG;
        break;
      }
      out->append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return err;
}

std::string read_config_error_text(int err) {
  if (err == EFBIG) return "larger than " + std::to_string(kMaxConfigFileBytes) + " bytes";
  if (err == EINVAL) return "not a regular file (a FIFO, device or socket); refused";
  return std::strerror(err);
}

}  // namespace sockmesh::config
