#pragma once
// Reads ztunnel's local configuration file (its LocalConfig YAML: `workloads`, `services`,
// `policies`) into a state::Snapshot, plus one sockmesh extension, `namespaces`, which supplies
// namespace labels where no API server does.
//
// The parser is strict: a mistyped field name or value is reported rather than ignored, because a
// silently dropped policy field changes who may connect to what. Every error names the file, the
// 1-based line and column, and the field path (e.g. `workloads[1].workloadIps[0]`).
#include <string>
#include <string_view>
#include <variant>

#include "state/snapshot.h"

namespace sockmesh::config {

struct ConfigError {
  std::string file;
  int line = 0;       // 1-based; 0 when the error is not about a position (e.g. unreadable file)
  int column = 0;     // 1-based; 0 when unknown
  std::string field;  // path such as "workloads[1].workloadIps[0]"; empty for the whole file
  std::string message;

  // "file:line:column: field: message", leaving out the parts that are unknown.
  std::string to_string() const;
};

using ParseResult = std::variant<state::SnapshotPtr, ConfigError>;

// `file_name` is only used in errors. An empty document gives an empty snapshot.
ParseResult parse_local_config(std::string_view text, std::string_view file_name);

// Reads and parses a file; unreadable, missing or oversized files are reported as ConfigError.
ParseResult load_local_config_file(const std::string& path);

// A two-node demo on loopback (nodes "node-a" and "node-b"), used when no file is given.
const char* embedded_default_config();

// Convenience accessors for ParseResult.
inline const ConfigError* error_of(const ParseResult& r) { return std::get_if<ConfigError>(&r); }
inline state::SnapshotPtr snapshot_of(const ParseResult& r) {
  const auto* s = std::get_if<state::SnapshotPtr>(&r);
  return s == nullptr ? nullptr : *s;
}

}  // namespace sockmesh::config
