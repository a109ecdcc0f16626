#pragma once
// One RAII owner for a libbpf skeleton (bpftool gen skeleton): open, set knobs, load, destroy.
// The skeleton types come from bpf/CMakeLists.txt (capture_bpf, bypass_bpf).
#include <bpf/libbpf.h>

#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include "loader/attach/map_upgrade.h"
#include "loader/maps/result.h"

namespace sockmesh::loader {

using maps::Error;
using maps::Result;
using maps::Status;

// Sends libbpf's own messages (verifier logs included) to the "libbpf" log scope, once per
// process. The last warning is kept for error messages.
void route_libbpf_logs();
std::string last_libbpf_warning();

template <typename Skel>
class BpfSkeleton {
 public:
  // Opens the embedded object. Maps marked LIBBPF_PIN_BY_NAME are pinned under (or reused
  // from) `pin_root`.
  static Result<BpfSkeleton> open(const std::string& name, const std::string& pin_root) {
    route_libbpf_logs();
    LIBBPF_OPTS(bpf_object_open_opts, opts);
    opts.pin_root_path = pin_root.c_str();
    Skel* skel = Skel::open(&opts);
    if (skel == nullptr) return Error::from_errno(errno, "opening BPF object " + name);
    return BpfSkeleton(skel, name);
  }

  // Loads and verifies every program; creates or reuses and pins the maps. With kReplace, a
  // pinned map whose size or flags this build changed is replaced and its entries copied
  // (map_upgrade.h), each replacement a line in `changes`; with kRefuse, such a map fails the
  // load with a message that asks for an install.
  Status load(std::vector<std::string>* changes = nullptr, MapChanges mode = MapChanges::kRefuse) {
    auto upgrade = MapUpgrade::prepare(skel_->obj, mode);
    if (!upgrade) return upgrade.error();
    int err = Skel::load(skel_);
    if (err != 0) {
      upgrade->undo();
      std::string detail = last_libbpf_warning();
      return Error::from_errno(
          err, "loading BPF object " + name_ + (detail.empty() ? "" : " (libbpf: " + detail + ")"));
    }
    return upgrade->finish(skel_->obj, changes);
  }

  Skel* operator->() const { return skel_; }
  Skel* get() const { return skel_; }

  ~BpfSkeleton() {
    if (skel_ != nullptr) Skel::destroy(skel_);
  }
  BpfSkeleton(BpfSkeleton&& other) noexcept
      : skel_(std::exchange(other.skel_, nullptr)), name_(std::move(other.name_)) {}
  BpfSkeleton& operator=(BpfSkeleton&&) = delete;
  BpfSkeleton(const BpfSkeleton&) = delete;

 private:
  BpfSkeleton(Skel* skel, std::string name) : skel_(skel), name_(std::move(name)) {}
  Skel* skel_ = nullptr;
  std::string name_;
};

}  // namespace sockmesh::loader
