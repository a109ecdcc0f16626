#include "base/atomic_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "base/errno_text.h"

namespace sockmesh {

std::string random_name_suffix() {
  unsigned char r[8] = {};
  if (getrandom(r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r)) {
    // No entropy yet (early boot): the clock still makes the name hard to guess ahead of time.
    uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::memcpy(r, &t, sizeof r);
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : r) {
    s.push_back(kDigits[c >> 4]);
    s.push_back(kDigits[c & 0xf]);
  }
  return s;
}

std::string temporary_name_for(const std::string& path) {
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "/." + base + ".tmp." + std::to_string(getpid()) + "." + random_name_suffix();
}

Result<void, FileError> write_file_atomic(const std::string& path, std::string_view content,
                                          mode_t mode) {
  const std::string tmp = temporary_name_for(path);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    int err = errno;
    return FileError{err, "creating " + tmp + ": " + errno_text(err)};
  }
  auto fail = [&](int err, const std::string& what) {
    close(fd);
    unlink(tmp.c_str());
    return FileError{err, what + ": " + errno_text(err)};
  };
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(errno, "writing " + tmp);
    done += static_cast<size_t>(n);
  }
  if (fchmod(fd, mode) != 0 || fsync(fd) != 0) return fail(errno, "finishing " + tmp);
  if (close(fd) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return FileError{err, "finishing " + tmp + ": " + errno_text(err)};
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return FileError{err, "renaming " + tmp + " to " + path + ": " + errno_text(err)};
  }
  return {};
}

}  // namespace sockmesh
