// core/host_port.hpp: "HOST:PORT" as the project's listen and join addresses write it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace crucible {

/// An address split at its last colon. Plain value.
struct host_port {
  std::string host;
  std::uint16_t port = 0;
};

/// `text` as HOST:PORT: a host that is not empty and a port of one to five digits from 0 to
/// 65535 (0: any free port, where the caller listens); nullopt for anything else.
inline std::optional<host_port> split_host_port(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size() || colon + 6 < text.size())
    return std::nullopt;
  std::uint32_t port = 0;
  for (char c : text.substr(colon + 1)) {
    if (c < '0' || c > '9')
      return std::nullopt;
    port = port * 10 + static_cast<std::uint32_t>(c - '0');
  }
  if (port > 65535)
    return std::nullopt;
  return host_port{std::string{text.substr(0, colon)}, static_cast<std::uint16_t>(port)};
}

} // namespace crucible
