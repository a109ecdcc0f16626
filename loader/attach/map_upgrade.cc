#include "loader/attach/map_upgrade.h"

#include <bpf/bpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "base/log.h"
#include "loader/attach/bpffs.h"

namespace sockmesh::loader {
namespace {

using maps::Error;
using maps::UniqueFd;

struct Shape {
  uint32_t type = 0;
  uint32_t key_size = 0;
  uint32_t value_size = 0;
  uint32_t max_entries = 0;
  uint32_t flags = 0;
  bool operator==(const Shape&) const = default;
};

Shape shape_of(const bpf_map_info& info) {
  return {info.type, info.key_size, info.value_size, info.max_entries, info.map_flags};
}

Shape shape_of(const bpf_map* map) {
  return {static_cast<uint32_t>(bpf_map__type(map)), bpf_map__key_size(map),
          bpf_map__value_size(map), bpf_map__max_entries(map), bpf_map__map_flags(map)};
}

std::string describe(const Shape& s);

// "pinned map <pin> is <have>; this build needs <want>"
std::string mismatch(const std::string& pin, const Shape& have, const Shape& want) {
  return "pinned map " + pin + " is " + describe(have) + "; this build needs " + describe(want);
}

std::string describe(const Shape& s) {
  const char* type = libbpf_bpf_map_type_str(static_cast<bpf_map_type>(s.type));
  char buf[200];
  snprintf(buf, sizeof buf, "%s, key %u B, value %u B, max_entries %u, flags 0x%x",
           type ? type : "unknown type", s.key_size, s.value_size, s.max_entries, s.flags);
  return buf;
}

bool per_cpu(uint32_t type) {
  return type == BPF_MAP_TYPE_PERCPU_HASH || type == BPF_MAP_TYPE_PERCPU_ARRAY ||
         type == BPF_MAP_TYPE_LRU_PERCPU_HASH;
}

bool array(uint32_t type) {
  return type == BPF_MAP_TYPE_ARRAY || type == BPF_MAP_TYPE_PERCPU_ARRAY;
}

// Maps whose entries are plain bytes that userspace can read and write back.
bool copyable(uint32_t type) {
  switch (type) {
    case BPF_MAP_TYPE_HASH:
    case BPF_MAP_TYPE_LRU_HASH:
    case BPF_MAP_TYPE_PERCPU_HASH:
    case BPF_MAP_TYPE_LRU_PERCPU_HASH:
    case BPF_MAP_TYPE_ARRAY:
    case BPF_MAP_TYPE_PERCPU_ARRAY:
    case BPF_MAP_TYPE_LPM_TRIE:
      return true;
    default:
      return false;
  }
}

maps::Result<bpf_map_info> info_of(int fd, const std::string& path) {
  bpf_map_info info{};
  uint32_t len = sizeof info;
  if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) {
    return Error::from_errno(errno, "reading what " + path + " is");
  }
  return info;
}

struct CopyCount {
  size_t copied = 0;
  size_t kept = 0;     // the new map had the key already: its entry is newer and stays
  size_t dropped = 0;  // the new map had no room
};

// Copies every entry of `from` that `to` lacks (arrays: every slot). Keys are listed first; a key
// deleted meanwhile makes the kernel's walk start over, so keys already seen are skipped.
maps::Result<CopyCount> copy_entries(int from, int to, const bpf_map_info& info,
                                     const std::string& what) {
  size_t value_bytes = info.value_size;
  if (per_cpu(info.type)) {
    int cpus = libbpf_num_possible_cpus();
    if (cpus <= 0) return Error::from_errno(-cpus, "counting the possible CPUs for " + what);
    value_bytes = ((info.value_size + 7) / 8 * 8) * static_cast<size_t>(cpus);
  }
  // An array has every key: its slots are overwritten. Elsewhere what the new map has already
  // (written since its pin appeared, or before an earlier run stopped) is newer and stays.
  const uint64_t flags = array(info.type) ? BPF_ANY : BPF_NOEXIST;
  std::set<std::vector<uint8_t>> keys;
  std::vector<uint8_t> prev, next(info.key_size);
  // A bound on the walk of a map that keeps changing under it.
  const size_t max_steps = 4 * static_cast<size_t>(info.max_entries) + 16;
  for (size_t step = 0; step < max_steps; ++step) {
    if (bpf_map_get_next_key(from, prev.empty() ? nullptr : prev.data(), next.data()) != 0) {
      if (errno == ENOENT) break;
      return Error::from_errno(errno, "walking the old " + what);
    }
    keys.insert(next);
    prev = next;
  }
  CopyCount n;
  std::vector<uint8_t> value(value_bytes);
  for (const auto& key : keys) {
    if (bpf_map_lookup_elem(from, key.data(), value.data()) != 0) {
      if (errno == ENOENT) continue;  // gone since the walk found it
      return Error::from_errno(errno, "reading the old " + what);
    }
    if (bpf_map_update_elem(to, key.data(), value.data(), flags) != 0) {
      if (errno == EEXIST) {
        ++n.kept;
      } else if (errno == E2BIG || errno == ENOSPC || errno == ENOMEM) {
        ++n.dropped;
      } else {
        return Error::from_errno(errno, "writing the new " + what);
      }
      continue;
    }
    ++n.copied;
  }
  return n;
}

}  // namespace

// bpffs refuses names with a dot.
std::string replaced_pin_path(const std::string& pin) { return pin + "_replaced"; }

maps::Result<MapUpgrade> MapUpgrade::prepare(bpf_object* obj, MapChanges mode) {
  MapUpgrade up;
  if (auto s = up.move_aside(obj, mode); !s) {
    up.undo();  // pins this call moved already go back
    return s.error();
  }
  return up;
}

maps::Status MapUpgrade::move_aside(bpf_object* obj, MapChanges mode) {
  const bool replace = mode == MapChanges::kReplace;
  bpf_map* map = nullptr;
  bpf_object__for_each_map(map, obj) {
    const char* pin_c = bpf_map__pin_path(map);
    if (pin_c == nullptr) continue;
    std::string pin = pin_c;
    std::string name = bpf_map__name(map);
    std::string aside = replaced_pin_path(pin);
    bool left_aside = pin_exists(aside);
    if (left_aside && !replace) {
      return Error{EAGAIN, "an install that did not finish left " + aside +
                               ": run sockmesh-loader install, which completes it"};
    }
    if (left_aside && !pin_exists(pin)) {
      // Moved aside by a run that stopped before its load finished: put it back, look again.
      if (rename(aside.c_str(), pin.c_str()) != 0) {
        return Error::from_errno(errno, "putting " + aside + " back as " + pin);
      }
      SM_WARN("loader") << "map " << name << ": " << aside
                        << " was left by an upgrade that did not finish; put back";
      left_aside = false;
    }
    if (!pin_exists(pin)) continue;  // libbpf creates it
    UniqueFd fd(bpf_obj_get(pin.c_str()));
    if (!fd) return Error::from_errno(errno, "opening the pinned map " + pin);
    auto info = info_of(fd.get(), pin);
    if (!info) return info.error();
    Shape want = shape_of(map);
    Shape have = shape_of(*info);
    if (left_aside) {
      // The run before this one loaded its object (the pin is the new map) and stopped before it
      // had copied everything from the old one: copy what is missing.
      if (want != have) {
        return Error{EEXIST, "map " + name + ": both " + pin + " and " + aside + " are there and " +
                                 pin + " is " + describe(have) + ", not what this build needs (" +
                                 describe(want) + "); remove the one that is not wanted"};
      }
      UniqueFd old(bpf_obj_get(aside.c_str()));
      if (!old) return Error::from_errno(errno, "opening " + aside);
      auto old_info = info_of(old.get(), aside);
      if (!old_info) return old_info.error();
      moved_.push_back(Moved{name, pin, aside, std::move(old), *old_info, true});
      continue;
    }
    if (want == have) continue;  // reused as it is
    if (!replace) {
      return Error{EINVAL, mismatch(pin, have, want) +
                               ": run sockmesh-loader install first, which replaces it"};
    }
    std::string refused;
    if (have.type != want.type || have.key_size != want.key_size ||
        have.value_size != want.value_size) {
      refused = "its entries would not mean the same in the new layout";
    } else if (!copyable(have.type)) {
      refused = "its entries cannot be copied into a new map from user space";
    }
    if (!refused.empty()) {
      return Error{EINVAL, mismatch(pin, have, want) + ", and " + refused +
                               ". Remove the old datapath first (sockmesh-loader --pin-root <root> "
                               "uninstall --force: bypassed flows go back to TCP, enrolled pods "
                               "lose capture until the agent enrolls them again), then install"};
    }
    if (rename(pin.c_str(), aside.c_str()) != 0) {
      return Error::from_errno(errno, "moving " + pin + " aside to " + aside);
    }
    SM_INFO("loader") << mismatch(pin, have, want) << "; the old pin moves to " << aside
                      << " and its entries are copied into the new map";
    moved_.push_back(Moved{name, pin, aside, std::move(fd), *info, false});
  }
  return {};
}

maps::Status MapUpgrade::finish(bpf_object* obj, std::vector<std::string>* changes) {
  struct Line {
    std::string text;
    bool dropped;  // logged as a warning
  };
  std::vector<Line> lines;
  for (auto& m : moved_) {
    bpf_map* map = bpf_object__find_map_by_name(obj, m.name.c_str());
    int to = map ? bpf_map__fd(map) : -1;
    auto count =
        to < 0 ? maps::Result<CopyCount>(Error{ENOENT, "the new map " + m.name + " is not loaded"})
               : copy_entries(m.old.get(), to, m.info, "map " + m.name);
    if (!count) {
      Error error = count.error();
      undo();  // the old maps go back under their names; this load's go with its object
      return Error{error.code, error.message + " (the old maps are back in place)"};
    }
    std::string line = "replaced map " + m.name + " (" + describe(shape_of(m.info)) + " -> " +
                       describe(shape_of(map)) + "): " + std::to_string(count->copied) +
                       " entries copied";
    if (count->kept > 0) line += ", " + std::to_string(count->kept) + " newer kept";
    if (count->dropped > 0) {
      line += ", " + std::to_string(count->dropped) + " did not fit and were dropped";
    }
    lines.push_back({std::move(line), count->dropped > 0});
  }
  // Every copy is done: only now do the old pins go.
  for (size_t i = 0; i < moved_.size(); ++i) {
    if (unlink(moved_[i].aside.c_str()) != 0 && errno != ENOENT) {
      SM_WARN("loader") << "removing the old pin " << moved_[i].aside << ": "
                        << std::strerror(errno) << " (uninstall or the next install removes it)";
    }
    if (lines[i].dropped) {
      SM_WARN("loader") << lines[i].text;
    } else {
      SM_INFO("loader") << lines[i].text;
    }
    if (changes) changes->push_back(lines[i].text);
  }
  moved_.clear();
  return {};
}

void MapUpgrade::undo() {
  for (auto& m : moved_) {
    if (m.loaded_before) continue;  // its pin is the new map; the aside is for the next run
    if (pin_exists(m.pin)) unlink(m.pin.c_str());  // what libbpf pinned before it failed, if any
    if (rename(m.aside.c_str(), m.pin.c_str()) != 0) {
      SM_ERROR("loader") << "putting " << m.aside << " back as " << m.pin
                         << " failed: " << std::strerror(errno)
                         << "; the next install takes it up again";
    }
  }
  moved_.clear();
}

}  // namespace sockmesh::loader
