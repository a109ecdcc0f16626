#include "proxy/forwarded.h"

namespace sockmesh::proxy {

std::string forwarded_for(const h2::Request& req) {
  const std::string* f = req.header("forwarded");
  if (f == nullptr) return {};
  auto pos = f->find("for=");
  if (pos == std::string::npos) return {};
  std::string v = f->substr(pos + 4);
  auto end = v.find_first_of(";,");
  if (end != std::string::npos) v.resize(end);
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  return v;
}

}  // namespace sockmesh::proxy
