#pragma once
// A byte buffer whose resize() does not zero the new bytes: buffers that a read() is about to
// fill would otherwise be written twice.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

namespace sockmesh {

// A connection's long-lived I/O buffers (AlignedBytes) start on a cache line. The kernel's copy
// into and out of user memory (recv, send) runs at about half its speed when the user buffer is
// not 64-byte aligned, and malloc's large blocks start 16 bytes into a page: measured on the relay
// floor of bench/, 6-7 against 10-11 Gbit/s for the same loop. Per-read chunks (Bytes) are not
// aligned: aligned allocation splits malloc's blocks, and for a 256 KiB chunk per read that kept
// 1,000 idle tunnels at 25 MiB instead of 18.
inline constexpr std::size_t kBufferAlignment = 64;

// Align = 0: malloc's own alignment.
template <typename T, std::size_t Align = 0>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U, Align>;
  };
  using std::allocator<T>::allocator;
  DefaultInitAllocator() noexcept = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U, Align>&) noexcept {}
  T* allocate(std::size_t n) {
    if constexpr (Align == 0) {
      return std::allocator<T>::allocate(n);
    } else {
      return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{Align}));
    }
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if constexpr (Align == 0) {
      std::allocator<T>::deallocate(p, n);
    } else {
      ::operator delete(p, n * sizeof(T), std::align_val_t{Align});
    }
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
using AlignedBytes = std::vector<uint8_t, DefaultInitAllocator<uint8_t, kBufferAlignment>>;

// Bytes' own range insert and range constructor go byte by byte (the allocator's construct() keeps
// libstdc++ from using memmove): on the data path, use these, which copy with memcpy.
template <typename Alloc>
inline void append(std::vector<uint8_t, Alloc>& b, const void* data, size_t len) {
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
