#pragma once
// The datapath's counters (enum sm_counter), summed over CPUs, with names for metrics and logs.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "loader/maps/pinned_map.h"
#include "loader/maps/result.h"
#include "sockmesh/consts.h"
#include "sockmesh/maps.h"

namespace sockmesh::maps {

using CounterValues = std::array<uint64_t, SM_CNT_COUNT>;

// "captured_outbound", "bypass_misses", ...: a metric-friendly name for each counter.
std::string_view counter_name(sm_counter counter);
// One line of help text for each counter.
std::string_view counter_help(sm_counter counter);

class CounterReader {
 public:
  static Result<CounterReader> open(const std::string& pin_root = SM_PIN_ROOT_DEFAULT);
  // Current totals over all CPUs.
  Result<CounterValues> read() const;

 private:
  CounterReader(PinnedMap map, int cpus) : map_(std::move(map)), cpus_(cpus) {}
  PinnedMap map_;
  int cpus_;
};

}  // namespace sockmesh::maps
