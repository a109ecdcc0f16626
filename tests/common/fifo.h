#pragma once
// Tests that a reader refuses a FIFO instead of blocking on it: the read runs on a thread; one
// that has not returned within the limit (it is waiting for a writer) is released by opening the
// FIFO for writing, and the caller gets nullopt, so the test fails instead of hanging.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <optional>
#include <string>

namespace sockmesh::testing {

template <typename Read>
auto read_of_fifo(const std::string& fifo, Read read,
                  std::chrono::milliseconds limit = std::chrono::seconds(3))
    -> std::optional<decltype(read())> {
  auto result = std::async(std::launch::async, read);
  if (result.wait_for(limit) != std::future_status::ready) {
    int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
    result.wait();
    return std::nullopt;
  }
  return result.get();
}

}  // namespace sockmesh::testing
