// text/unicode_tables.hpp: the raw Unicode tables generated into text/unicode_tables.cpp
// by tools/gen_unicode_tables.py. Only text/unicode.cpp reads them; everything else uses the
// lookups of text/unicode.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace crucible::policy::unicode_data {

/// Inclusive range of code points.
struct code_range {
  char32_t first;
  char32_t last;
};

/// Inclusive range of code points sharing one canonical combining class (never 0).
struct class_range {
  char32_t first;
  char32_t last;
  std::uint8_t ccc;
};

/// The full canonical decomposition of `cp`: decomposition_data[offset, offset + length).
struct decomposition {
  char32_t cp;
  std::uint32_t offset;
  std::uint32_t length;
};

/// A primary composite: `first` followed by `second` composes to `composite` under NFC.
struct composition {
  char32_t first;
  char32_t second;
  char32_t composite;
};

/// Where the data came from (Python and Unicode versions), for messages and docs.
extern const char* const source;

/// Sorted, disjoint ranges: general categories L* and N*, White_Space, and \w of Rust's regex.
extern const code_range letter_ranges[];
extern const std::size_t letter_ranges_count;
extern const code_range number_ranges[];
extern const std::size_t number_ranges_count;
extern const code_range space_ranges[];
extern const std::size_t space_ranges_count;
extern const code_range word_ranges[];
extern const std::size_t word_ranges_count;

/// Sorted by `first`.
extern const class_range combining_ranges[];
extern const std::size_t combining_ranges_count;

/// Sorted by `cp`; Hangul syllables are not listed (algorithmic).
extern const decomposition decompositions[];
extern const std::size_t decompositions_count;
extern const char32_t decomposition_data[];

/// Sorted by (first, second); Hangul compositions are not listed (algorithmic).
extern const composition compositions[];
extern const std::size_t compositions_count;

} // namespace crucible::policy::unicode_data
