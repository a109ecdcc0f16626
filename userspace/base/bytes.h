#pragma once
// A byte buffer whose resize() does not zero the new bytes: buffers that a read() is about to
// fill would otherwise be written twice.
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

namespace sockmesh {

template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

using Bytes = std::vector<uint8_t, DefaultInitAllocator<uint8_t>>;

}  // namespace sockmesh
