#include "loader/agent/pod_record.h"

#include <cerrno>

#include <nlohmann/json.hpp>

#include "loader/agent/files.h"

namespace sockmesh::agent {
namespace {

using Json = nlohmann::json;
using maps::Error;

const char* origin_name(PodOrigin o) {
  switch (o) {
    case PodOrigin::kCni:
      return "cni";
    case PodOrigin::kDiscovered:
      return "discovered";
    case PodOrigin::kAdopted:
      return "adopted";
  }
  return "cni";
}

PodOrigin origin_of(const std::string& s) {
  if (s == "discovered") return PodOrigin::kDiscovered;
  if (s == "adopted") return PodOrigin::kAdopted;
  return PodOrigin::kCni;
}

}  // namespace

PodWorkload PodRecord::workload() const {
  return PodWorkload{uid, name, namespace_name, service_account, ips, netns_path};
}

maps::Result<PodRecords> load_pod_records(const std::string& path) {
  auto text = read_file(path);
  if (!text) {
    if (text.error().code == ENOENT) return PodRecords{};
    return text.error();
  }
  PodRecords out;
  try {
    Json j = Json::parse(*text);
    if (j.at("version").get<int>() != 1) {
      return Error{EINVAL, path + ": unknown version " + j.at("version").dump()};
    }
    for (const auto& p : j.at("pods")) {
      PodRecord r;
      r.uid = p.at("uid").get<std::string>();
      r.name = p.at("name").get<std::string>();
      r.namespace_name = p.at("namespace").get<std::string>();
      r.service_account = p.value("serviceAccount", "default");
      r.container_id = p.value("containerId", "");
      r.netns_path = p.value("netns", "");
      r.ifname = p.value("ifname", "eth0");
      r.enrolled = p.value("enrolled", false);
      r.capture_dns = p.value("captureDns", true);
      r.metadata_pending = p.value("metadataPending", false);
      r.origin = origin_of(p.value("origin", "cni"));
      for (const auto& ip : p.value("ips", std::vector<std::string>{})) {
        auto parsed = IpAddress::parse(ip);
        if (!parsed) return Error{EINVAL, path + ": pod " + r.uid + ": bad IP " += ip};
        r.ips.push_back(*parsed);
      }
      out[r.uid] = std::move(r);
    }
  } catch (const Json::exception& e) {
    return Error{EINVAL, path + ": " + e.what()};
  }
  return out;
}

maps::Status save_pod_records(const std::string& path, const PodRecords& pods) {
  Json list = Json::array();
  for (const auto& [uid, r] : pods) {
    std::vector<std::string> ips;
    for (const auto& ip : r.ips) ips.push_back(ip.to_string());
    list.push_back({{"uid", r.uid},
                    {"name", r.name},
                    {"namespace", r.namespace_name},
                    {"serviceAccount", r.service_account},
                    {"containerId", r.container_id},
                    {"netns", r.netns_path},
                    {"ifname", r.ifname},
                    {"ips", ips},
                    {"enrolled", r.enrolled},
                    {"captureDns", r.capture_dns},
                    {"metadataPending", r.metadata_pending},
                    {"origin", origin_name(r.origin)}});
  }
  Json j = {{"version", 1}, {"pods", list}};
  return write_file_atomic(path, j.dump(2) + "\n", 0600);
}

}  // namespace sockmesh::agent
