// text/unicode.cpp: property lookups and NFC over the generated tables (UAX #15: canonical
// decomposition, canonical ordering, canonical composition; Hangul algorithmically).
#include "text/unicode.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include "core/utf8.hpp"
#include "text/unicode_tables.hpp"

namespace crucible::policy::unicode {

namespace ud = unicode_data;

namespace {

constexpr char32_t hangul_s_base = 0xAC00, hangul_l_base = 0x1100, hangul_v_base = 0x1161,
                   hangul_t_base = 0x11A7;
constexpr char32_t hangul_l_count = 19, hangul_v_count = 21, hangul_t_count = 28;
constexpr char32_t hangul_n_count = hangul_v_count * hangul_t_count;
constexpr char32_t hangul_s_count = hangul_l_count * hangul_n_count;

// Invalid input bytes travel through NFC as these values: above every code point, starters.
constexpr char32_t raw_byte_base = 0x200000;

// Two-stage table: index[cp >> 8] names a 256-entry block of flags; equal blocks are shared.
struct flag_table {
  std::vector<std::uint16_t> index;
  std::vector<std::uint8_t> blocks;

  flag_table() {
    std::vector<std::uint8_t> all(0x110000, 0);
    auto mark = [&](const ud::code_range* r, std::size_t n, std::uint8_t bit) {
      for (std::size_t i = 0; i < n; ++i)
        for (char32_t cp = r[i].first; cp <= r[i].last; ++cp)
          all[cp] |= bit;
    };
    mark(ud::letter_ranges, ud::letter_ranges_count, letter);
    mark(ud::number_ranges, ud::number_ranges_count, number);
    mark(ud::space_ranges, ud::space_ranges_count, space);
    mark(ud::word_ranges, ud::word_ranges_count, word);
    for (std::size_t i = 0; i < ud::combining_ranges_count; ++i)
      for (char32_t cp = ud::combining_ranges[i].first; cp <= ud::combining_ranges[i].last; ++cp)
        all[cp] |= nfc_sensitive;
    for (std::size_t i = 0; i < ud::decompositions_count; ++i)
      all[ud::decompositions[i].cp] |= nfc_sensitive;
    // Second halves of compositions (some are starters, e.g. U+0B3E) and the Hangul jamo that
    // join a preceding syllable.
    for (std::size_t i = 0; i < ud::compositions_count; ++i)
      all[ud::compositions[i].second] |= nfc_sensitive;
    for (char32_t cp = hangul_v_base; cp < hangul_v_base + hangul_v_count; ++cp)
      all[cp] |= nfc_sensitive;
    for (char32_t cp = hangul_t_base + 1; cp < hangul_t_base + hangul_t_count; ++cp)
      all[cp] |= nfc_sensitive;

    std::map<std::vector<std::uint8_t>, std::uint16_t> seen;
    index.resize(0x110000 >> 8);
    for (std::size_t b = 0; b < index.size(); ++b) {
      std::vector<std::uint8_t> block(all.begin() + static_cast<long>(b << 8),
                                      all.begin() + static_cast<long>((b + 1) << 8));
      auto [it, fresh] = seen.emplace(block, static_cast<std::uint16_t>(seen.size()));
      if (fresh)
        blocks.insert(blocks.end(), block.begin(), block.end());
      index[b] = it->second;
    }
  }
};

const flag_table& table() {
  static const flag_table t;
  return t;
}

bool is_raw_byte(char32_t c) { return c >= raw_byte_base; }

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= hangul_s_base && cp < hangul_s_base + hangul_s_count) {
    char32_t s = cp - hangul_s_base;
    out.push_back(hangul_l_base + s / hangul_n_count);
    out.push_back(hangul_v_base + (s % hangul_n_count) / hangul_t_count);
    if (s % hangul_t_count != 0)
      out.push_back(hangul_t_base + s % hangul_t_count);
    return;
  }
  if (!is_raw_byte(cp) && (flags(cp) & nfc_sensitive) != 0) {
    const auto* end = ud::decompositions + ud::decompositions_count;
    const auto* it = std::lower_bound(ud::decompositions, end, cp,
                                      [](const ud::decomposition& d, char32_t c) { return d.cp < c; });
    if (it != end && it->cp == cp) {
      out.insert(out.end(), ud::decomposition_data + it->offset,
                 ud::decomposition_data + it->offset + it->length);
      return;
    }
  }
  out.push_back(cp);
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= hangul_l_base && a < hangul_l_base + hangul_l_count && b >= hangul_v_base &&
      b < hangul_v_base + hangul_v_count)
    return hangul_s_base + ((a - hangul_l_base) * hangul_v_count + (b - hangul_v_base)) * hangul_t_count;
  if (a >= hangul_s_base && a < hangul_s_base + hangul_s_count && (a - hangul_s_base) % hangul_t_count == 0 &&
      b > hangul_t_base && b < hangul_t_base + hangul_t_count)
    return a + (b - hangul_t_base);
  const auto* end = ud::compositions + ud::compositions_count;
  const auto* it = std::lower_bound(ud::compositions, end, std::pair{a, b},
                                    [](const ud::composition& c, std::pair<char32_t, char32_t> k) {
                                      return c.first < k.first || (c.first == k.first && c.second < k.second);
                                    });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

std::uint8_t ccc_of(char32_t c) { return is_raw_byte(c) ? 0 : combining_class(c); }

} // namespace

namespace detail {
const std::uint8_t* flag_blocks() noexcept { return table().blocks.data(); }
const std::uint16_t* flag_index() noexcept { return table().index.data(); }
} // namespace detail

std::uint8_t combining_class(char32_t cp) noexcept {
  if (cp < 0x300 || (flags(cp) & nfc_sensitive) == 0)
    return 0;
  const auto* end = ud::combining_ranges + ud::combining_ranges_count;
  const auto* it = std::upper_bound(ud::combining_ranges, end, cp,
                                    [](char32_t c, const ud::class_range& r) { return c < r.first; });
  if (it == ud::combining_ranges)
    return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

bool may_change_under_nfc(std::string_view text) noexcept {
  for (std::size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    auto u = decode_utf8(text, i);
    if (u.len == 0) {
      ++i;
      continue;
    }
    if ((flags(u.cp) & nfc_sensitive) != 0)
      return true;
    i += u.len;
  }
  return false;
}

std::string nfc(std::string_view text) {
  std::vector<char32_t> d;
  d.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    auto u = decode_utf8(text, i);
    if (u.len == 0) {
      d.push_back(raw_byte_base + u.cp);
      ++i;
      continue;
    }
    decompose(u.cp, d);
    i += u.len;
  }
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (std::size_t i = 0; i < d.size();) {
    if (ccc_of(d[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < d.size() && ccc_of(d[j]) != 0)
      ++j;
    if (j - i > 1)
      std::stable_sort(d.begin() + static_cast<long>(i), d.begin() + static_cast<long>(j),
                       [](char32_t a, char32_t b) { return ccc_of(a) < ccc_of(b); });
    i = j;
  }
  // Canonical composition (UAX #15): a character joins the last starter unless blocked.
  if (!d.empty()) {
    std::size_t starter = 0;
    bool have_starter = ccc_of(d[0]) == 0;
    int last_class = have_starter ? 0 : 256;
    std::size_t out = 1;
    for (std::size_t i = 1; i < d.size(); ++i) {
      char32_t c = d[i];
      int cls = ccc_of(c);
      // last_class == 0 means the starter is the character just before: nothing blocks.
      char32_t composite = 0;
      if (have_starter && !is_raw_byte(c) && !is_raw_byte(d[starter]) && (last_class < cls || last_class == 0))
        composite = compose(d[starter], c);
      if (composite != 0) {
        d[starter] = composite;
        continue;
      }
      if (cls == 0) {
        starter = out;
        have_starter = true;
      }
      last_class = cls;
      d[out++] = c;
    }
    d.resize(out);
  }
  std::string result;
  result.reserve(text.size());
  for (char32_t c : d) {
    if (is_raw_byte(c))
      result += static_cast<char>(c - raw_byte_base);
    else
      append_utf8(result, c);
  }
  return result;
}

const char* data_source() noexcept { return ud::source; }

} // namespace crucible::policy::unicode
