// text/unicode.hpp: the Unicode properties and the NFC normalization that the tokenizer's
// pre-tokenizers and normalizer need, from the tables of text/unicode_tables.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace crucible::policy::unicode {

/// Property bits of a code point.
enum flag : std::uint8_t {
  letter = 1,        ///< general category L* (\p{L})
  number = 2,        ///< general category N* (\p{N})
  space = 4,         ///< White_Space (\s of the tokenizers' regex engine)
  nfc_sensitive = 8, ///< NFC may change text that contains it (decomposes, combines or reorders)
  word = 16,         ///< \w of Rust's regex: Alphabetic, M*, Nd, Pc, Join_Control
};

namespace detail {
const std::uint8_t* flag_blocks() noexcept;
const std::uint16_t* flag_index() noexcept;
} // namespace detail

/// The flags of `cp` (0 for code points above U+10FFFF). Thread-safe; the lookup table is
/// built once, on first use.
inline std::uint8_t flags(char32_t cp) noexcept {
  if (cp >= 0x110000)
    return 0;
  static const std::uint16_t* index = detail::flag_index();
  static const std::uint8_t* blocks = detail::flag_blocks();
  return blocks[(static_cast<std::uint32_t>(index[cp >> 8]) << 8) | (cp & 0xFF)];
}

/// Canonical combining class of `cp` (0 for starters).
std::uint8_t combining_class(char32_t cp) noexcept;

/// False guarantees nfc(text) == text; a cheap scan that lets most text skip normalization.
bool may_change_under_nfc(std::string_view text) noexcept;

/// Unicode Normalization Form C of UTF-8 `text`. Bytes that are not valid UTF-8 are kept as
/// they are and act as starters that compose with nothing.
std::string nfc(std::string_view text);

/// Where the tables came from (Python, Unicode and tokenizers versions).
const char* data_source() noexcept;

} // namespace crucible::policy::unicode
