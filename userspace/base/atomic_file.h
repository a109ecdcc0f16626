#pragma once
// Writing a file so that a reader sees the old content or the new, never a part, and so that
// nobody else's file is written through a link planted beside it: the content goes to a fresh
// temporary name in the same directory (random, created with O_CREAT|O_EXCL|O_NOFOLLOW), is
// fsync'ed, then rename()d over the target. Used by the node agent and the CNI installer.
#include <sys/types.h>

#include <string>
#include <string_view>

#include "base/result.h"

namespace sockmesh {

struct FileError {
  int code = 0;  // errno
  std::string message;
};

// 16 hex digits from getrandom (the clock when the pool is not ready yet: O_EXCL keeps the
// create safe regardless).
std::string random_name_suffix();

// The temporary name for `path`: "<dir>/.<base>.tmp.<pid>.<random>" (hidden, and not ending in
// the target's suffix, so that a directory scanner such as a CNI runtime's skips it).
std::string temporary_name_for(const std::string& path);

// The directory must exist. The file gets `mode` (fchmod: the umask does not narrow it).
Result<void, FileError> write_file_atomic(const std::string& path, std::string_view content,
                                          mode_t mode);

}  // namespace sockmesh
