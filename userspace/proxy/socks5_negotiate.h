#pragma once
// The SOCKS5 handshake (RFC 1928) of the proxy's SOCKS5 entry: the greeting, the method choice (no
// authentication only) and one CONNECT request, over any asio stream (the entry's TCP socket; the
// fuzz target's socket pair). Hostnames are looked up by the caller.
#include <algorithm>
#include <array>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/ip_address.h"
#include "base/log.h"

namespace sockmesh::proxy::socks5 {

using boost::asio::awaitable;
using boost::asio::use_awaitable;

// The address of a hostname in a request; nullopt: unknown (the proxy does no DNS).
using ResolveHost = std::function<std::optional<IpAddress>(const std::string& host)>;

enum Reply : uint8_t {
  kSucceeded = 0,
  kGeneralFailure = 1,
  kNotAllowed = 2,
  kHostUnreachable = 4,
  kConnectionRefused = 5,
  kCommandNotSupported = 7,
  kAddressTypeNotSupported = 8,
};

inline std::array<uint8_t, 10> reply(uint8_t code) { return {5, code, 0, 1, 0, 0, 0, 0, 0, 0}; }

// Peer-supplied text for a log line: control characters, DEL, bytes outside ASCII and the
// backslash come out as \xNN, so a hostname cannot forge log lines or terminal escapes.
inline std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}


struct Negotiated {
  bool ok = false;
  Endpoint destination;
};

// Reads the greeting and the request from `s` and answers errors itself; a hostname is looked up
// with `resolve` (nullopt: unknown host). Ends early, with ok false, on a malformed message.
template <class Stream>
awaitable<Negotiated> negotiate(Stream& s, ResolveHost resolve) {
  Negotiated out;
  uint8_t head[2];
  co_await boost::asio::async_read(s, boost::asio::buffer(head), use_awaitable);
  if (head[0] != 5 || head[1] == 0) {
    SM_INFO("socks5") << "not a SOCKS5 greeting (version " << int(head[0]) << ")";
    co_return out;
  }
  std::vector<uint8_t> methods(head[1]);
  co_await boost::asio::async_read(s, boost::asio::buffer(methods), use_awaitable);
  bool no_auth = std::find(methods.begin(), methods.end(), 0) != methods.end();
  uint8_t choice[2] = {5, static_cast<uint8_t>(no_auth ? 0 : 0xff)};
  co_await boost::asio::async_write(s, boost::asio::buffer(choice), use_awaitable);
  if (!no_auth) co_return out;

  uint8_t req[4];
  co_await boost::asio::async_read(s, boost::asio::buffer(req), use_awaitable);
  if (req[0] != 5) co_return out;
  if (req[1] != 1) {
    auto r = reply(kCommandNotSupported);
    co_await boost::asio::async_write(s, boost::asio::buffer(r), use_awaitable);
    co_return out;
  }
  std::optional<IpAddress> ip;
  if (req[3] == 1) {
    std::array<uint8_t, 4> a;
    co_await boost::asio::async_read(s, boost::asio::buffer(a), use_awaitable);
    ip = IpAddress::v4((uint32_t(a[0]) << 24) | (uint32_t(a[1]) << 16) | (uint32_t(a[2]) << 8) |
                       a[3]);
  } else if (req[3] == 4) {
    std::array<uint8_t, 16> a;
    co_await boost::asio::async_read(s, boost::asio::buffer(a), use_awaitable);
    ip = IpAddress::from_bytes16(a);
  } else if (req[3] == 3) {
    uint8_t len = 0;
    co_await boost::asio::async_read(s, boost::asio::buffer(&len, 1), use_awaitable);
    std::string host(len, '\0');
    co_await boost::asio::async_read(s, boost::asio::buffer(host), use_awaitable);
    ip = resolve(host);
    if (!ip) {
      SM_INFO("socks5") << "unknown host \"" << printable(host) << "\"";
      uint8_t port[2];
      co_await boost::asio::async_read(s, boost::asio::buffer(port), use_awaitable);
      auto r = reply(kHostUnreachable);
      co_await boost::asio::async_write(s, boost::asio::buffer(r), use_awaitable);
      co_return out;
    }
  } else {
    auto r = reply(kAddressTypeNotSupported);
    co_await boost::asio::async_write(s, boost::asio::buffer(r), use_awaitable);
    co_return out;
  }
  uint8_t port[2];
  co_await boost::asio::async_read(s, boost::asio::buffer(port), use_awaitable);
  out.destination = Endpoint{*ip, static_cast<uint16_t>((port[0] << 8) | port[1])};
  out.ok = out.destination.port != 0;
  if (!out.ok) {
    auto r = reply(kGeneralFailure);
    co_await boost::asio::async_write(s, boost::asio::buffer(r), use_awaitable);
  }
  co_return out;
}

}  // namespace sockmesh::proxy::socks5
