#include "loader/attach/netlink.h"

#include <arpa/inet.h>
#include <linux/fib_rules.h>
#include <linux/if_link.h>
#include <linux/ip.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

namespace sockmesh::loader {

std::string family_name(int family) { return family == AF_INET6 ? "IPv6" : "IPv4"; }

namespace {

std::string describe(const FwmarkRule& r) {
  return family_name(r.family) + " rule fwmark " + std::to_string(r.mark) + "/" +
         std::to_string(r.mask) + " lookup " + std::to_string(r.table) + " pref " +
         std::to_string(r.priority);
}

std::string describe(const LocalDefaultRoute& r) {
  return family_name(r.family) + " route local default dev #" + std::to_string(r.ifindex) +
         " table " + std::to_string(r.table);
}

nlmsghdr* rule_message(char* buf, uint16_t type, uint16_t flags, const FwmarkRule& r) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = type;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
  auto* frh = static_cast<fib_rule_hdr*>(mnl_nlmsg_put_extra_header(nlh, sizeof(fib_rule_hdr)));
  frh->family = static_cast<uint8_t>(r.family);
  frh->action = FR_ACT_TO_TBL;
  frh->table = r.table < 256 ? static_cast<uint8_t>(r.table) : uint8_t{RT_TABLE_UNSPEC};
  mnl_attr_put_u32(nlh, FRA_TABLE, r.table);
  mnl_attr_put_u32(nlh, FRA_FWMARK, r.mark);
  mnl_attr_put_u32(nlh, FRA_FWMASK, r.mask);
  mnl_attr_put_u32(nlh, FRA_PRIORITY, r.priority);
  return nlh;
}

nlmsghdr* route_message(char* buf, uint16_t type, uint16_t flags, const LocalDefaultRoute& r) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = type;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
  auto* rtm = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
  rtm->rtm_family = static_cast<uint8_t>(r.family);
  rtm->rtm_dst_len = 0;
  rtm->rtm_table = r.table < 256 ? static_cast<uint8_t>(r.table) : uint8_t{RT_TABLE_UNSPEC};
  rtm->rtm_protocol = RTPROT_BOOT;
  rtm->rtm_scope = RT_SCOPE_HOST;
  rtm->rtm_type = RTN_LOCAL;
  mnl_attr_put_u32(nlh, RTA_TABLE, r.table);
  mnl_attr_put_u32(nlh, RTA_OIF, static_cast<uint32_t>(r.ifindex));
  return nlh;
}

struct DevconfQuery {
  int devconf_id = 0;
  bool found = false;
  uint32_t value = 0;
};

// Calls fn(attr) for each attribute in [begin, begin + len). (libmnl's iteration macros do not
// compile as C++.)
template <typename Fn>
void for_each_attr(const void* begin, size_t len, Fn fn) {
  const auto* attr = static_cast<const nlattr*>(begin);
  int remaining = static_cast<int>(len);
  while (mnl_attr_ok(attr, remaining)) {
    fn(attr);
    remaining -= static_cast<int>(MNL_ALIGN(attr->nla_len));
    attr = mnl_attr_next(attr);
  }
}

void for_each_nested(const nlattr* nest, auto fn) {
  for_each_attr(mnl_attr_get_payload(nest), mnl_attr_get_payload_len(nest), fn);
}

// Calls fn(attr) for each attribute of a message after its family header of `header` bytes.
void for_each_msg_attr(const nlmsghdr* nlh, size_t header, auto fn) {
  for_each_attr(mnl_nlmsg_get_payload_offset(nlh, header),
                nlh->nlmsg_len - MNL_NLMSG_HDRLEN - MNL_ALIGN(header), fn);
}

uint32_t table_of(const nlmsghdr* nlh) {
  const auto* rtm = static_cast<const rtmsg*>(mnl_nlmsg_get_payload(nlh));
  uint32_t table = rtm->rtm_table;
  for_each_msg_attr(nlh, sizeof(rtmsg), [&](const nlattr* attr) {
    if (mnl_attr_get_type(attr) == RTA_TABLE) table = mnl_attr_get_u32(attr);
  });
  return table;
}

struct RouteDump {
  uint32_t table = 0;
  std::vector<std::vector<char>> routes;
};

int on_route_reply(const nlmsghdr* nlh, void* data) {
  auto* dump = static_cast<RouteDump*>(data);
  if (nlh->nlmsg_type != RTM_NEWROUTE) return MNL_CB_OK;
  const auto* rtm = static_cast<const rtmsg*>(mnl_nlmsg_get_payload(nlh));
  switch (rtm->rtm_type) {
    case RTN_UNICAST:
    case RTN_BLACKHOLE:
    case RTN_UNREACHABLE:
    case RTN_PROHIBIT:
    case RTN_THROW:
      break;
    default:  // local, broadcast, multicast...: not in a main table, or not ours to copy
      return MNL_CB_OK;
  }
  if (rtm->rtm_flags & RTM_F_CLONED) return MNL_CB_OK;
  if (table_of(nlh) != dump->table) return MNL_CB_OK;
  const char* begin = reinterpret_cast<const char*>(nlh);
  dump->routes.emplace_back(begin, begin + nlh->nlmsg_len);
  return MNL_CB_OK;
}

// What decides how a dumped route is copied.
struct RouteFacts {
  int oif = 0;             // RTA_OIF (0 for none, such as a multipath route)
  bool has_mtu = false;    // an MTU metric of its own
  bool has_nh_id = false;  // a nexthop object (the dump may also carry its OIF and gateway)
  bool has_encap = false;  // a lightweight tunnel
};

RouteFacts facts_of(const nlmsghdr* nlh) {
  RouteFacts f;
  for_each_msg_attr(nlh, sizeof(rtmsg), [&](const nlattr* attr) {
    switch (mnl_attr_get_type(attr)) {
      case RTA_OIF:
        f.oif = static_cast<int>(mnl_attr_get_u32(attr));
        break;
      case RTA_NH_ID:
        f.has_nh_id = true;
        break;
      case RTA_ENCAP:
      case RTA_ENCAP_TYPE:
        f.has_encap = true;
        break;
      case RTA_METRICS:
        for_each_nested(attr, [&](const nlattr* m) {
          if (mnl_attr_get_type(m) == RTAX_MTU) f.has_mtu = true;
        });
        break;
      default:
        break;
    }
  });
  return f;
}

std::string route_text(const nlmsghdr* nlh) {
  const auto* rtm = static_cast<const rtmsg*>(mnl_nlmsg_get_payload(nlh));
  std::string dst = "default";
  for_each_msg_attr(nlh, sizeof(rtmsg), [&](const nlattr* attr) {
    if (mnl_attr_get_type(attr) != RTA_DST) return;
    char text[INET6_ADDRSTRLEN] = {};
    inet_ntop(rtm->rtm_family, mnl_attr_get_payload(attr), text, sizeof(text));
    dst = std::string(text) + "/" + std::to_string(rtm->rtm_dst_len);
  });
  return dst;
}

// A route message for `table` built from a dumped one: its header and the attributes that say
// where the route leads (destination, gateway, device, source, priority, nexthops); for an add,
// its metrics, with the MTU replaced when `mtu` is not 0 (a delete passes no metrics).
nlmsghdr* route_copy_message(char* buf, uint16_t type, uint16_t flags, const nlmsghdr* from,
                             const RouteFacts& facts, uint32_t table, bool metrics_too,
                             uint32_t mtu) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = type;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
  auto* rtm = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
  *rtm = *static_cast<const rtmsg*>(mnl_nlmsg_get_payload(from));
  rtm->rtm_table = table < 256 ? static_cast<uint8_t>(table) : uint8_t{RT_TABLE_UNSPEC};
  // Only ONLINK is a flag one may ask for; the others (LINKDOWN, OFFLOAD...) are the kernel's.
  rtm->rtm_flags &= RTNH_F_ONLINK;
  mnl_attr_put_u32(nlh, RTA_TABLE, table);
  const nlattr* metrics = nullptr;
  // A route through a nexthop object names only the object: the OIF and gateway a dump may also
  // carry would be refused beside it.
  for_each_msg_attr(from, sizeof(rtmsg), [&](const nlattr* attr) {
    uint16_t t = mnl_attr_get_type(attr);
    bool nexthop_detail = t == RTA_OIF || t == RTA_GATEWAY || t == RTA_VIA || t == RTA_MULTIPATH;
    if (facts.has_nh_id && nexthop_detail) return;
    switch (t) {
      case RTA_DST:
      case RTA_SRC:
      case RTA_GATEWAY:
      case RTA_OIF:
      case RTA_PREFSRC:
      case RTA_PRIORITY:
      case RTA_MULTIPATH:
      case RTA_VIA:
      case RTA_PREF:
      case RTA_NH_ID:
        mnl_attr_put(nlh, t, mnl_attr_get_payload_len(attr), mnl_attr_get_payload(attr));
        break;
      case RTA_METRICS:
        metrics = attr;
        break;
      default:
        break;
    }
  });
  if (metrics_too && (metrics != nullptr || mtu != 0)) {
    nlattr* nest = mnl_attr_nest_start(nlh, RTA_METRICS);
    if (metrics != nullptr) {
      for_each_nested(metrics, [&](const nlattr* m) {
        uint16_t t = mnl_attr_get_type(m);
        if (t == RTAX_MTU && mtu != 0) return;
        mnl_attr_put(nlh, t, mnl_attr_get_payload_len(m), mnl_attr_get_payload(m));
      });
    }
    if (mtu != 0) mnl_attr_put_u32(nlh, RTAX_MTU, mtu);
    mnl_attr_nest_end(nlh, nest);
  }
  return nlh;
}

// Walks IFLA_AF_SPEC -> AF_INET -> IFLA_INET_CONF (an array of u32, index = IPV4_DEVCONF_* - 1).
int on_link_reply(const nlmsghdr* nlh, void* data) {
  auto* q = static_cast<DevconfQuery*>(data);
  for_each_msg_attr(nlh, sizeof(ifinfomsg), [&](const nlattr* attr) {
    if (mnl_attr_get_type(attr) != IFLA_AF_SPEC) return;
    for_each_nested(attr, [&](const nlattr* af) {
      if (mnl_attr_get_type(af) != AF_INET) return;
      for_each_nested(af, [&](const nlattr* conf) {
        if (mnl_attr_get_type(conf) != IFLA_INET_CONF) return;
        size_t index = static_cast<size_t>(q->devconf_id - 1);
        if ((index + 1) * sizeof(uint32_t) <= mnl_attr_get_payload_len(conf)) {
          const auto* values = static_cast<const uint32_t*>(mnl_attr_get_payload(conf));
          q->value = values[index];
          q->found = true;
        }
      });
    });
  });
  return MNL_CB_OK;
}

}  // namespace

Result<RouteNetlink> RouteNetlink::open() {
  mnl_socket* s = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
  if (s == nullptr) return Error::from_errno(errno, "opening a NETLINK_ROUTE socket");
  RouteNetlink nl(s);
  if (mnl_socket_bind(s, 0, MNL_SOCKET_AUTOPID) < 0) {
    return Error::from_errno(errno, "binding a NETLINK_ROUTE socket");
  }
  nl.seq_ = static_cast<uint32_t>(time(nullptr));
  return nl;
}

int RouteNetlink::request(nlmsghdr* msg, mnl_cb_t on_reply, void* data) {
  msg->nlmsg_seq = ++seq_;
  if (mnl_socket_sendto(sock_.get(), msg, msg->nlmsg_len) < 0) return -errno;
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  unsigned portid = mnl_socket_get_portid(sock_.get());
  while (true) {
    ssize_t n = mnl_socket_recvfrom(sock_.get(), buf.data(), buf.size());
    if (n < 0) return -errno;
    int ret =
        mnl_cb_run(buf.data(), static_cast<size_t>(n), msg->nlmsg_seq, portid, on_reply, data);
    if (ret < 0) return -errno;  // an NLMSG_ERROR carrying an errno, or a malformed reply
    if (ret == MNL_CB_STOP) return 0;
    // MNL_CB_OK: a reply without the final ack yet (NLM_F_ACK on a GET), keep reading.
  }
}

Result<bool> RouteNetlink::add(const FwmarkRule& rule) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  int err = request(rule_message(buf.data(), RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL, rule), nullptr,
                    nullptr);
  if (err == -EEXIST) return false;
  if (err != 0) return Error::from_errno(err, "adding " + describe(rule));
  return true;
}

Result<bool> RouteNetlink::remove(const FwmarkRule& rule) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  int err = request(rule_message(buf.data(), RTM_DELRULE, 0, rule), nullptr, nullptr);
  if (err == -ENOENT) return false;
  if (err != 0) return Error::from_errno(err, "removing " + describe(rule));
  return true;
}

Result<bool> RouteNetlink::add(const LocalDefaultRoute& route) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  int err = request(route_message(buf.data(), RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, route),
                    nullptr, nullptr);
  if (err == -EEXIST) return false;
  if (err == -ENETDOWN) {
    return Error{ENETDOWN, "adding " + describe(route) + ": the loopback device is down"};
  }
  if (err != 0) return Error::from_errno(err, "adding " + describe(route));
  return true;
}

Result<bool> RouteNetlink::remove(const LocalDefaultRoute& route) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  int err = request(route_message(buf.data(), RTM_DELROUTE, 0, route), nullptr, nullptr);
  if (err == -ESRCH || err == -ENOENT) return false;
  if (err != 0) return Error::from_errno(err, "removing " + describe(route));
  return true;
}

Result<std::vector<std::vector<char>>> RouteNetlink::dump_routes(int family, uint32_t table) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf.data());
  nlh->nlmsg_type = RTM_GETROUTE;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  auto* rtm = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
  rtm->rtm_family = static_cast<uint8_t>(family);
  RouteDump dump;
  dump.table = table;
  int err = request(nlh, on_route_reply, &dump);
  if (err != 0) {
    return Error::from_errno(
        err, "listing the " + family_name(family) + " routes of table " + std::to_string(table));
  }
  return std::move(dump.routes);
}

Result<RouteCopyReport> RouteNetlink::add(const RouteTableCopy& copy) {
  auto routes = dump_routes(copy.family, copy.from);
  if (!routes) return routes.error();
  RouteCopyReport report;
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  for (const auto& route : *routes) {
    const auto* from = reinterpret_cast<const nlmsghdr*>(route.data());
    const auto* rtm = static_cast<const rtmsg*>(mnl_nlmsg_get_payload(from));
    RouteFacts f = facts_of(from);
    if (f.has_encap) {
      report.skipped.push_back(route_text(from) + " (a lightweight tunnel)");
      continue;
    }
    // Only a route whose MTU is its device's: tc clamps the wire's MSS to the device's MTU.
    bool raise = rtm->rtm_type == RTN_UNICAST && f.oif == copy.ifindex && !f.has_mtu;
    int err = request(route_copy_message(buf.data(), RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, from,
                                         f, copy.to, true, raise ? copy.mtu : 0),
                      nullptr, nullptr);
    if (err == -EEXIST) continue;
    if (err != 0) {
      // A route this copy cannot express is left out (the caller says so): a lookup in `to`
      // then takes its broader route, or goes on to the next rule when `to` has none.
      report.skipped.push_back(route_text(from) + " (" + strerror(-err) + ")");
      continue;
    }
    ++report.added;
    if (raise) ++report.raised;
  }
  return report;
}

Result<int> RouteNetlink::flush(int family, uint32_t table) {
  auto routes = dump_routes(family, table);
  if (!routes) return routes.error();
  int removed = 0;
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  for (const auto& route : *routes) {
    const auto* from = reinterpret_cast<const nlmsghdr*>(route.data());
    int err = request(
        route_copy_message(buf.data(), RTM_DELROUTE, 0, from, facts_of(from), table, false, 0),
        nullptr, nullptr);
    if (err == -ESRCH || err == -ENOENT) continue;
    if (err != 0) {
      return Error::from_errno(
          err, "removing the " + family_name(family) + " routes of table " + std::to_string(table));
    }
    ++removed;
  }
  return removed;
}

Result<uint32_t> RouteNetlink::ipv4_devconf(int ifindex, int devconf_id) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf.data());
  nlh->nlmsg_type = RTM_GETLINK;
  nlh->nlmsg_flags = NLM_F_REQUEST;
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  ifm->ifi_index = ifindex;
  DevconfQuery q;
  q.devconf_id = devconf_id;
  // Without NLM_F_ACK the single reply ends the exchange; mnl_cb_run returns MNL_CB_OK for it.
  nlh->nlmsg_seq = ++seq_;
  if (mnl_socket_sendto(sock_.get(), nlh, nlh->nlmsg_len) < 0) {
    return Error::from_errno(errno, "asking for link #" + std::to_string(ifindex));
  }
  ssize_t n = mnl_socket_recvfrom(sock_.get(), buf.data(), buf.size());
  if (n < 0) return Error::from_errno(errno, "reading link #" + std::to_string(ifindex));
  if (mnl_cb_run(buf.data(), static_cast<size_t>(n), nlh->nlmsg_seq,
                 mnl_socket_get_portid(sock_.get()), on_link_reply, &q) < 0) {
    int err = errno;
    if (err == ENODEV) return Error{err, "no link #" + std::to_string(ifindex)};
    return Error::from_errno(err, "reading link #" + std::to_string(ifindex));
  }
  if (!q.found) {
    return Error{ENOENT, "link #" + std::to_string(ifindex) + " reports no IPv4 setting " +
                             std::to_string(devconf_id)};
  }
  return q.value;
}

Status RouteNetlink::set_ipv4_devconf(int ifindex, int devconf_id, uint32_t value) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf.data());
  nlh->nlmsg_type = RTM_SETLINK;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  ifm->ifi_index = ifindex;
  nlattr* spec = mnl_attr_nest_start(nlh, IFLA_AF_SPEC);
  nlattr* inet = mnl_attr_nest_start(nlh, AF_INET);
  nlattr* conf = mnl_attr_nest_start(nlh, IFLA_INET_CONF);
  mnl_attr_put_u32(nlh, static_cast<uint16_t>(devconf_id), value);
  mnl_attr_nest_end(nlh, conf);
  mnl_attr_nest_end(nlh, inet);
  mnl_attr_nest_end(nlh, spec);
  int err = request(nlh, nullptr, nullptr);
  if (err != 0) {
    return Error::from_errno(err, "setting IPv4 setting " + std::to_string(devconf_id) +
                                      " of link #" + std::to_string(ifindex));
  }
  return {};
}

}  // namespace sockmesh::loader
