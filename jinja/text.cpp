// jinja/text.cpp: Python's str semantics on UTF-8 text for the Jinja subset: code points, strip,
// split, replace, case, repr() of str and float, float() and int() of str. Strings in from the
// lexer and the evaluator, strings out.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/utf8.hpp"
#include "jinja/detail.hpp"

namespace crucible::jinja {

std::string python_float_repr(double d) {
  if (std::isnan(d))
    return "nan";
  if (std::isinf(d))
    return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: exponent form when the decimal point
  // would sit before -4 or after 16 digits.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, end);
  bool neg = sci[0] == '-';
  std::string body = neg ? sci.substr(1) : sci;
  auto epos = body.find('e');
  std::string mant = body.substr(0, epos);
  int exp = std::stoi(body.substr(epos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.')
      digits += c;
  while (digits.size() > 1 && digits.back() == '0')
    digits.pop_back();
  int decpt = exp + 1; // digits d1d2... mean 0.d1d2... × 10^decpt
  std::string out;
  if (d == 0) {
    out = "0.0";
  } else if (decpt > 16 || decpt < -3) {
    out = digits.substr(0, 1);
    if (digits.size() > 1)
      out += "." + digits.substr(1);
    int e = decpt - 1;
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    out += eb;
  } else if (decpt <= 0) {
    out = "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
  } else if (static_cast<std::size_t>(decpt) >= digits.size()) {
    out = digits + std::string(static_cast<std::size_t>(decpt) - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<std::size_t>(decpt)) + "." + digits.substr(static_cast<std::size_t>(decpt));
  }
  return neg ? "-" + out : out;
}

namespace detail {

std::vector<char32_t> code_points(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    auto c = decode_utf8(s, i);
    out.push_back(c.cp);
    i += c.len == 0 ? 1 : c.len;
  }
  return out;
}

std::string from_code_points(const std::vector<char32_t>& cps, std::size_t from, std::size_t to) {
  std::string out;
  to = std::min(to, cps.size());
  for (std::size_t i = from; i < to; ++i) {
    if (cps[i] < 0x80 || (cps[i] >= 0xD800 && cps[i] <= 0xDFFF) || cps[i] > 0x10FFFF)
      out += static_cast<char>(cps[i]);
    else
      append_utf8(out, cps[i]);
  }
  return out;
}

std::size_t code_point_count(std::string_view s) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < s.size();) {
    auto c = decode_utf8(s, i);
    i += c.len == 0 ? 1 : c.len;
    ++n;
  }
  return n;
}

std::string py_strip(std::string_view s, bool left, bool right, const std::vector<char32_t>* chars) {
  if (chars == nullptr) {
    // Whitespace: only the ends are decoded, so trimming a long message stays cheap.
    std::size_t b = 0, e = s.size();
    while (left && b < e) {
      auto c = decode_utf8(s, b);
      if (c.len == 0 || !py_isspace(c.cp))
        break;
      b += c.len;
    }
    while (right && e > b) {
      std::size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80)
        --k;
      auto c = decode_utf8(s, k);
      if (c.len == 0 || k + c.len != e || !py_isspace(c.cp))
        break;
      e = k;
    }
    return std::string{s.substr(b, e - b)};
  }
  auto cps = code_points(s);
  auto drop = [&](char32_t c) {
    return chars != nullptr ? std::find(chars->begin(), chars->end(), c) != chars->end() : py_isspace(c);
  };
  std::size_t b = 0;
  std::size_t e = cps.size();
  if (left)
    while (b < e && drop(cps[b]))
      ++b;
  if (right)
    while (e > b && drop(cps[e - 1]))
      --e;
  return from_code_points(cps, b, e);
}

std::string rstrip_ws(std::string_view s) { return py_strip(s, false, true); }

bool all_space(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    auto c = decode_utf8(s, i);
    if (c.len == 0 || !py_isspace(c.cp))
      return false;
    i += c.len;
  }
  return true;
}

std::size_t space_run(std::string_view s, std::size_t i) {
  std::size_t j = i;
  while (j < s.size()) {
    auto c = decode_utf8(s, j);
    if (c.len == 0 || !py_isspace(c.cp))
      break;
    j += c.len;
  }
  return j - i;
}

namespace {

// Characters Python's str.isprintable() rejects, as far as repr() of template data needs them:
// controls, the Latin-1 and General Punctuation spaces and format characters, private use,
// noncharacters. (Unassigned code points are not tracked; repr() of template values is rare.)
bool py_unprintable(char32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD || c == 0x1680 || (c >= 0x2000 && c <= 0x200F)
         || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF
         || (c >= 0xE000 && c <= 0xF8FF) || (c >= 0xFFF0 && c <= 0xFFFB) || (c & 0xFFFE) == 0xFFFE
         || (c >= 0xF0000);
}

} // namespace

std::string py_str_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : code_points(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (py_unprintable(c)) {
      char b[16];
      if (c <= 0xFF)
        std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      else if (c <= 0xFFFF)
        std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      else
        std::snprintf(b, sizeof b, "\\U%08x", static_cast<unsigned>(c));
      out += b;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      append_utf8(out, c);
    }
  }
  out += q;
  return out;
}

std::string ascii_case(const std::string& s, bool upper, const std::string& what) {
  std::string out = s;
  for (auto& c : out) {
    if (static_cast<unsigned char>(c) >= 0x80)
      raise_in_call(errc::unsupported, what + " of non-ASCII text is not supported");
    c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, std::int64_t count) {
  if (from.empty()) {
    // Python inserts `to` around every code point.
    auto cps = code_points(s);
    std::string out;
    std::int64_t done = 0;
    for (std::size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cps.size())
        out += from_code_points({cps[i]});
    }
    return out;
  }
  std::string out;
  std::size_t i = 0;
  std::int64_t done = 0;
  while (count < 0 || done < count) {
    auto j = s.find(from, i);
    if (j == std::string::npos)
      break;
    out.append(s, i, j - i);
    out += to;
    i = j + from.size();
    ++done;
  }
  out.append(s, i, std::string::npos);
  return out;
}

value py_split(const std::string& s, const value& sep, std::int64_t maxsplit) {
  value_list parts;
  if (sep.is_none() || sep.is_undefined()) {
    // Runs of whitespace separate; leading and trailing whitespace yields nothing.
    auto cps = code_points(s);
    std::size_t i = 0;
    std::int64_t splits = 0;
    while (i < cps.size()) {
      while (i < cps.size() && py_isspace(cps[i]))
        ++i;
      if (i >= cps.size())
        break;
      if (maxsplit >= 0 && splits >= maxsplit) {
        std::size_t e = cps.size();
        while (e > i && py_isspace(cps[e - 1]))
          --e;
        parts.emplace_back(from_code_points(cps, i, e));
        break;
      }
      std::size_t j = i;
      while (j < cps.size() && !py_isspace(cps[j]))
        ++j;
      parts.emplace_back(from_code_points(cps, i, j));
      ++splits;
      i = j;
    }
    return value{std::move(parts)};
  }
  if (!sep.is_string())
    raise_in_call(errc::invalid_arg, "must be str or None, not " + std::string{type_name(sep)});
  const auto& d = sep.as_string();
  if (d.empty())
    raise_in_call(errc::invalid_arg, "empty separator");
  std::size_t i = 0;
  std::int64_t splits = 0;
  while (maxsplit < 0 || splits < maxsplit) {
    auto j = s.find(d, i);
    if (j == std::string::npos)
      break;
    parts.emplace_back(s.substr(i, j - i));
    i = j + d.size();
    ++splits;
  }
  parts.emplace_back(s.substr(i));
  return value{std::move(parts)};
}

std::optional<double> parse_py_float(const std::string& text) {
  auto s = py_strip(text, true, true);
  std::string t;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1])))
      continue;
    t += s[i];
  }
  std::string lower = t;
  for (auto& c : lower)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string body = lower;
  double sign = 1;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    sign = body[0] == '-' ? -1 : 1;
    body = body.substr(1);
  }
  if (body == "inf" || body == "infinity")
    return sign * std::numeric_limits<double>::infinity();
  if (body == "nan")
    return std::numeric_limits<double>::quiet_NaN();
  if (body.empty() || !(std::isdigit(static_cast<unsigned char>(body[0])) || body[0] == '.'))
    return std::nullopt;
  double d = 0;
  auto [p, ec] = std::from_chars(body.data(), body.data() + body.size(), d, std::chars_format::general);
  if (ec != std::errc{} || p != body.data() + body.size())
    return std::nullopt;
  return sign * d;
}

std::optional<std::int64_t> parse_py_int(const std::string& text, int base) {
  auto s = py_strip(text, true, true);
  std::string t;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size())
      continue;
    t += s[i];
  }
  bool neg = false;
  std::size_t k = 0;
  if (!t.empty() && (t[0] == '+' || t[0] == '-')) {
    neg = t[0] == '-';
    k = 1;
  }
  if (k >= t.size())
    return std::nullopt;
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(t.data() + k, t.data() + t.size(), v, base);
  if (ec != std::errc{} || p != t.data() + t.size())
    return std::nullopt;
  return neg ? -v : v;
}

} // namespace detail

} // namespace crucible::jinja
