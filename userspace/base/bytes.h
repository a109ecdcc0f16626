#pragma once
// A byte buffer whose resize() does not zero the new bytes: buffers that a read() is about to
// fill would otherwise be written twice.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

namespace sockmesh {

// Byte buffers start on a cache line. The kernel's copy into and out of user memory (recv, send)
// runs at about half its speed when the user buffer is not 64-byte aligned, and malloc's large
// blocks start 16 bytes into a page: measured on the relay floor of bench/, 6-7 against 10-11
// Gbit/s for the same loop.
inline constexpr std::size_t kBufferAlignment = 64;

template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;
  T* allocate(std::size_t n) {
    return static_cast<T*>(
        ::operator new(n * sizeof(T), std::align_val_t{std::max(kBufferAlignment, alignof(T))}));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    ::operator delete(p, n * sizeof(T), std::align_val_t{std::max(kBufferAlignment, alignof(T))});
  }
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

// Bytes' own range insert and range constructor go byte by byte (the allocator's construct() keeps
// libstdc++ from using memmove): on the data path, use these, which copy with memcpy.
inline void append(Bytes& b, const void* data, size_t len) {
  if (len == 0) return;
  size_t old = b.size();
  b.resize(old + len);  // default-init: nothing written
  std::memcpy(b.data() + old, data, len);
}
inline Bytes bytes_of(const void* data, size_t len) {
  Bytes b;
  append(b, data, len);
  return b;
}

}  // namespace sockmesh
