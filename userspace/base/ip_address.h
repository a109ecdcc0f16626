#pragma once
// An IPv4 or IPv6 address as plain bytes: cheap to copy and hash, and the same bytes that the
// BPF maps use as keys (IPv4 is stored as an IPv4-mapped IPv6 address).
#include <array>
#include <compare>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

struct sockaddr;
struct sockaddr_storage;

namespace sockmesh {

class IpAddress {
 public:
  IpAddress() = default;
  static std::optional<IpAddress> parse(std::string_view text);
  static IpAddress v4(uint32_t host_order);
  static IpAddress from_bytes16(const std::array<uint8_t, 16>& bytes);
  // Reads the address part of an AF_INET or AF_INET6 sockaddr.
  static std::optional<IpAddress> from_sockaddr(const sockaddr* sa);

  bool is_v4() const;
  bool is_unspecified() const;
  bool is_loopback() const;
  // Network-order IPv4 value; only meaningful when is_v4().
  uint32_t v4_network_order() const;
  const std::array<uint8_t, 16>& bytes16() const { return bytes_; }
  std::string to_string() const;

  auto operator<=>(const IpAddress&) const = default;

 private:
  std::array<uint8_t, 16> bytes_{};  // IPv4-mapped for IPv4
};

// An address and port, as dialled or accepted.
struct Endpoint {
  IpAddress ip;
  uint16_t port = 0;

  // "1.2.3.4:80" or "[::1]:80".
  std::string to_string() const;
  // Parses "ip:port" and "[v6]:port"; nullopt when malformed.
  static std::optional<Endpoint> parse(std::string_view text);
  // Fills a sockaddr_storage; returns its length.
  unsigned to_sockaddr(sockaddr_storage* out) const;
  static std::optional<Endpoint> from_sockaddr(const sockaddr* sa);

  auto operator<=>(const Endpoint&) const = default;
};

// A CIDR range ("10.0.0.0/8", "fd00::/64", or a bare address meaning a single host).
struct IpNetwork {
  IpAddress base;
  int prefix_len = 128;  // in IPv6 terms; IPv4 ranges are offset by 96
  static std::optional<IpNetwork> parse(std::string_view text);
  bool contains(const IpAddress& ip) const;
  std::string to_string() const;
  auto operator<=>(const IpNetwork&) const = default;
};

}  // namespace sockmesh

template <>
struct std::hash<sockmesh::IpAddress> {
  size_t operator()(const sockmesh::IpAddress& a) const noexcept;
};
