#pragma once
// Errors as values for the loader and the map API. Failures here are ordinary (a pod's netns
// vanished, the maps are not pinned yet, a capability is missing), so they are returned with a
// message that names what is missing, and the errno the kernel gave when there was one.
#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace sockmesh::maps {

struct Error {
  int code = 0;  // errno from the kernel, 0 when the failure was not a system call's
  std::string message;

  // "<what>: <strerror(code)>" with code = errno, for a failed system call.
  static Error from_errno(int code, const std::string& what);
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT: implicit

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Error& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }

 private:
  std::variant<T, Error> v_;
};

// Success without a value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), failed_(true) {}  // NOLINT: implicit by design

  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    assert(failed_);
    return error_;
  }

 private:
  Error error_{};
  bool failed_ = false;
};

}  // namespace sockmesh::maps
