#include "config/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace sockmesh::config {

int read_config_file(const std::string& path, std::string* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
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

}  // namespace sockmesh::config
