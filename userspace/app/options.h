#pragma once
// Command-line flags of sockmesh-proxy. Every flag also reads an environment variable
// (SOCKMESH_<FLAG> in upper case with '_' for '-'), flags winning, so that a DaemonSet can set
// them either way.
#include <optional>
#include <string>
#include <vector>

#include "proxy/proxy_config.h"

namespace sockmesh::app {

struct Options {
  proxy::ProxyConfig proxy;
  std::string log_level = "info";
  bool help = false;
  bool print_default_config = false;
};

// Parses argv (without argv[0]). Returns an error message naming the flag on bad input.
std::optional<std::string> parse_options(const std::vector<std::string>& args, Options* out);
std::string usage();

}  // namespace sockmesh::app
