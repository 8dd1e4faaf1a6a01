// storage/code_similarity.cpp: a small tokeniser for Python sources with inline C++/CUDA, and
// Jaccard similarity over token 3-shingles (hacking-case retrieval in the replay store).
#include "storage/code_similarity.hpp"

#include <algorithm>
#include <cassert>
#include <string>

namespace crucible::storage {
namespace {

bool ident_start(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;  // UTF-8 identifiers stay whole
}
bool ident_char(char c) noexcept { return ident_start(c) || (c >= '0' && c <= '9'); }
bool digit(char c) noexcept { return c >= '0' && c <= '9'; }
bool space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

} // namespace

std::vector<std::string_view> code_tokens(std::string_view code) {
  std::vector<std::string_view> out;
  out.reserve(code.size() / 4);
  const std::size_t n = code.size();
  std::size_t i = 0;
  std::string_view delim;  // the open string literal's delimiter; empty outside strings
  auto starts = [&](std::size_t at, std::string_view s) { return code.substr(at, s.size()) == s; };
  // A single-quoted string ends at its delimiter or at the end of the line (unterminated).
  auto line_string = [&] { return delim.size() == 1; };
  while (i < n) {
    const char c = code[i];
    if (!delim.empty()) {
      if (starts(i, delim)) {
        out.push_back(code.substr(i, delim.size()));
        i += delim.size();
        delim = {};
        continue;
      }
      if (c == '\n' && line_string()) {
        delim = {};
        ++i;
        continue;
      }
      if (c == '\\' && i + 1 < n) {
        out.push_back(code.substr(i, 2));
        i += 2;
        continue;
      }
      // C comments inside the string; they end early at the string's delimiter, so a comment
      // cannot swallow the rest of the file.
      if (starts(i, "//")) {
        while (i < n && code[i] != '\n' && !starts(i, delim)) ++i;
        continue;
      }
      if (starts(i, "/*")) {
        i += 2;
        while (i < n && !starts(i, "*/") && !starts(i, delim)) ++i;
        if (starts(i, "*/")) i += 2;
        continue;
      }
    } else {
      if (c == '#') {
        while (i < n && code[i] != '\n') ++i;
        continue;
      }
      if (c == '"' || c == '\'') {
        const std::size_t len = starts(i, std::string(3, c)) ? 3 : 1;
        delim = code.substr(i, len);
        out.push_back(delim);
        i += len;
        continue;
      }
    }
    if (space(c)) {
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    if (ident_start(c)) {
      while (j < n && ident_char(code[j])) ++j;
    } else if (digit(c) || (c == '.' && j < n && digit(code[j]))) {
      while (j < n && (ident_char(code[j]) || code[j] == '.')) ++j;  // 1.5e3f, 0x1F, 2.
    }
    out.push_back(code.substr(i, j - i));
    i = j;
  }
  return out;
}

std::vector<std::uint64_t> shingle_set(std::string_view code, std::size_t n) {
  assert(n >= 1);
  const auto tokens = code_tokens(code);
  std::vector<std::uint64_t> out;
  if (tokens.empty()) return out;
  const std::size_t windows = tokens.size() >= n ? tokens.size() - n + 1 : 1;
  const std::size_t width = std::min(n, tokens.size());
  out.reserve(windows);
  for (std::size_t w = 0; w < windows; ++w) {
    std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the tokens, 0x1f between them
    for (std::size_t t = w; t < w + width; ++t) {
      for (unsigned char ch : tokens[t]) {
        h ^= ch;
        h *= 0x100000001b3ULL;
      }
      h ^= 0x1f;
      h *= 0x100000001b3ULL;
    }
    out.push_back(h);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

double jaccard(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b) noexcept {
  if (a.empty() && b.empty()) return 1.0;
  std::size_t i = 0, j = 0, common = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) ++i;
    else if (b[j] < a[i]) ++j;
    else {
      ++common;
      ++i;
      ++j;
    }
  }
  const std::size_t unite = a.size() + b.size() - common;
  return static_cast<double>(common) / static_cast<double>(unite);
}

} // namespace crucible::storage
