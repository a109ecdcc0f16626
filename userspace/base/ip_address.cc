#include "base/ip_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <charconv>
#include <cstring>

namespace sockmesh {
namespace {
constexpr std::array<uint8_t, 12> kV4MappedPrefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
}

std::optional<IpAddress> IpAddress::parse(std::string_view text) {
  if (text.empty() || text.size() > INET6_ADDRSTRLEN) return std::nullopt;
  std::string s(text);
  IpAddress a;
  in_addr v4{};
  if (inet_pton(AF_INET, s.c_str(), &v4) == 1) {
    std::memcpy(a.bytes_.data(), kV4MappedPrefix.data(), 12);
    std::memcpy(a.bytes_.data() + 12, &v4, 4);
    return a;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, s.c_str(), &v6) == 1) {
    std::memcpy(a.bytes_.data(), &v6, 16);
    return a;
  }
  return std::nullopt;
}

IpAddress IpAddress::v4(uint32_t host_order) {
  IpAddress a;
  std::memcpy(a.bytes_.data(), kV4MappedPrefix.data(), 12);
  uint32_t n = htonl(host_order);
  std::memcpy(a.bytes_.data() + 12, &n, 4);
  return a;
}

IpAddress IpAddress::from_bytes16(const std::array<uint8_t, 16>& bytes) {
  IpAddress a;
  a.bytes_ = bytes;
  return a;
}

std::optional<IpAddress> IpAddress::from_sockaddr(const sockaddr* sa) {
  if (sa == nullptr) return std::nullopt;
  IpAddress a;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    std::memcpy(a.bytes_.data(), kV4MappedPrefix.data(), 12);
    std::memcpy(a.bytes_.data() + 12, &in->sin_addr, 4);
    return a;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    std::memcpy(a.bytes_.data(), &in6->sin6_addr, 16);
    return a;
  }
  return std::nullopt;
}

bool IpAddress::is_v4() const {
  return std::memcmp(bytes_.data(), kV4MappedPrefix.data(), 12) == 0;
}

bool IpAddress::is_unspecified() const {
  if (is_v4()) return v4_network_order() == 0;
  for (auto b : bytes_) {
    if (b != 0) return false;
  }
  return true;
}

bool IpAddress::is_loopback() const {
  if (is_v4()) return bytes_[12] == 127;
  static const std::array<uint8_t, 16> kLoop = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return bytes_ == kLoop;
}

uint32_t IpAddress::v4_network_order() const {
  uint32_t n;
  std::memcpy(&n, bytes_.data() + 12, 4);
  return n;
}

std::string IpAddress::to_string() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (is_v4()) {
    inet_ntop(AF_INET, bytes_.data() + 12, buf, sizeof buf);
  } else {
    inet_ntop(AF_INET6, bytes_.data(), buf, sizeof buf);
  }
  return buf;
}

std::string Endpoint::to_string() const {
  if (ip.is_v4()) return ip.to_string() + ":" + std::to_string(port);
  return "[" + ip.to_string() + "]:" + std::to_string(port);
}

std::optional<Endpoint> Endpoint::parse(std::string_view text) {
  std::string_view host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return std::nullopt;
    }
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return std::nullopt;  // bare v6 needs []
  }
  if (port_text.empty() || port_text.size() > 5) return std::nullopt;
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return std::nullopt;
  }
  auto ip = IpAddress::parse(host);
  if (!ip) return std::nullopt;
  return Endpoint{*ip, static_cast<uint16_t>(port)};
}

unsigned Endpoint::to_sockaddr(sockaddr_storage* out) const {
  std::memset(out, 0, sizeof *out);
  if (ip.is_v4()) {
    auto* in = reinterpret_cast<sockaddr_in*>(out);
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    std::memcpy(&in->sin_addr, ip.bytes16().data() + 12, 4);
    return sizeof(sockaddr_in);
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(out);
  in6->sin6_family = AF_INET6;
  in6->sin6_port = htons(port);
  std::memcpy(&in6->sin6_addr, ip.bytes16().data(), 16);
  return sizeof(sockaddr_in6);
}

std::optional<Endpoint> Endpoint::from_sockaddr(const sockaddr* sa) {
  auto ip = IpAddress::from_sockaddr(sa);
  if (!ip) return std::nullopt;
  uint16_t port = sa->sa_family == AF_INET
                      ? ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port)
                      : ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return Endpoint{*ip, port};
}

std::optional<IpNetwork> IpNetwork::parse(std::string_view text) {
  auto slash = text.find('/');
  auto ip = IpAddress::parse(text.substr(0, slash));
  if (!ip) return std::nullopt;
  int max = ip->is_v4() ? 32 : 128;
  int len = max;
  if (slash != std::string_view::npos) {
    auto p = text.substr(slash + 1);
    auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), len);
    if (p.empty() || ec != std::errc() || ptr != p.data() + p.size() || len < 0 || len > max) {
      return std::nullopt;
    }
  }
  IpNetwork n{*ip, ip->is_v4() ? len + 96 : len};
  // Normalise: clear host bits so that equal networks compare equal.
  auto bytes = n.base.bytes16();
  for (int i = 0; i < 16; ++i) {
    int bits = n.prefix_len - i * 8;
    if (bits >= 8) continue;
    bytes[i] &= bits <= 0 ? 0 : static_cast<uint8_t>(0xff << (8 - bits));
  }
  n.base = IpAddress::from_bytes16(bytes);
  return n;
}

bool IpNetwork::contains(const IpAddress& ip) const {
  const auto& a = base.bytes16();
  const auto& b = ip.bytes16();
  int bits = prefix_len;
  for (int i = 0; i < 16 && bits > 0; ++i, bits -= 8) {
    uint8_t mask = bits >= 8 ? 0xff : static_cast<uint8_t>(0xff << (8 - bits));
    if ((a[i] & mask) != (b[i] & mask)) return false;
  }
  return true;
}

std::string IpNetwork::to_string() const {
  return base.to_string() + "/" + std::to_string(base.is_v4() ? prefix_len - 96 : prefix_len);
}

}  // namespace sockmesh

size_t std::hash<sockmesh::IpAddress>::operator()(const sockmesh::IpAddress& a) const noexcept {
  const auto& b = a.bytes16();
  uint64_t hi, lo;
  std::memcpy(&hi, b.data(), 8);
  std::memcpy(&lo, b.data() + 8, 8);
  return std::hash<uint64_t>()(hi * 0x9e3779b97f4a7c15ULL ^ lo);
}
