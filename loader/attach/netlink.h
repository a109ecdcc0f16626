#pragma once
// rtnetlink in the calling thread's network namespace (libmnl): the policy routing and the
// per-device IPv4 settings that capture needs inside a pod. No `ip` or `sysctl` processes.
#include <libmnl/libmnl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loader/maps/result.h"

namespace sockmesh::loader {

using maps::Error;
using maps::Result;
using maps::Status;

// `ip rule ... fwmark <mark>/<mask> lookup <table> pref <priority>`
struct FwmarkRule {
  int family = 0;  // AF_INET or AF_INET6
  uint32_t mark = 0;
  uint32_t mask = 0;
  uint32_t table = 0;
  uint32_t priority = 0;
};

// `ip route ... local default dev <ifindex> table <table>`
struct LocalDefaultRoute {
  int family = 0;
  uint32_t table = 0;
  int ifindex = 0;
};

// Every unicast (and blackhole, unreachable, prohibit, throw) route of table `from`, copied into
// table `to`, so that a lookup in `to` picks the same route as one in `from`; the unicast routes
// out of device `ifindex` with no MTU of their own get the MTU metric `mtu` (their other metrics
// kept): `ip route show table <from>` replayed with `table <to>`, and `mtu <mtu>` on those.
struct RouteTableCopy {
  int family = 0;
  uint32_t from = 0;
  uint32_t to = 0;
  int ifindex = 0;
  uint32_t mtu = 0;
};

struct RouteCopyReport {
  int added = 0;   // routes copied now (those already in `to` are left as they are)
  int raised = 0;  // of those, how many got `mtu`
  std::vector<std::string> skipped;  // routes left out, each with why
};

// "IPv4" or "IPv6", for messages.
std::string family_name(int family);

class RouteNetlink {
 public:
  // A NETLINK_ROUTE socket bound in the calling thread's current netns.
  static Result<RouteNetlink> open();

  // Add: fine if present (returns false then). Remove: fine if absent (returns false then).
  Result<bool> add(const FwmarkRule& rule);
  Result<bool> remove(const FwmarkRule& rule);
  Result<bool> add(const LocalDefaultRoute& route);
  Result<bool> remove(const LocalDefaultRoute& route);
  // A route the copy cannot express (a lightweight tunnel, one the kernel refuses) is left out and
  // named in the report; only failing to list the routes is an error.
  Result<RouteCopyReport> add(const RouteTableCopy& copy);
  // Removes every route of one table of one family; returns how many there were.
  Result<int> flush(int family, uint32_t table);

  // Per-device IPv4 settings (net.ipv4.conf.<dev>.<name>), by IPV4_DEVCONF_* id, through
  // RTM_GETLINK / RTM_SETLINK IFLA_AF_SPEC/AF_INET/IFLA_INET_CONF.
  Result<uint32_t> ipv4_devconf(int ifindex, int devconf_id);
  Status set_ipv4_devconf(int ifindex, int devconf_id, uint32_t value);

 private:
  struct SocketCloser {
    void operator()(mnl_socket* s) const { mnl_socket_close(s); }
  };
  explicit RouteNetlink(mnl_socket* s) : sock_(s) {}
  // Sends one request and waits for its ack (or its one reply, passed to `on_reply`; or, for a
  // dump, each of its replies, until the dump's end).
  int request(nlmsghdr* msg, mnl_cb_t on_reply, void* data);
  // The routes of one table of one family, each as the kernel sent it (RTM_NEWROUTE messages).
  Result<std::vector<std::vector<char>>> dump_routes(int family, uint32_t table);

  std::unique_ptr<mnl_socket, SocketCloser> sock_;
  uint32_t seq_ = 0;
};

}  // namespace sockmesh::loader
