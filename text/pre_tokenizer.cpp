// text/pre_tokenizer.cpp: hand-written matchers for the known split regexes. Each function
// below follows its regex alternative by alternative, in order, at one position: the first
// alternative that matches wins (leftmost-first), and greedy quantifiers give back characters
// the way a backtracking engine would.
#include "text/pre_tokenizer.hpp"

#include <array>

#include "core/utf8.hpp"
#include "text/unicode.hpp"

namespace crucible::policy {

namespace {

constexpr std::string_view gpt2_regex =
  R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view qwen2_regex =
  R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view llama3_regex =
  R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

using unicode::letter;
using unicode::number;
using unicode::space;

constexpr std::uint8_t class_mask = letter | number | space;

// One character of the input: its code point, byte length and classes.
struct ch {
  char32_t cp;
  std::uint32_t len;
  std::uint8_t cls;
};

constexpr std::array<std::uint8_t, 128> ascii_classes = [] {
  std::array<std::uint8_t, 128> t{};
  for (int c = 'a'; c <= 'z'; ++c)
    t[c] = letter;
  for (int c = 'A'; c <= 'Z'; ++c)
    t[c] = letter;
  for (int c = '0'; c <= '9'; ++c)
    t[c] = number;
  for (int c : {'\t', '\n', '\v', '\f', '\r', ' '})
    t[c] = space;
  return t;
}();

inline ch at(std::string_view s, std::size_t i) noexcept {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80)
    return {b, 1, ascii_classes[b]};
  auto u = decode_utf8(s, i);
  if (u.len == 0)
    return {0xFFFD, 1, 0}; // an invalid byte: punctuation-like, one byte
  return {u.cp, u.len, static_cast<std::uint8_t>(unicode::flags(u.cp) & class_mask)};
}

inline bool is_newline(char32_t c) { return c == '\r' || c == '\n'; }
inline bool is_other(const ch& c) { return (c.cls & class_mask) == 0; }

// End of the run of characters with class `bit` that starts at i.
inline std::size_t run_end(std::string_view s, std::size_t i, std::uint8_t bit) noexcept {
  while (i < s.size()) {
    ch c = at(s, i);
    if ((c.cls & bit) == 0)
      break;
    i += c.len;
  }
  return i;
}

inline std::size_t other_run_end(std::string_view s, std::size_t i) noexcept {
  while (i < s.size()) {
    ch c = at(s, i);
    if (!is_other(c))
      break;
    i += c.len;
  }
  return i;
}

// 's|'t|'re|'ve|'m|'ll|'d at i (s[i] == '\''), case-insensitive or not; 0 if none. Under
// Oniguruma's case folding the only non-ASCII character that matches one of these letters is
// U+017F LATIN SMALL LETTER LONG S (folds to 's').
std::size_t contraction_end(std::string_view s, std::size_t i, bool ignore_case) noexcept {
  std::size_t j = i + 1;
  if (j >= s.size())
    return 0;
  auto fold = [&](const ch& c) -> char32_t {
    if (!ignore_case)
      return c.cp;
    if (c.cp >= 'A' && c.cp <= 'Z')
      return c.cp + 32;
    return c.cp == 0x17F ? U's' : c.cp;
  };
  ch c1 = at(s, j);
  char32_t l1 = fold(c1);
  if (l1 == 's' || l1 == 't' || l1 == 'm' || l1 == 'd')
    return j + c1.len;
  if (l1 == 'r' || l1 == 'v' || l1 == 'l') {
    std::size_t k = j + c1.len;
    if (k >= s.size())
      return 0;
    ch c2 = at(s, k);
    char32_t l2 = fold(c2);
    if ((l1 != 'l' && l2 == 'e') || (l1 == 'l' && l2 == 'l'))
      return k + c2.len;
  }
  return 0;
}

// \s+(?!\S) then \s+, at i (a whitespace character): the run, minus its last character when a
// non-space follows and the run has more than one character.
std::size_t space_run_end(std::string_view s, std::size_t i) noexcept {
  std::size_t last = i, j = i;
  while (j < s.size()) {
    ch c = at(s, j);
    if ((c.cls & space) == 0)
      break;
    last = j;
    j += c.len;
  }
  if (j == s.size() || last == i)
    return j;
  return last;
}

std::size_t gpt2_end(std::string_view s, std::size_t i) noexcept {
  ch c0 = at(s, i);
  if (c0.cp == '\'')
    if (std::size_t e = contraction_end(s, i, false))
      return e;
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
  std::size_t j = i;
  ch c = c0;
  if (c0.cp == ' ' && i + 1 < s.size()) {
    j = i + 1;
    c = at(s, j);
  }
  if (c0.cp != ' ' || j != i) {
    if (c.cls & letter)
      return run_end(s, j, letter);
    if (c.cls & number)
      return run_end(s, j, number);
    if (is_other(c))
      return other_run_end(s, j);
  }
  if (c0.cls & space)
    return space_run_end(s, i);
  return i + c0.len;
}

// The Qwen2 and Llama 3 patterns; `max_digits` is 1 (Qwen2) or 3 (Llama 3).
std::size_t cl100k_end(std::string_view s, std::size_t i, int max_digits) noexcept {
  ch c0 = at(s, i);
  if (c0.cp == '\'')
    if (std::size_t e = contraction_end(s, i, true))
      return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c0.cls & letter)
    return run_end(s, i + c0.len, letter);
  if ((c0.cls & number) == 0 && !is_newline(c0.cp) && i + c0.len < s.size()) {
    ch c1 = at(s, i + c0.len);
    if (c1.cls & letter)
      return run_end(s, i + c0.len + c1.len, letter);
  }
  // \p{N} or \p{N}{1,3}
  if (c0.cls & number) {
    std::size_t j = i + c0.len;
    for (int k = 1; k < max_digits && j < s.size(); ++k) {
      ch c = at(s, j);
      if ((c.cls & number) == 0)
        break;
      j += c.len;
    }
    return j;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  {
    std::size_t j = c0.cp == ' ' ? i + 1 : i;
    if (j < s.size() && is_other(at(s, j))) {
      j = other_run_end(s, j);
      while (j < s.size() && (s[j] == '\r' || s[j] == '\n'))
        ++j;
      return j;
    }
  }
  if (c0.cls & space) {
    // \s*[\r\n]+ : the whitespace run up to and including its last line break, if it has one.
    std::size_t j = i, last_newline = std::string_view::npos;
    while (j < s.size()) {
      ch c = at(s, j);
      if ((c.cls & space) == 0)
        break;
      if (is_newline(c.cp))
        last_newline = j;
      j += c.len;
    }
    if (last_newline != std::string_view::npos)
      return last_newline + 1;
    return space_run_end(s, i);
  }
  return i + c0.len;
}

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100 onwards in byte order.
struct byte_alphabet {
  std::array<char32_t, 256> to_char{};
  std::array<std::int16_t, 324> to_byte{};

  constexpr byte_alphabet() {
    for (auto& b : to_byte)
      b = -1;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[static_cast<std::size_t>(b)]] = static_cast<std::int16_t>(b);
    }
  }
};

constexpr byte_alphabet alphabet{};

} // namespace

std::string_view pattern_regex(split_pattern p) noexcept {
  switch (p) {
    case split_pattern::gpt2: return gpt2_regex;
    case split_pattern::qwen2: return qwen2_regex;
    case split_pattern::llama3: return llama3_regex;
  }
  return {};
}

std::optional<split_pattern> pattern_from_regex(std::string_view regex) noexcept {
  for (auto p : {split_pattern::gpt2, split_pattern::qwen2, split_pattern::llama3})
    if (regex == pattern_regex(p))
      return p;
  return std::nullopt;
}

const char* pattern_name(split_pattern p) noexcept {
  switch (p) {
    case split_pattern::gpt2: return "gpt2";
    case split_pattern::qwen2: return "qwen2";
    case split_pattern::llama3: return "llama3";
  }
  return "?";
}

std::size_t piece_end(split_pattern p, std::string_view text, std::size_t start) noexcept {
  switch (p) {
    case split_pattern::gpt2: return gpt2_end(text, start);
    case split_pattern::qwen2: return cl100k_end(text, start, 1);
    case split_pattern::llama3: return cl100k_end(text, start, 3);
  }
  return start + 1;
}

char32_t byte_to_char(std::uint8_t b) noexcept { return alphabet.to_char[b]; }

int char_to_byte(char32_t c) noexcept { return c < alphabet.to_byte.size() ? alphabet.to_byte[c] : -1; }

std::string bytes_to_token(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char b : raw)
    append_utf8(out, byte_to_char(static_cast<std::uint8_t>(b)));
  return out;
}

std::optional<std::string> token_to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (std::size_t i = 0; i < token.size();) {
    auto u = decode_utf8(token, i);
    if (u.len == 0)
      return std::nullopt;
    int b = char_to_byte(u.cp);
    if (b < 0)
      return std::nullopt;
    out += static_cast<char>(b);
    i += u.len;
  }
  return out;
}

} // namespace crucible::policy
