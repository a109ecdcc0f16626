#pragma once
// Pinned maps across an upgrade whose maps changed size or flags. libbpf reuses a pinned map only
// when its type, key and value sizes, max_entries and flags all match the object's definition;
// otherwise the load fails, and a node agent of the new version could not start on a node whose
// pins an older one made. MapUpgrade moves such a pin aside (<pin>_replaced) before the load, so
// that libbpf creates the map anew under its name, and after the load copies the old map's entries
// into the new one, before any program of the new object is attached; then it removes the old pin.
// Programs still running with the old map (tc on pods not enrolled again yet, sk_msg on sockets
// already in the bypass, which keep the program they were given when they entered it) keep it
// alive until they go. For sm_stack_flows that split is harmless: what those sk_msg programs pin
// after a miss they read back from the old map, and the proxy, which pins into the map it finds
// pinned, takes the app's socket out of sm_bypass right after, so sk_msg no longer runs for it.
// Only install replaces maps (MapChanges::kReplace), because only install then re-pins the
// programs that use them (program_identity.h compares their maps).
//
// Refused, with what differs and what to do: a different type, key or value size (the entries
// would not mean the same), and socket maps (a socket can only be added by a holder of its
// descriptor, which the loader is not).
#include <bpf/libbpf.h>
#include <linux/bpf.h>

#include <string>
#include <vector>

#include "loader/maps/result.h"
#include "loader/maps/unique_fd.h"

namespace sockmesh::loader {

// Whether a load may replace pinned maps: install does (and re-pins the programs that use them);
// a load that only attaches (enroll's sk_lookup) refuses and asks for an install.
enum class MapChanges { kReplace, kRefuse };

class MapUpgrade {
 public:
  // Before bpf_object__load: looks at every map of `obj` that libbpf will pin or reuse. A pin left
  // aside by an upgrade that did not finish is taken up again (kReplace).
  static maps::Result<MapUpgrade> prepare(bpf_object* obj, MapChanges mode);

  // After a successful load: copies each replaced map's entries into its new map, then removes the
  // old pins. One line per map in `changes` (also logged). If a copy fails, every replaced map is
  // put back as it was (nothing of this load is pinned or attached yet besides the maps).
  maps::Status finish(bpf_object* obj, std::vector<std::string>* changes);

  // After a failed load: the old pins go back to their names (libbpf unpins what it created).
  void undo();

  bool empty() const { return moved_.empty(); }

  MapUpgrade() = default;
  MapUpgrade(MapUpgrade&&) = default;
  MapUpgrade& operator=(MapUpgrade&&) = default;

 private:
  struct Moved {
    std::string name;   // the map's name in the object
    std::string pin;    // where it is pinned
    std::string aside;  // where the old pin is meanwhile
    maps::UniqueFd old;
    bpf_map_info info{};  // the old map's
    // true: the new map was pinned already (an earlier run stopped after its load); undo leaves
    // both pins as they are, for the next install.
    bool loaded_before = false;
  };
  // prepare()'s work; on an error the caller puts back what was moved.
  maps::Status move_aside(bpf_object* obj, MapChanges mode);

  std::vector<Moved> moved_;
};

// Where MapUpgrade keeps the old pin of `pin` during an upgrade.
std::string replaced_pin_path(const std::string& pin);

}  // namespace sockmesh::loader
