#pragma once
// Small files the agent owns (its pod records, the plugin's namespace hints): replaced whole with
// a temporary file and rename(2), so that a reader never sees half a file.
#include <sys/types.h>
#include <string>

#include "loader/maps/result.h"

namespace sockmesh::agent {

// mkdir -p with mode 0755.
maps::Status make_dirs(const std::string& dir);

// Creates the parent directory (0755) if needed, writes `path`.tmp.<pid>, fsyncs, renames.
maps::Status write_file_atomic(const std::string& path, const std::string& content,
                               mode_t mode = 0644);
// ENOENT is an error with code ENOENT, so that callers can tell "no file yet".
maps::Result<std::string> read_file(const std::string& path);

}  // namespace sockmesh::agent
