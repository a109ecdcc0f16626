#pragma once
// Small files the agent owns (its pod records, the plugin's namespace hints): replaced whole with
// a temporary file and rename(2), so that a reader never sees half a file.
#include <sys/types.h>
#include <string>
#include <vector>

#include "loader/maps/result.h"

namespace sockmesh::agent {

// mkdir -p with mode 0755.
maps::Status make_dirs(const std::string& dir);

// Creates the parent directory (0755) if needed, writes `path`.tmp.<pid>, fsyncs, renames.
maps::Status write_file_atomic(const std::string& path, const std::string& content,
                               mode_t mode = 0644);
// Removes the temporary files of write_file_atomic(path) (`path`.tmp.*) that a writer killed
// mid-write left behind; only for the owner of path, when no write of its own is under way.
// Returns the names removed; a file that cannot be removed is left and not returned.
std::vector<std::string> remove_stale_temp_files(const std::string& path);
// ENOENT is an error with code ENOENT, so that callers can tell "no file yet".
maps::Result<std::string> read_file(const std::string& path);

}  // namespace sockmesh::agent
