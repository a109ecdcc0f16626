#include "loader/maps/counters.h"

#include <bpf/libbpf.h>
#include <linux/bpf.h>

#include <vector>

namespace sockmesh::maps {
namespace {

struct CounterInfo {
  std::string_view name;
  std::string_view help;
};

// Indexed by enum sm_counter; the static_assert below keeps the two in step.
constexpr CounterInfo kCounters[] = {
    {"captured_outbound", "outbound SYNs assigned to the proxy's 15001 listener"},
    {"captured_inbound", "inbound SYNs assigned to the proxy's 15006 listener"},
    {"bounced", "packets tc egress bounced into ingress"},
    {"passed", "packets tc let through untouched"},
    {"not_enrolled", "packets tc saw for an IP that is not enrolled"},
    {"proxy_skipped", "packets skipped by tc for carrying the proxy's mark"},
    {"no_listener", "SYNs to capture while the proxy's listener was missing"},
    {"assign_failed", "SYNs the kernel refused to assign to a listener"},
    {"tc_payload",
     "TCP packets with payload bounced by tc (zero when the local route or the bypass works)"},
    {"bypass_sends", "sends redirected to the local peer by sk_msg"},
    {"bypass_misses", "sends whose peer was not in the SOCKHASH (went via the stack)"},
    {"bypass_pinned", "sends kept on the stack path after an earlier miss"},
    {"sockops_inserted", "sockets added to a bypass SOCKHASH (sm_bypass, sm_bypass_proxy)"},
    {"sockops_insert_failed", "sockets the kernel refused to add to a bypass SOCKHASH"},
    {"node_exempt", "inbound SYNs from the node's own addresses (kubelet probes), not captured"},
    {"bypass_refused",
     "sockets not paired for the bypass: their peer was not proven (stale note, "
     "other netns, or a local app's address without a note)"},
    {"proxy_stack_sends",
     "the proxy's sends on a socket in sm_bypass (an older proxy's, or put "
     "there by an older sockops), kept on the stack"},
    {"bypass_notes_expired", "pairing notes removed because their socket closed unpaired"},
    {"time_wait_syn", "SYNs to capture whose tuple a TIME_WAIT socket held (handed to it)"},
    {"time_wait_reused", "SYNs that reused a TIME_WAIT tuple, given to the proxy's listener"},
    {"captured_dns", "DNS queries to port 53 (UDP datagrams, TCP SYNs) given to the proxy's 15053"},
    {"mss_raised", "bounced SYNs and SYN-ACKs whose MSS option was raised to the local hop's"},
    {"app_routed", "enrolled apps' sockets (connecting or accepted) given the lo-sized route"},
    {"mss_clamped", "SYNs and SYN-ACKs to or from the wire whose MSS was lowered to eth0's MTU"},
    {"unparsed", "packets tc could not parse (not IP, or headers out of reach), let through"},
    {"unknown_flow", "later TCP packets of an enrolled pod with no local socket, to the wire"},
    {"local_routed", "enrolled apps' sockets to the proxy in their pod routed over lo, past tc"},
};
static_assert(std::size(kCounters) == SM_CNT_COUNT, "name every enum sm_counter value");

constexpr MapShape kCounterShape{BPF_MAP_TYPE_PERCPU_ARRAY, sizeof(uint32_t), sizeof(uint64_t)};

}  // namespace

std::string_view counter_name(sm_counter counter) {
  return counter < SM_CNT_COUNT ? kCounters[counter].name : "unknown";
}

std::string_view counter_help(sm_counter counter) {
  return counter < SM_CNT_COUNT ? kCounters[counter].help : "";
}

Result<CounterReader> CounterReader::open(const std::string& pin_root) {
  auto map = PinnedMap::open(pin_root, SM_MAP_COUNTERS, Access::kReadOnly, kCounterShape);
  if (!map) return map.error();
  int cpus = libbpf_num_possible_cpus();
  if (cpus <= 0) return Error::from_errno(-cpus, "counting possible CPUs");
  return CounterReader(std::move(map).value(), cpus);
}

Result<CounterValues> CounterReader::read() const {
  CounterValues totals{};
  std::vector<uint64_t> per_cpu(static_cast<size_t>(cpus_));
  for (uint32_t i = 0; i < SM_CNT_COUNT; ++i) {
    int err = map_.lookup(&i, per_cpu.data());
    if (err != 0) return Error::from_errno(-err, "reading " + map_.path());
    for (uint64_t v : per_cpu) totals[i] += v;
  }
  return totals;
}

}  // namespace sockmesh::maps
