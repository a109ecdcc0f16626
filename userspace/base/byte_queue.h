#pragma once
// A FIFO of bytes stored in chunks of one fixed size. Appends fill the tail chunk before they take
// a new one, so the memory a queue holds follows the number of bytes in it, not the number of
// appends: a peer that sends a 4 MiB window as one-byte HTTP/2 DATA frames costs 4 MiB and a
// chunk, not four million allocations. Appended bytes never move, so the front can be handed to a
// gather write while more is appended behind it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <utility>

namespace sockmesh {

class ByteQueue {
 public:
  // Large enough that one gather write of a few chunks moves a socket buffer's worth; small
  // enough that a tunnel's partly filled tail wastes little, and below malloc's mmap threshold
  // so that chunks come from (and go back to) the heap without a system call.
  static constexpr size_t kDefaultChunkBytes = 64 * 1024;

  explicit ByteQueue(size_t chunk_bytes = kDefaultChunkBytes)
      : chunk_bytes_(std::max<size_t>(chunk_bytes, 1)) {}
  ByteQueue(ByteQueue&& other) noexcept
      : chunk_bytes_(other.chunk_bytes_),
        chunks_(std::move(other.chunks_)),
        size_(std::exchange(other.size_, 0)) {
    other.chunks_.clear();
  }
  ByteQueue& operator=(ByteQueue&& other) noexcept {
    if (this != &other) {
      chunk_bytes_ = other.chunk_bytes_;
      chunks_ = std::move(other.chunks_);
      other.chunks_.clear();
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ByteQueue(const ByteQueue&) = delete;
  ByteQueue& operator=(const ByteQueue&) = delete;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Bytes allocated, used or not: at most size() plus two chunks (a consumed head, a spare tail).
  size_t allocated() const { return chunks_.size() * chunk_bytes_; }

  void append(const void* data, size_t len) {
    const auto* from = static_cast<const uint8_t*>(data);
    while (len > 0) {
      if (chunks_.empty() || chunks_.back().end == chunk_bytes_) {
        chunks_.push_back(Chunk{std::make_unique_for_overwrite<uint8_t[]>(chunk_bytes_), 0, 0});
      }
      Chunk& tail = chunks_.back();
      size_t take = std::min(len, chunk_bytes_ - tail.end);
      std::memcpy(tail.data.get() + tail.end, from, take);
      tail.end += take;
      size_ += take;
      from += take;
      len -= take;
    }
  }

  // The first contiguous run of queued bytes; empty when the queue is.
  std::span<const uint8_t> front() const {
    if (chunks_.empty()) return {};
    const Chunk& c = chunks_.front();
    return {c.data.get() + c.begin, c.end - c.begin};
  }

  // Up to out.size() contiguous runs from the front, in order, for a gather write; returns how
  // many it filled. They stay valid until consume() drops them or clear().
  size_t gather(std::span<std::span<const uint8_t>> out) const {
    size_t n = 0;
    for (auto it = chunks_.begin(); it != chunks_.end() && n < out.size(); ++it) {
      if (it->end > it->begin) out[n++] = {it->data.get() + it->begin, it->end - it->begin};
    }
    return n;
  }

  // Drops the first n bytes (at most size()). Emptied chunks are freed at once, and an empty
  // queue holds no memory at all: an idle tunnel costs nothing here.
  void consume(size_t n) {
    n = std::min(n, size_);
    size_ -= n;
    while (n > 0) {
      Chunk& c = chunks_.front();
      size_t take = std::min(n, c.end - c.begin);
      c.begin += take;
      n -= take;
      if (c.begin == c.end) chunks_.pop_front();
    }
  }

  void clear() {
    chunks_.clear();
    size_ = 0;
  }

 private:
  struct Chunk {
    std::unique_ptr<uint8_t[]> data;
    size_t begin;  // [begin, end) holds queued bytes
    size_t end;
  };

  size_t chunk_bytes_;
  std::deque<Chunk> chunks_;
  size_t size_ = 0;
};

}  // namespace sockmesh
