#pragma once
// Whether a loaded program is the same as a pinned one, so that install and enroll replace a
// pinned program (or move a link to a new one) only when something that matters differs.
#include <cstdint>
#include <string>
#include <vector>

#include "loader/maps/result.h"

namespace sockmesh::loader {

// What makes two loaded programs the same: their instructions (the tag), their knobs (the
// content of their .rodata map) and the pinned maps they use (a map replaced by an install,
// map_upgrade.h), none of which the tag covers.
struct ProgramIdentity {
  uint32_t id = 0;
  std::string tag;
  std::string rodata;
  std::vector<uint32_t> maps;  // ids of the maps that are not the object's own (.rodata, .bss)
  bool operator==(const ProgramIdentity& o) const {
    return tag == o.tag && rodata == o.rodata && maps == o.maps;
  }
};

// The identity of the loaded program `prog_fd`.
maps::Result<ProgramIdentity> identity_of(int prog_fd);

}  // namespace sockmesh::loader
