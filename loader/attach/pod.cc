#include "loader/attach/pod.h"

#include <bpf/bpf.h>
#include <linux/ip.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "base/log.h"
#include "loader/attach/netlink.h"
#include "loader/attach/netns.h"
#include "loader/attach/node.h"
#include "loader/attach/preflight.h"
#include "loader/attach/sk_lookup.h"
#include "loader/attach/tc.h"
#include "loader/maps/unique_fd.h"
#include "sockmesh/consts.h"

namespace sockmesh::loader {
namespace {

using maps::UniqueFd;
using maps::WorkloadMap;
using maps::WorkloadRecord;

FwmarkRule capture_rule(int family) {
  return FwmarkRule{family, SM_MARK_BOUNCED, SM_MARK_BOUNCED, SM_ROUTE_TABLE, SM_RULE_PRIORITY};
}

FwmarkRule app_rule(int family) {
  return FwmarkRule{family, SM_MARK_APP_ROUTE, SM_MARK_APP_ROUTE, SM_APP_ROUTE_TABLE,
                    SM_APP_RULE_PRIORITY};
}

// Only the routes out of the pod's captured device get the large MTU: tc is there to bounce the
// app's packets, and to clamp the MSS of those that leave to the device's MTU, which is then
// their path's (a route with an MTU of its own, as some CNIs set below the device's, is copied
// as it is). Routes out of other devices (a second network) are copied as they are too, so that
// the table picks the same route as the main one.
RouteTableCopy app_routes(int family, int ifindex) {
  return RouteTableCopy{family, RT_TABLE_MAIN, SM_APP_ROUTE_TABLE, ifindex, SM_APP_ROUTE_MTU};
}

Result<LocalDefaultRoute> capture_route(int family) {
  int lo = static_cast<int>(if_nametoindex("lo"));
  if (lo == 0) return Error{ENODEV, "no loopback device in the pod's netns"};
  return LocalDefaultRoute{family, SM_ROUTE_TABLE, lo};
}

Result<int> device_index(const std::string& ifname, const std::string& netns_path) {
  unsigned index = if_nametoindex(ifname.c_str());
  if (index == 0) {
    return Error{ENODEV, "no interface " + ifname + " in network namespace " + netns_path};
  }
  return static_cast<int>(index);
}

// Routing and accept_local; returns the loader flags to remember.
Result<uint32_t> set_up_routing(RouteNetlink& nl, int ifindex, std::vector<std::string>* changes) {
  uint32_t flags = 0;
  for (int family : {AF_INET, AF_INET6}) {
    auto route = capture_route(family);
    if (!route) return route.error();
    auto added_route = nl.add(*route);
    if (!added_route) return added_route.error();
    auto added_rule = nl.add(capture_rule(family));
    if (!added_rule) return added_rule.error();
    if (*added_route || *added_rule) {
      changes->push_back(family_name(family) + " policy routing for bounced packets");
    }
    // The apps' captured sockets (SM_MARK_APP_ROUTE): the pod's routes, with a lo-sized MTU.
    auto copied = nl.add(app_routes(family, ifindex));
    if (!copied) return copied.error();
    for (const auto& skipped : copied->skipped) {
      SM_WARN("loader") << family_name(family) << " route " << skipped
                        << " not copied into the apps' route table: their marked sockets to it "
                           "take the table's broader route (the default out of the captured "
                           "device, where tc captures them), or the pod's own if it has none";
    }
    auto added_app_rule = nl.add(app_rule(family));
    if (!added_app_rule) return added_app_rule.error();
    if (copied->added > 0 || *added_app_rule) {
      changes->push_back(family_name(family) + " routes for the apps' captured sockets (" +
                         std::to_string(copied->added) + " copied, " +
                         std::to_string(copied->raised) + " of them with mtu " +
                         std::to_string(SM_APP_ROUTE_MTU) + ")");
    }
  }
  // The bounced packet's source is the pod's own address: a martian unless accept_local.
  auto accept_local = nl.ipv4_devconf(ifindex, IPV4_DEVCONF_ACCEPT_LOCAL);
  if (!accept_local) return accept_local.error();
  if (*accept_local == 0) {
    if (auto s = nl.set_ipv4_devconf(ifindex, IPV4_DEVCONF_ACCEPT_LOCAL, 1); !s) return s.error();
    flags |= SM_WL_SET_ACCEPT_LOCAL;
    changes->push_back("accept_local=1");
  }
  return flags;
}

Status tear_down_routing(RouteNetlink& nl, int ifindex, uint32_t loader_flags,
                         std::vector<std::string>* changes) {
  for (int family : {AF_INET, AF_INET6}) {
    auto removed_rule = nl.remove(capture_rule(family));
    if (!removed_rule) return removed_rule.error();
    auto route = capture_route(family);
    if (!route) return route.error();
    auto removed_route = nl.remove(*route);
    if (!removed_route) return removed_route.error();
    auto removed_app_rule = nl.remove(app_rule(family));
    if (!removed_app_rule) return removed_app_rule.error();
    auto removed_app_routes = nl.flush(family, SM_APP_ROUTE_TABLE);
    if (!removed_app_routes) return removed_app_routes.error();
    if (*removed_rule || *removed_route || *removed_app_rule || *removed_app_routes > 0) {
      changes->push_back("removed " + family_name(family) + " policy routing");
    }
  }
  if ((loader_flags & SM_WL_SET_ACCEPT_LOCAL) && ifindex > 0) {
    if (auto s = nl.set_ipv4_devconf(ifindex, IPV4_DEVCONF_ACCEPT_LOCAL, 0); !s) return s;
    changes->push_back("accept_local=0 again");
  }
  return {};
}

}  // namespace

Result<EnrollReport> enroll(const std::string& pin_root, const PodSpec& pod) {
  if (auto s = require_capabilities(
          {Capability::kBpf, Capability::kNetAdmin, Capability::kSysAdmin}, "enroll");
      !s) {
    return s.error();
  }
  if (pod.ips.empty()) return Error{EINVAL, "enroll needs at least one --ip"};
  // Refuse a record that cannot be written before touching the pod.
  if (auto raw = pod.identity.to_kernel(); !raw) return raw.error();
  auto workloads = WorkloadMap::open(pin_root);
  if (!workloads) return workloads.error();
  UniqueFd ingress(bpf_obj_get(program_pin(pin_root, kProgTcIngress).c_str()));
  UniqueFd egress(bpf_obj_get(program_pin(pin_root, kProgTcEgress).c_str()));
  if (!ingress || !egress) {
    return Error{ENOENT, "the tc programs are not pinned under " + pin_root +
                             "/" SM_PIN_PROGS_DIR ": run sockmesh-loader install first"};
  }

  EnrollReport report;
  uint32_t loader_flags = 0;
  // Notes from an earlier enrollment of the same pod are kept: what it changed is still ours to
  // undo.
  for (const auto& ip : pod.ips) {
    if (auto old = workloads->lookup(ip)) loader_flags |= old->loader_flags;
  }
  {
    auto scope = NetnsScope::enter(pod.netns_path);
    if (!scope) return scope.error();
    auto ifindex = device_index(pod.ifname, pod.netns_path);
    if (!ifindex) return ifindex.error();
    report.ifindex = *ifindex;
    auto cookie = current_netns_cookie();
    if (!cookie && cookie.error().code != ENOPROTOOPT) return cookie.error();
    if (!cookie) {
      // Kernels before 5.14: records carry no cookie; unenroll then needs the IPs named.
      SM_WARN("loader") << cookie.error().message;
    }
    report.netns_cookie = cookie ? *cookie : 0;

    auto nl = RouteNetlink::open();
    if (!nl) return nl.error();
    auto routing_flags = set_up_routing(*nl, *ifindex, &report.changes);
    if (!routing_flags) return routing_flags.error();
    loader_flags |= *routing_flags;

    auto before = query_capture(*ifindex);
    auto tc = attach_capture(*ifindex, ingress.get(), egress.get());
    if (!tc) {
      return Error{tc.error().code, tc.error().message +
                                        " (routing is set up already; "
                                        "unenroll undoes it)"};
    }
    if (tc->created_clsact) loader_flags |= SM_WL_MADE_CLSACT;
    auto after = query_capture(*ifindex);
    if (!before || !after || before->ingress_id != after->ingress_id ||
        before->egress_id != after->egress_id) {
      report.changes.push_back("tc capture on " + pod.ifname);
    }
    // A reconnect that meets one of the proxy's TIME_WAIT sockets needs sk_lookup; without it
    // (no cookie to name the link by), such a SYN waits for TIME_WAIT to end.
    if (report.netns_cookie != 0) {
      auto netns = open_netns(pod.netns_path);
      if (!netns) return netns.error();
      auto lookup = attach_pod_lookup(pin_root, netns->get(), report.netns_cookie);
      if (!lookup) {
        return Error{lookup.error().code, lookup.error().message +
                                              " (routing and tc are set up already; "
                                              "unenroll undoes them)"};
      }
      if (*lookup) report.changes.push_back("sk_lookup in the pod's netns");
    }
  }

  // Last: the records switch capture on, once routing and tc are in place.
  WorkloadRecord record = pod.identity;
  record.enrolled = true;
  record.ifindex = static_cast<uint32_t>(report.ifindex);
  record.netns_cookie = report.netns_cookie;
  record.loader_flags = loader_flags;
  for (const auto& ip : pod.ips) {
    auto old = workloads->lookup(ip);
    if (old && *old == record) continue;
    if (auto s = workloads->enroll(ip, record); !s) return s.error();
    report.changes.push_back("workload record for " + ip.to_string());
  }
  for (const auto& c : report.changes) {
    SM_INFO("loader") << "enroll " << pod.netns_path << ": " << c;
  }
  return report;
}

Result<UnenrollReport> unenroll(const std::string& pin_root, const std::string& netns_path,
                                const std::string& ifname, const std::vector<IpAddress>& ips) {
  if (auto s = require_capabilities(
          {Capability::kBpf, Capability::kNetAdmin, Capability::kSysAdmin}, "unenroll");
      !s) {
    return s.error();
  }
  auto workloads = WorkloadMap::open(pin_root);
  if (!workloads) return workloads.error();
  UnenrollReport report;

  auto netns = open_netns(netns_path);
  uint64_t cookie = 0;
  int ifindex = 0;
  std::optional<NetnsScope> scope;
  if (!netns) {
    if (netns.error().code != ENOENT) return netns.error();
    report.netns_gone = true;
  } else {
    auto entered = NetnsScope::enter(netns->get(), netns_path);
    if (!entered) return entered.error();
    scope.emplace(std::move(entered).value());
    auto c = current_netns_cookie();
    if (!c && c.error().code != ENOPROTOOPT) return c.error();
    cookie = c ? *c : 0;
    auto index = device_index(ifname, netns_path);
    if (!index) return index.error();
    ifindex = *index;
  }

  // The records to remove: the IPs named, and every IP enrolled from this netns.
  std::vector<IpAddress> targets = ips;
  auto all = workloads->list();
  if (!all) return all.error();
  uint32_t loader_flags = 0;
  std::vector<uint64_t> cookies;  // the netns of the records removed (the pod's, normally one)
  if (cookie != 0) cookies.push_back(cookie);
  for (const auto& [ip, record] : *all) {
    bool named = std::find(ips.begin(), ips.end(), ip) != ips.end();
    bool same_pod = cookie != 0 && record.netns_cookie == cookie;
    if (!named && !same_pod) continue;
    loader_flags |= record.loader_flags;
    if (!named) targets.push_back(ip);
    if (record.netns_cookie != 0 &&
        std::find(cookies.begin(), cookies.end(), record.netns_cookie) == cookies.end()) {
      cookies.push_back(record.netns_cookie);
    }
  }
  // First: capture off.
  for (const auto& ip : targets) {
    auto removed = workloads->remove(ip);
    if (!removed) return removed.error();
    if (*removed) report.removed_ips.push_back(ip);
  }
  if (!report.removed_ips.empty()) {
    report.changes.push_back("removed " + std::to_string(report.removed_ips.size()) +
                             " workload records");
  }
  for (uint64_t c : cookies) {
    auto removed = detach_pod_lookup(pin_root, c);
    if (!removed) return removed.error();
    if (*removed) report.changes.push_back("removed the pod's sk_lookup link");
  }

  if (scope) {
    auto attached = query_capture(ifindex);
    bool had_filters = attached && (attached->ingress_id != 0 || attached->egress_id != 0);
    bool remove_clsact = (loader_flags & SM_WL_MADE_CLSACT) != 0;
    if (auto s = detach_capture(ifindex, remove_clsact); !s) return s.error();
    if (had_filters) {
      report.changes.push_back("detached tc capture from " + ifname +
                               (remove_clsact ? " and removed the clsact qdisc it made" : ""));
    }
    auto nl = RouteNetlink::open();
    if (!nl) return nl.error();
    if (auto s = tear_down_routing(*nl, ifindex, loader_flags, &report.changes); !s) {
      return s.error();
    }
    scope.reset();
  }
  for (const auto& c : report.changes) SM_INFO("loader") << "unenroll " << netns_path << ": " << c;
  return report;
}

}  // namespace sockmesh::loader
