// core/hex.hpp: hexadecimal digits. Plain C++17 so that CUDA sources can include it.
#pragma once

namespace crucible {

/// The value of one hex digit (either case), or -1 for any other character.
constexpr int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

} // namespace crucible
