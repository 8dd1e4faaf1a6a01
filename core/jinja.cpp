// core/jinja.cpp: the Jinja2 subset of jinja.hpp: a lexer that follows jinja2's own lexer rule by
// rule (whitespace control included), a recursive-descent parser with Jinja's precedence, and a
// tree-walking evaluator with Python's value semantics. Template source in, text out.
#include "core/jinja.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>

#include "core/json_parse.hpp"
#include "core/utf8.hpp"

namespace crucible::jinja {

// -- values ----------------------------------------------------------------------------------

value value::none() {
  value v;
  v.kind_ = kind::none;
  return v;
}

value::value(bool b) : kind_(kind::boolean), b_(b), i_(b ? 1 : 0) {}
value::value(std::int64_t i) : kind_(kind::integer), i_(i) {}
value::value(double d) : kind_(kind::floating), d_(d) {}
value::value(std::string s) : kind_(kind::string), s_(std::make_shared<const std::string>(std::move(s))) {}
value::value(value_list items, bool tuple)
  : kind_(kind::list), tuple_(tuple), list_(std::make_shared<const value_list>(std::move(items))) {}
value::value(value_dict members) : kind_(kind::dict), dict_(std::make_shared<value_dict>(std::move(members))) {}

value value::make_namespace(value_dict members) {
  value v{std::move(members)};
  v.kind_ = kind::ns;
  return v;
}

value value::function(std::string name, function_type f) {
  value v;
  v.kind_ = kind::function;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<const function_type>(std::move(f));
  return v;
}

value value::from_json(const json_value& j) {
  switch (j.type()) {
    case json_value::kind::null: return none();
    case json_value::kind::boolean: return value{j.as_bool()};
    case json_value::kind::integer: return value{j.as_int()};
    case json_value::kind::real: return value{j.as_double()};
    case json_value::kind::string: return value{j.as_string()};
    case json_value::kind::array: {
      value_list items;
      for (const auto& x : j.as_array())
        items.push_back(from_json(x));
      return value{std::move(items)};
    }
    case json_value::kind::object: {
      value_dict members;
      for (const auto& m : j.as_object()) {
        // Python's dict keeps the last of duplicate keys, at the first one's position.
        auto it = std::find_if(members.begin(), members.end(), [&](const auto& p) { return p.first == m.key; });
        if (it != members.end())
          it->second = from_json(m.value);
        else
          members.emplace_back(m.key, from_json(m.value));
      }
      return value{std::move(members)};
    }
  }
  return {};
}

const value* value::find(std::string_view key) const {
  if (!is_dict())
    return nullptr;
  for (const auto& [k, v] : *dict_)
    if (k == key)
      return &v;
  return nullptr;
}

bool value::truthy() const noexcept {
  switch (kind_) {
    case kind::undefined:
    case kind::none: return false;
    case kind::boolean: return b_;
    case kind::integer: return i_ != 0;
    case kind::floating: return d_ != 0;
    case kind::string: return !s_->empty();
    case kind::list: return !list_->empty();
    case kind::dict: return !dict_->empty();
    case kind::ns:
    case kind::function: return true;
  }
  return false;
}

namespace {

// -- text helpers ----------------------------------------------------------------------------

// Python's str.isspace() (and the `\s` of its str regexes).
bool py_isspace(char32_t c) noexcept {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680
         || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Code points of UTF-8 text; an invalid byte stands for itself (as U+DC80.. would in Python, close
// enough for lengths and slices of text that is valid in practice).
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

std::string from_code_points(const std::vector<char32_t>& cps, std::size_t from = 0,
                             std::size_t to = std::string::npos) {
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

// Python's str.strip() family with the default (whitespace) or a set of characters.
std::string py_strip(std::string_view s, bool left, bool right, const std::vector<char32_t>* chars = nullptr) {
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

// Length of the Python-whitespace run at s[i...].
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

} // namespace

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

// An error raised while parsing or rendering: unwinds the interpreter to program::parse/render,
// which turn it into a result. Exceptions keep the recursive evaluator free of error plumbing.
struct template_error {
  errc code;
  std::size_t pos;
  std::string message;
};

[[noreturn]] void raise(errc code, std::size_t pos, std::string message) {
  throw template_error{code, pos, std::move(message)};
}

// -- lexer -----------------------------------------------------------------------------------

enum class tok : std::uint8_t {
  data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof,
};

struct token {
  tok type;
  std::string text; // data, name, op text, decoded string literal, number text
  std::size_t pos;
};

class lexer {
public:
  explicit lexer(const std::string& src) : s_(src) {}

  std::vector<token> run() {
    std::size_t pos = 0;
    bool line_starting = true;
    while (pos < s_.size()) {
      auto tag = find_tag(pos);
      if (tag == std::string::npos) {
        out_.push_back({tok::data, s_.substr(pos), pos});
        break;
      }
      char kind = s_[tag + 1];
      std::size_t after = tag + 2;
      char sign = after < s_.size() && (s_[after] == '-' || s_[after] == '+') ? s_[after] : '\0';
      std::string text = s_.substr(pos, tag - pos);
      // A raw block is matched before the plain block tag, as in jinja2's root rule.
      std::size_t raw_end = kind == '%' ? match_raw_begin(tag) : std::string::npos;
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: whitespace between the line start and a block or comment tag goes.
        auto nl = text.rfind('\n');
        std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_space(std::string_view{text}.substr(l_pos)))
          text.resize(l_pos);
      }
      if (!text.empty())
        out_.push_back({tok::data, std::move(text), pos});
      if (raw_end != std::string::npos) {
        pos = lex_raw(raw_end, line_starting);
        continue;
      }
      std::size_t body = after + (sign != '\0' ? 1 : 0);
      if (kind == '#') {
        pos = lex_comment(tag, body, line_starting);
      } else {
        pos = lex_tag(kind == '{' ? tok::var_begin : tok::block_begin, tag, body, line_starting);
      }
    }
    out_.push_back({tok::eof, "", s_.size()});
    return std::move(out_);
  }

private:
  std::size_t find_tag(std::size_t from) const {
    for (auto i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1))
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#'))
        return i;
    return std::string::npos;
  }

  bool at(std::size_t i, std::string_view what) const { return s_.compare(i, what.size(), what) == 0; }

  // `{%(-|+|)\s*raw\s*(-%}\s*|%})` at `tag`: the position after it, or npos.
  std::size_t match_raw_begin(std::size_t tag) const {
    std::size_t i = tag + 2;
    if (i < s_.size() && (s_[i] == '-' || s_[i] == '+'))
      ++i;
    i += space_run(s_, i);
    if (!at(i, "raw"))
      return std::string::npos;
    i += 3;
    i += space_run(s_, i);
    if (at(i, "-%}"))
      return i + 3 + space_run(s_, i + 3);
    if (at(i, "%}"))
      return i + 2;
    return std::string::npos;
  }

  // Raw text up to `{%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?)`, with the same lstrip rules.
  std::size_t lex_raw(std::size_t from, bool& line_starting) {
    for (auto i = s_.find("{%", from); i != std::string::npos; i = s_.find("{%", i + 1)) {
      std::size_t j = i + 2;
      char sign = j < s_.size() && (s_[j] == '-' || s_[j] == '+') ? s_[j] : '\0';
      if (sign)
        ++j;
      j += space_run(s_, j);
      if (!at(j, "endraw"))
        continue;
      j += 6;
      j += space_run(s_, j);
      std::size_t end;
      if (at(j, "+%}"))
        end = j + 3;
      else if (at(j, "-%}"))
        end = j + 3 + space_run(s_, j + 3);
      else if (at(j, "%}"))
        end = j + 2 + (at(j + 2, "\n") ? 1 : 0);
      else
        continue;
      std::string text = s_.substr(from, i - from);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+') {
        auto nl = text.rfind('\n');
        std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        // line_starting is that of the raw begin tag's match, which never ends in a newline.
        if (l_pos > 0 && l_pos < text.size() && all_space(std::string_view{text}.substr(l_pos)))
          text.resize(l_pos);
      }
      if (!text.empty())
        out_.push_back({tok::data, std::move(text), from});
      line_starting = end > 0 && s_[end - 1] == '\n';
      return end;
    }
    raise(errc::invalid_arg, from, "missing end of raw directive");
  }

  std::size_t lex_comment(std::size_t tag, std::size_t from, bool& line_starting) {
    for (std::size_t i = from; i < s_.size(); ++i) {
      std::size_t end = std::string::npos;
      if (at(i, "+#}"))
        end = i + 3;
      else if (at(i, "-#}"))
        end = i + 3 + space_run(s_, i + 3);
      else if (at(i, "#}"))
        end = i + 2 + (at(i + 2, "\n") ? 1 : 0);
      if (end != std::string::npos) {
        line_starting = s_[end - 1] == '\n';
        return end;
      }
    }
    raise(errc::invalid_arg, tag, "missing end of comment tag");
  }

  // Tokens of one `{{ }}` or `{% %}` tag; returns the position after its end.
  std::size_t lex_tag(tok begin, std::size_t tag, std::size_t i, bool& line_starting) {
    out_.push_back({begin, "", tag});
    std::vector<char> balance;
    const bool block = begin == tok::block_begin;
    while (true) {
      if (i >= s_.size())
        raise(errc::invalid_arg, tag, block ? "unexpected end of template: block tag not closed with '%}'"
                                            : "unexpected end of template: expression not closed with '}}'");
      if (balance.empty()) {
        std::size_t end = std::string::npos;
        if (block) {
          if (at(i, "+%}"))
            end = i + 3;
          else if (at(i, "-%}"))
            end = i + 3 + space_run(s_, i + 3);
          else if (at(i, "%}"))
            end = i + 2 + (at(i + 2, "\n") ? 1 : 0);
        } else {
          if (at(i, "-}}"))
            end = i + 3 + space_run(s_, i + 3);
          else if (at(i, "}}"))
            end = i + 2;
        }
        if (end != std::string::npos) {
          out_.push_back({block ? tok::block_end : tok::var_end, "", i});
          line_starting = s_[end - 1] == '\n';
          return end;
        }
      }
      if (auto n = space_run(s_, i); n > 0) {
        i += n;
        continue;
      }
      unsigned char c = static_cast<unsigned char>(s_[i]);
      if (std::isdigit(c)) {
        i = lex_number(i);
        continue;
      }
      if (std::isalpha(c) || c == '_') {
        std::size_t j = i;
        while (j < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[j])) || s_[j] == '_'))
          ++j;
        out_.push_back({tok::name, s_.substr(i, j - i), i});
        i = j;
        continue;
      }
      if (c == '\'' || c == '"') {
        i = lex_string(i);
        continue;
      }
      static const char* const ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                        "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
      bool matched = false;
      for (const char* op : ops) {
        if (at(i, op)) {
          std::string o = op;
          if (o == "(" || o == "[" || o == "{") {
            balance.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
          } else if (o == ")" || o == "]" || o == "}") {
            if (balance.empty())
              raise(errc::invalid_arg, i, "unexpected '" + o + "'");
            if (balance.back() != o[0])
              raise(errc::invalid_arg, i, "unexpected '" + o + "', expected '" + std::string(1, balance.back()) + "'");
            balance.pop_back();
          }
          out_.push_back({tok::op, o, i});
          i += o.size();
          matched = true;
          break;
        }
      }
      if (!matched)
        raise(errc::invalid_arg, i, std::string{"unexpected char '"} + s_[i] + "'");
    }
  }

  // Jinja's integer_re and float_re (underscores allowed between digits; 0b/0o/0x prefixes).
  std::size_t lex_number(std::size_t i) {
    auto digits = [&](std::size_t j, auto is_digit) {
      // (\d+_)*\d+ : returns the end, or j when no digit
      std::size_t k = j;
      while (k < s_.size() && is_digit(s_[k])) {
        ++k;
        if (k + 1 < s_.size() && s_[k] == '_' && is_digit(s_[k + 1]))
          ++k;
      }
      return k;
    };
    auto dec = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
    std::size_t int_end = digits(i, dec);
    // float: digits ( (.digits)? e[+-]?digits | .digits )
    std::size_t j = int_end;
    bool is_float = false;
    if (j < s_.size() && s_[j] == '.' && j + 1 < s_.size() && dec(s_[j + 1])) {
      j = digits(j + 1, dec);
      is_float = true;
    }
    if (j < s_.size() && (s_[j] == 'e' || s_[j] == 'E')) {
      std::size_t k = j + 1;
      if (k < s_.size() && (s_[k] == '+' || s_[k] == '-'))
        ++k;
      if (k < s_.size() && dec(s_[k])) {
        j = digits(k, dec);
        is_float = true;
      }
    }
    if (is_float) {
      std::string t;
      for (std::size_t k = i; k < j; ++k)
        if (s_[k] != '_')
          t += s_[k];
      out_.push_back({tok::floating, t, i});
      return j;
    }
    if (s_[i] == '0' && i + 1 < s_.size() && std::strchr("bBoOxX", s_[i + 1]) != nullptr && s_[i + 1] != '\0') {
      char p = static_cast<char>(std::tolower(static_cast<unsigned char>(s_[i + 1])));
      int base = p == 'b' ? 2 : p == 'o' ? 8 : 16;
      auto ok = [base](char c) {
        int v = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                : std::isxdigit(static_cast<unsigned char>(c)) ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                                                               : 99;
        return v < base;
      };
      std::size_t k = i + 2;
      std::string t;
      while (k < s_.size() && (ok(s_[k]) || (s_[k] == '_' && k + 1 < s_.size() && ok(s_[k + 1])))) {
        if (s_[k] != '_')
          t += s_[k];
        ++k;
      }
      if (!t.empty()) {
        std::int64_t v = 0;
        auto [p2, ec] = std::from_chars(t.data(), t.data() + t.size(), v, base);
        if (ec != std::errc{})
          raise(errc::unsupported, i, "integer literal too large (only 64-bit integers are supported)");
        out_.push_back({tok::integer, std::to_string(v), i});
        return k;
      }
    }
    // Decimal: [1-9](_?\d)* or 0(_?0)*
    std::string t;
    std::size_t k = i;
    if (s_[i] == '0') {
      t = "0";
      ++k;
      while (k < s_.size() && (s_[k] == '0' || (s_[k] == '_' && k + 1 < s_.size() && s_[k + 1] == '0')))
        ++k;
    } else {
      for (k = i; k < int_end; ++k)
        if (s_[k] != '_')
          t += s_[k];
    }
    out_.push_back({tok::integer, t, i});
    return k;
  }

  // A string literal, decoded as jinja2 does: newlines normalised, then Python's
  // "unicode-escape" codec over the text with non-ASCII characters kept.
  std::size_t lex_string(std::size_t i) {
    char q = s_[i];
    std::size_t j = i + 1;
    std::string raw;
    while (true) {
      if (j >= s_.size())
        raise(errc::invalid_arg, i, "unterminated string literal");
      if (s_[j] == '\\' && j + 1 < s_.size()) {
        raw += s_[j];
        raw += s_[j + 1];
        j += 2;
        continue;
      }
      if (s_[j] == q)
        break;
      raw += s_[j++];
    }
    out_.push_back({tok::string, unescape(raw, i), i});
    return j + 1;
  }

  static std::string unescape(const std::string& raw, std::size_t pos) {
    std::string out;
    for (std::size_t k = 0; k < raw.size(); ++k) {
      char c = raw[k];
      if (c != '\\' || k + 1 >= raw.size()) {
        out += c;
        continue;
      }
      char e = raw[++k];
      auto hex = [&](std::size_t n) {
        std::uint32_t v = 0;
        for (std::size_t m = 1; m <= n; ++m) {
          if (k + m >= raw.size() || !std::isxdigit(static_cast<unsigned char>(raw[k + m])))
            raise(errc::invalid_arg, pos, "truncated \\x, \\u or \\U escape in string literal");
          char h = static_cast<char>(std::tolower(static_cast<unsigned char>(raw[k + m])));
          v = v * 16 + static_cast<std::uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : h - 'a' + 10);
        }
        k += n;
        return v;
      };
      switch (e) {
        case '\n': break; // line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': append_cp(out, hex(2), pos); break;
        case 'u': append_cp(out, hex(4), pos); break;
        case 'U': append_cp(out, hex(8), pos); break;
        case 'N': raise(errc::unsupported, pos, "\\N{...} escapes in string literals are not supported");
        default:
          if (e >= '0' && e <= '7') {
            std::uint32_t v = static_cast<std::uint32_t>(e - '0');
            for (int m = 0; m < 2 && k + 1 < raw.size() && raw[k + 1] >= '0' && raw[k + 1] <= '7'; ++m)
              v = v * 8 + static_cast<std::uint32_t>(raw[++k] - '0');
            append_cp(out, v, pos);
          } else if (static_cast<unsigned char>(e) >= 0x80) {
            raise(errc::unsupported, pos, "a backslash before a non-ASCII character in a string literal is not supported");
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    return out;
  }

  static void append_cp(std::string& out, std::uint32_t cp, std::size_t pos) {
    if (cp > 0x10FFFF)
      raise(errc::invalid_arg, pos, "escape beyond U+10FFFF in string literal");
    if (cp >= 0xD800 && cp <= 0xDFFF)
      raise(errc::unsupported, pos, "surrogate escapes in string literals are not supported");
    append_utf8(out, cp);
  }

  const std::string& s_;
  std::vector<token> out_;
};

// -- syntax tree -----------------------------------------------------------------------------

struct expr;
using expr_ptr = std::unique_ptr<expr>;

struct expr {
  enum class op : std::uint8_t {
    literal, name, getattr, getitem, slice, call, filter, test, not_, neg, pos, binary, compare, and_, or_, cond,
    list, tuple, dict, concat,
  };
  op kind;
  std::size_t pos;
  value lit;                  // literal
  std::string name;           // name, attribute, filter or test name, binary operator
  std::vector<expr_ptr> args; // operands; slice: start, stop, step (null when absent)
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
  std::vector<std::string> ops; // compare: operators between args
};

expr_ptr make(expr::op k, std::size_t pos) {
  auto e = std::make_unique<expr>();
  e->kind = k;
  e->pos = pos;
  return e;
}

struct node;
using body = std::vector<node>;

struct node {
  enum class kind : std::uint8_t { text, output, if_, for_, set, set_block, break_, continue_, block };
  kind k;
  std::size_t pos;
  std::string text;
  expr_ptr e;                                   // output, set value, for iterable
  std::vector<std::pair<expr_ptr, body>> branches; // if/elif (test, body); else is a null test
  body inner;                                   // for body, set block body, generation body
  body otherwise;                               // for else
  std::vector<std::string> targets;             // for/set names (one, or a tuple)
  bool tuple_target = false;
  std::string ns_attr;                          // set ns.attr = ...: targets[0] is the namespace
  expr_ptr loop_filter;                         // for ... if cond
};

// The filters and tests jinja2 defines: anything else is a syntax error there (TemplateAssertionError
// at compile time), and here.
const std::set<std::string, std::less<>> jinja_filters = {
  "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
  "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent", "int", "items", "join",
  "last", "length", "list", "lower", "map", "max", "min", "pprint", "random", "reject", "rejectattr",
  "replace", "reverse", "round", "safe", "select", "selectattr", "slice", "sort", "string", "striptags",
  "sum", "title", "tojson", "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount",
  "wordwrap", "xmlattr"};
const std::set<std::string, std::less<>> jinja_tests = {
  "odd", "even", "divisibleby", "defined", "undefined", "filter", "test", "none", "boolean", "false", "true",
  "integer", "float", "lower", "upper", "string", "mapping", "number", "sequence", "iterable", "callable",
  "sameas", "escaped", "in", "==", "eq", "equalto", "!=", "ne", ">", "gt", "greaterthan", "ge", ">=", "<",
  "lt", "lessthan", "<=", "le"};

// -- parser ----------------------------------------------------------------------------------

class parser {
public:
  explicit parser(std::vector<token> toks) : t_(std::move(toks)) {}

  body parse_template() {
    auto b = parse_body({});
    if (cur().type != tok::eof)
      raise(errc::invalid_arg, cur().pos, "unexpected tag");
    return b;
  }

private:
  const token& cur() const { return t_[i_]; }
  const token& look(std::size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size())
      ++i_;
  }
  bool is_op(std::string_view o) const { return cur().type == tok::op && cur().text == o; }
  bool is_name(std::string_view n) const { return cur().type == tok::name && cur().text == n; }
  bool skip_op(std::string_view o) {
    if (!is_op(o))
      return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n))
      return false;
    next();
    return true;
  }
  static std::string describe(const token& t) {
    switch (t.type) {
      case tok::eof: return "end of template";
      case tok::block_end: return "end of statement block";
      case tok::var_end: return "end of print statement";
      case tok::data: return "template data";
      case tok::string: return "string";
      case tok::integer:
      case tok::floating: return "number " + t.text;
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(std::string_view o) {
    if (!skip_op(o))
      raise(errc::invalid_arg, cur().pos, "expected '" + std::string{o} + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != tok::name)
      raise(errc::invalid_arg, cur().pos, "expected a name, got " + describe(cur()));
    auto n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != tok::block_end)
      raise(errc::invalid_arg, cur().pos, "expected end of statement block, got " + describe(cur()));
    next();
  }

  // Statements until a block tag whose keyword is in `ends` (left unconsumed, positioned at the
  // keyword), or the end of the template.
  body parse_body(const std::vector<std::string_view>& ends) {
    body out;
    while (true) {
      const auto& t = cur();
      if (t.type == tok::eof) {
        if (!ends.empty()) {
          std::string want;
          for (auto e : ends)
            want += (want.empty() ? "'" : " or '") + std::string{e} + "'";
          raise(errc::invalid_arg, t.pos, "unexpected end of template, expected " + want);
        }
        return out;
      }
      if (t.type == tok::data) {
        out.push_back(node{node::kind::text, t.pos, t.text, {}, {}, {}, {}, {}, false, {}, {}});
        next();
        continue;
      }
      if (t.type == tok::var_begin) {
        auto pos = t.pos;
        next();
        auto e = parse_tuple(true, {});
        if (cur().type != tok::var_end)
          raise(errc::invalid_arg, cur().pos, "expected end of print statement, got " + describe(cur()));
        next();
        node n{node::kind::output, pos, {}, std::move(e), {}, {}, {}, {}, false, {}, {}};
        out.push_back(std::move(n));
        continue;
      }
      if (t.type == tok::block_begin) {
        const auto& kw = look();
        if (kw.type == tok::name && std::find(ends.begin(), ends.end(), kw.text) != ends.end()) {
          next(); // at the keyword
          return out;
        }
        next();
        out.push_back(parse_statement(t.pos));
        continue;
      }
      raise(errc::invalid_arg, t.pos, "unexpected " + describe(t));
    }
  }

  node parse_statement(std::size_t pos) {
    if (cur().type != tok::name)
      raise(errc::invalid_arg, cur().pos, "tag name expected");
    auto kw = cur().text;
    auto kw_pos = cur().pos;
    next();
    if (kw == "if")
      return parse_if(pos);
    if (kw == "for")
      return parse_for(pos);
    if (kw == "set")
      return parse_set(pos);
    if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0)
        raise(errc::invalid_arg, kw_pos, "'" + kw + "' outside of a loop");
      expect_block_end();
      return node{kw == "break" ? node::kind::break_ : node::kind::continue_, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
    }
    if (kw == "generation") {
      // transformers' AssistantTracker: renders its body unchanged.
      expect_block_end();
      node n{node::kind::block, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
      n.inner = parse_body({"endgeneration"});
      next();
      expect_block_end();
      return n;
    }
    static const std::set<std::string, std::less<>> known = {
      "macro", "call", "filter", "include", "import", "from", "extends", "block", "with", "autoescape", "do", "raw"};
    if (known.count(kw) != 0)
      raise(errc::unsupported, kw_pos, "the '" + kw + "' statement is not supported");
    raise(errc::invalid_arg, kw_pos, "unknown tag '" + kw + "'");
  }

  node parse_if(std::size_t pos) {
    node n{node::kind::if_, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
    auto test = parse_tuple(false, {});
    expect_block_end();
    while (true) {
      auto b = parse_body({"elif", "else", "endif"});
      n.branches.emplace_back(std::move(test), std::move(b));
      auto kw = cur().text;
      next();
      if (kw == "elif") {
        test = parse_tuple(false, {});
        expect_block_end();
        continue;
      }
      if (kw == "else") {
        expect_block_end();
        auto eb = parse_body({"endif"});
        next();
        n.branches.emplace_back(nullptr, std::move(eb));
      }
      expect_block_end();
      return n;
    }
  }

  // Names, or a tuple of names, before `in` / `=`.
  void parse_targets(node& n, bool allow_namespace) {
    auto first_pos = cur().pos;
    bool paren = skip_op("(");
    n.targets.push_back(expect_name());
    if (allow_namespace && !paren && is_op(".")) {
      next();
      n.ns_attr = expect_name();
      return;
    }
    while (skip_op(",")) {
      n.tuple_target = true;
      if (cur().type != tok::name)
        break;
      n.targets.push_back(expect_name());
    }
    if (paren) {
      n.tuple_target = true;
      expect_op(")");
    }
    if (n.targets.empty())
      raise(errc::invalid_arg, first_pos, "expected an assignment target");
    for (const auto& name : n.targets)
      if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" || name == "None")
        raise(errc::invalid_arg, first_pos, "cannot assign to '" + name + "'");
  }

  node parse_for(std::size_t pos) {
    node n{node::kind::for_, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
    parse_targets(n, false);
    if (!skip_name("in"))
      raise(errc::invalid_arg, cur().pos, "expected 'in', got " + describe(cur()));
    n.e = parse_tuple(false, {"recursive"});
    if (skip_name("if"))
      n.loop_filter = parse_expression(true);
    if (is_name("recursive"))
      raise(errc::unsupported, cur().pos, "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    n.inner = parse_body({"endfor", "else"});
    --loop_depth_;
    if (cur().text == "else") {
      next();
      expect_block_end();
      n.otherwise = parse_body({"endfor"});
    }
    next();
    expect_block_end();
    return n;
  }

  node parse_set(std::size_t pos) {
    node n{node::kind::set, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
    parse_targets(n, true);
    if (skip_op("=")) {
      n.e = parse_tuple(true, {});
      expect_block_end();
      return n;
    }
    if (is_op("|"))
      raise(errc::unsupported, cur().pos, "filters on a block assignment are not supported");
    if (!n.ns_attr.empty() || n.tuple_target)
      raise(errc::invalid_arg, cur().pos, "expected '=' in an assignment to an attribute or a tuple");
    expect_block_end();
    n.k = node::kind::set_block;
    n.inner = parse_body({"endset"});
    next();
    expect_block_end();
    return n;
  }

  bool tuple_end(const std::vector<std::string_view>& extra) const {
    const auto& t = cur();
    if (t.type == tok::var_end || t.type == tok::block_end || t.type == tok::eof)
      return true;
    if (t.type == tok::op && t.text == ")")
      return true;
    if (t.type == tok::name)
      for (auto e : extra)
        if (t.text == e)
          return true;
    return false;
  }

  expr_ptr parse_tuple(bool with_condexpr, const std::vector<std::string_view>& extra, bool explicit_parens = false) {
    auto pos = cur().pos;
    std::vector<expr_ptr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty())
        expect_op(",");
      if (tuple_end(extra))
        break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty())
        return std::move(items[0]);
      if (!explicit_parens)
        raise(errc::invalid_arg, cur().pos, "expected an expression, got " + describe(cur()));
    }
    auto e = make(expr::op::tuple, pos);
    e->args = std::move(items);
    return e;
  }

  expr_ptr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  expr_ptr parse_condexpr() {
    auto e1 = parse_or();
    while (is_name("if")) {
      auto pos = cur().pos;
      next();
      auto e2 = parse_or();
      expr_ptr e3;
      if (skip_name("else"))
        e3 = parse_condexpr();
      auto c = make(expr::op::cond, pos);
      c->args.push_back(std::move(e2)); // test
      c->args.push_back(std::move(e1)); // then
      c->args.push_back(std::move(e3)); // else (may be null)
      e1 = std::move(c);
    }
    return e1;
  }

  expr_ptr parse_or() {
    auto left = parse_and();
    while (is_name("or")) {
      auto pos = cur().pos;
      next();
      auto e = make(expr::op::or_, pos);
      e->args.push_back(std::move(left));
      e->args.push_back(parse_and());
      left = std::move(e);
    }
    return left;
  }

  expr_ptr parse_and() {
    auto left = parse_not();
    while (is_name("and")) {
      auto pos = cur().pos;
      next();
      auto e = make(expr::op::and_, pos);
      e->args.push_back(std::move(left));
      e->args.push_back(parse_not());
      left = std::move(e);
    }
    return left;
  }

  expr_ptr parse_not() {
    if (is_name("not")) {
      auto pos = cur().pos;
      next();
      auto e = make(expr::op::not_, pos);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  expr_ptr parse_compare() {
    auto pos = cur().pos;
    auto first = parse_math1();
    std::vector<std::string> ops;
    std::vector<expr_ptr> operands;
    while (true) {
      if (cur().type == tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        ops.push_back(cur().text);
        next();
      } else if (is_name("in")) {
        ops.emplace_back("in");
        next();
      } else if (is_name("not") && look().type == tok::name && look().text == "in") {
        ops.emplace_back("not in");
        next();
        next();
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty())
      return first;
    auto e = make(expr::op::compare, pos);
    e->args.push_back(std::move(first));
    for (auto& o : operands)
      e->args.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  expr_ptr binary(std::string op, std::size_t pos, expr_ptr l, expr_ptr r) {
    auto e = make(expr::op::binary, pos);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  expr_ptr parse_math1() {
    auto left = parse_concat();
    while (is_op("+") || is_op("-")) {
      auto op = cur().text;
      auto pos = cur().pos;
      next();
      left = binary(op, pos, std::move(left), parse_concat());
    }
    return left;
  }

  expr_ptr parse_concat() {
    auto pos = cur().pos;
    auto first = parse_math2();
    if (!is_op("~"))
      return first;
    auto e = make(expr::op::concat, pos);
    e->args.push_back(std::move(first));
    while (skip_op("~"))
      e->args.push_back(parse_math2());
    return e;
  }

  expr_ptr parse_math2() {
    auto left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      auto op = cur().text;
      auto pos = cur().pos;
      next();
      left = binary(op, pos, std::move(left), parse_pow());
    }
    return left;
  }

  expr_ptr parse_pow() {
    auto left = parse_unary(true);
    while (is_op("**")) {
      auto pos = cur().pos;
      next();
      left = binary("**", pos, std::move(left), parse_unary(true));
    }
    return left;
  }

  expr_ptr parse_unary(bool with_filter) {
    expr_ptr node;
    auto pos = cur().pos;
    if (is_op("-") || is_op("+")) {
      bool neg = cur().text == "-";
      next();
      node = make(neg ? expr::op::neg : expr::op::pos, pos);
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter)
      node = parse_filter_expr(std::move(node));
    return node;
  }

  expr_ptr parse_primary() {
    const auto& t = cur();
    auto pos = t.pos;
    switch (t.type) {
      case tok::name: {
        auto n = t.text;
        next();
        auto e = make(expr::op::literal, pos);
        if (n == "true" || n == "True") {
          e->lit = value{true};
        } else if (n == "false" || n == "False") {
          e->lit = value{false};
        } else if (n == "none" || n == "None") {
          e->lit = value::none();
        } else {
          e->kind = expr::op::name;
          e->name = n;
        }
        return e;
      }
      case tok::string: {
        std::string s;
        while (cur().type == tok::string) { // adjacent literals concatenate
          s += cur().text;
          next();
        }
        auto e = make(expr::op::literal, pos);
        e->lit = value{std::move(s)};
        return e;
      }
      case tok::integer: {
        std::int64_t v = 0;
        auto [p, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (ec != std::errc{})
          raise(errc::unsupported, pos, "integer literal too large (only 64-bit integers are supported)");
        next();
        auto e = make(expr::op::literal, pos);
        e->lit = value{v};
        return e;
      }
      case tok::floating: {
        double v = 0;
        auto [p, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (ec != std::errc{} && ec != std::errc::result_out_of_range)
          raise(errc::invalid_arg, pos, "bad float literal " + t.text);
        if (ec == std::errc::result_out_of_range)
          raise(errc::unsupported, pos, "float literal out of range: " + t.text);
        next();
        auto e = make(expr::op::literal, pos);
        e->lit = value{v};
        return e;
      }
      case tok::op:
        if (t.text == "(") {
          next();
          auto e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          next();
          auto e = make(expr::op::list, pos);
          while (!is_op("]")) {
            if (!e->args.empty())
              expect_op(",");
            if (is_op("]"))
              break;
            e->args.push_back(parse_expression(true));
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          next();
          auto e = make(expr::op::dict, pos);
          while (!is_op("}")) {
            if (!e->args.empty())
              expect_op(",");
            if (is_op("}"))
              break;
            e->args.push_back(parse_expression(true));
            expect_op(":");
            e->args.push_back(parse_expression(true));
          }
          expect_op("}");
          return e;
        }
        break;
      default: break;
    }
    raise(errc::invalid_arg, pos, "unexpected " + describe(t));
  }

  expr_ptr parse_postfix(expr_ptr node) {
    while (true) {
      if (is_op(".") || is_op("["))
        node = parse_subscript(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        return node;
    }
  }

  expr_ptr parse_filter_expr(expr_ptr node) {
    while (true) {
      if (is_op("|"))
        node = parse_filter(std::move(node));
      else if (is_name("is"))
        node = parse_test(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        return node;
    }
  }

  expr_ptr parse_subscript(expr_ptr node) {
    auto pos = cur().pos;
    if (skip_op(".")) {
      if (cur().type == tok::name) {
        auto e = make(expr::op::getattr, pos);
        e->name = cur().text;
        next();
        e->args.push_back(std::move(node));
        return e;
      }
      if (cur().type == tok::integer) {
        auto e = make(expr::op::getitem, pos);
        e->args.push_back(std::move(node));
        auto k = make(expr::op::literal, cur().pos);
        k->lit = value{static_cast<std::int64_t>(std::stoll(cur().text))};
        next();
        e->args.push_back(std::move(k));
        return e;
      }
      raise(errc::invalid_arg, cur().pos, "expected name or number after '.'");
    }
    expect_op("[");
    std::vector<expr_ptr> items;
    while (!is_op("]")) {
      if (!items.empty())
        expect_op(",");
      items.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make(expr::op::getitem, pos);
    e->args.push_back(std::move(node));
    if (items.size() == 1) {
      e->args.push_back(std::move(items[0]));
    } else {
      auto tup = make(expr::op::tuple, pos);
      tup->args = std::move(items);
      e->args.push_back(std::move(tup));
    }
    return e;
  }

  expr_ptr parse_subscribed() {
    auto pos = cur().pos;
    std::vector<expr_ptr> parts;
    if (is_op(":")) {
      next();
      parts.push_back(nullptr);
    } else {
      auto e = parse_expression(true);
      if (!is_op(":"))
        return e;
      next();
      parts.push_back(std::move(e));
    }
    if (is_op(":"))
      parts.push_back(nullptr);
    else if (!is_op("]") && !is_op(","))
      parts.push_back(parse_expression(true));
    else
      parts.push_back(nullptr);
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(","))
        parts.push_back(parse_expression(true));
      else
        parts.push_back(nullptr);
    } else {
      parts.push_back(nullptr);
    }
    auto s = make(expr::op::slice, pos);
    s->args = std::move(parts);
    return s;
  }

  void parse_call_args(expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first)
        expect_op(",");
      first = false;
      if (is_op(")"))
        break;
      if (is_op("*") || is_op("**"))
        raise(errc::unsupported, cur().pos, "*args and **kwargs in calls are not supported");
      if (cur().type == tok::name && look().type == tok::op && look().text == "=") {
        auto key = cur().text;
        next();
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty())
          raise(errc::invalid_arg, cur().pos, "positional argument after keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  expr_ptr parse_call(expr_ptr callee) {
    auto e = make(expr::op::call, callee->pos);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    auto n = expect_name();
    while (is_op(".")) {
      next();
      n += "." + expect_name();
    }
    return n;
  }

  expr_ptr parse_filter(expr_ptr node) {
    auto pos = cur().pos;
    expect_op("|");
    auto name_pos = cur().pos;
    auto name = dotted_name();
    if (jinja_filters.count(name) == 0)
      raise(errc::invalid_arg, name_pos, "no filter named '" + name + "'");
    auto e = make(expr::op::filter, pos);
    e->name = name;
    e->args.push_back(std::move(node));
    if (is_op("("))
      parse_call_args(*e);
    return e;
  }

  expr_ptr parse_test(expr_ptr node) {
    auto pos = cur().pos;
    next(); // is
    bool negated = skip_name("not");
    auto name_pos = cur().pos;
    std::string name;
    if (cur().type == tok::name)
      name = dotted_name();
    else if (cur().type == tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                       cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      // Jinja's lexer gives no name token here; `x is == y` is a syntax error there too.
      raise(errc::invalid_arg, name_pos, "expected a test name, got " + describe(cur()));
    } else {
      raise(errc::invalid_arg, name_pos, "expected a test name, got " + describe(cur()));
    }
    if (jinja_tests.count(name) == 0)
      raise(errc::invalid_arg, name_pos, "no test named '" + name + "'");
    auto e = make(expr::op::test, pos);
    e->name = name;
    e->args.push_back(std::move(node));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == tok::name || cur().type == tok::string || cur().type == tok::integer ||
                cur().type == tok::floating || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is"))
        raise(errc::invalid_arg, cur().pos, "you cannot chain multiple tests with is");
      auto arg = parse_primary();
      e->args.push_back(parse_postfix(std::move(arg)));
    }
    if (!negated)
      return e;
    auto n = make(expr::op::not_, pos);
    n->args.push_back(std::move(e));
    return n;
  }

  std::vector<token> t_;
  std::size_t i_ = 0;
  int loop_depth_ = 0;
};

// -- evaluation ------------------------------------------------------------------------------

// Python's type names, for messages that match what jinja2 would say.
const char* type_name(const value& v) {
  switch (v.type()) {
    case value::kind::undefined: return "Undefined";
    case value::kind::none: return "NoneType";
    case value::kind::boolean: return "bool";
    case value::kind::integer: return "int";
    case value::kind::floating: return "float";
    case value::kind::string: return "str";
    case value::kind::list: return v.is_tuple() ? "tuple" : "list";
    case value::kind::dict: return "dict";
    case value::kind::ns: return "Namespace";
    case value::kind::function: return "function";
  }
  return "?";
}

bool is_number(const value& v) {
  return v.type() == value::kind::integer || v.type() == value::kind::floating || v.type() == value::kind::boolean;
}
bool is_int_like(const value& v) { return v.type() == value::kind::integer || v.type() == value::kind::boolean; }

std::string repr(const value& v, std::size_t pos);

// Python's str().
std::string to_str(const value& v, std::size_t pos) {
  switch (v.type()) {
    case value::kind::undefined: return "";
    case value::kind::none: return "None";
    case value::kind::boolean: return v.as_bool() ? "True" : "False";
    case value::kind::integer: return std::to_string(v.as_int());
    case value::kind::floating: return python_float_repr(v.as_double());
    case value::kind::string: return v.as_string();
    case value::kind::list:
    case value::kind::dict: return repr(v, pos);
    case value::kind::ns:
    case value::kind::function: break;
  }
  raise(errc::unsupported, pos, std::string{"printing a "} + type_name(v) + " is not supported");
}

std::string repr(const value& v, std::size_t pos) {
  switch (v.type()) {
    case value::kind::undefined: return "Undefined";
    case value::kind::string: return py_str_repr(v.as_string());
    case value::kind::list: {
      const auto& l = v.as_list();
      std::string out = v.is_tuple() ? "(" : "[";
      for (std::size_t i = 0; i < l.size(); ++i)
        out += (i ? ", " : "") + repr(l[i], pos);
      if (v.is_tuple() && l.size() == 1)
        out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case value::kind::dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.as_dict()) {
        out += (first ? "" : ", ") + py_str_repr(k) + ": " + repr(x, pos);
        first = false;
      }
      return out + "}";
    }
    default: return to_str(v, pos);
  }
}

// json.dumps(x, ensure_ascii, indent, separators, sort_keys), as transformers' tojson calls it.
struct json_style {
  bool ensure_ascii = false;
  bool indent_set = false;
  std::string indent; // per level
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : code_points(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char b[16];
        if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
          if (c > 0xFFFF) {
            char32_t v = c - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                          static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
          } else {
            std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
          }
          out += b;
        } else if (c < 0x80) {
          out += static_cast<char>(c);
        } else {
          append_utf8(out, c);
        }
      }
    }
  }
  out += '"';
}

void to_json(std::string& out, const value& v, const json_style& st, int level, std::size_t pos) {
  auto newline = [&](int l) {
    out += '\n';
    for (int i = 0; i < l; ++i)
      out += st.indent;
  };
  switch (v.type()) {
    case value::kind::none: out += "null"; return;
    case value::kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case value::kind::integer: out += std::to_string(v.as_int()); return;
    case value::kind::floating: {
      double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float_repr(d);
      return;
    }
    case value::kind::string: json_string(out, v.as_string(), st.ensure_ascii); return;
    case value::kind::list: {
      const auto& l = v.as_list();
      if (l.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < l.size(); ++i) {
        if (i)
          out += st.item_sep;
        if (st.indent_set)
          newline(level + 1);
        to_json(out, l[i], st, level + 1, pos);
      }
      if (st.indent_set)
        newline(level);
      out += ']';
      return;
    }
    case value::kind::dict: {
      std::vector<const std::pair<std::string, value>*> members;
      for (const auto& m : v.as_dict())
        members.push_back(&m);
      if (members.empty()) {
        out += "{}";
        return;
      }
      if (st.sort_keys)
        std::stable_sort(members.begin(), members.end(), [](auto* a, auto* b) {
          return a->first < b->first; // UTF-8 byte order is code point order
        });
      out += '{';
      for (std::size_t i = 0; i < members.size(); ++i) {
        if (i)
          out += st.item_sep;
        if (st.indent_set)
          newline(level + 1);
        json_string(out, members[i]->first, st.ensure_ascii);
        out += st.key_sep;
        to_json(out, members[i]->second, st, level + 1, pos);
      }
      if (st.indent_set)
        newline(level);
      out += '}';
      return;
    }
    default: break;
  }
  raise(errc::invalid_arg, pos, std::string{"Object of type "} + type_name(v) + " is not JSON serializable");
}

bool py_equal(const value& a, const value& b);

bool py_equal(const value& a, const value& b) {
  if (is_number(a) && is_number(b)) {
    if (is_int_like(a) && is_int_like(b))
      return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.type() != b.type())
    return false;
  switch (a.type()) {
    case value::kind::undefined:
    case value::kind::none: return true;
    case value::kind::string: return a.as_string() == b.as_string();
    case value::kind::list: {
      if (a.is_tuple() != b.is_tuple())
        return false;
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.size() != y.size())
        return false;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!py_equal(x[i], y[i]))
          return false;
      return true;
    }
    case value::kind::dict: {
      const auto& x = a.as_dict();
      const auto& y = b.as_dict();
      if (x.size() != y.size())
        return false;
      for (const auto& [k, v] : x) {
        const value* w = b.find(k);
        if (w == nullptr || !py_equal(v, *w))
          return false;
      }
      return true;
    }
    case value::kind::ns: return &a.as_dict() == &b.as_dict();
    case value::kind::function: return &a.as_function() == &b.as_function();
    default: return false;
  }
}

// <0, 0, >0 for a < b, a == b, a > b; a TypeError for unorderable types.
int py_compare(const value& a, const value& b, const std::string& op, std::size_t pos) {
  if (is_number(a) && is_number(b)) {
    if (is_int_like(a) && is_int_like(b))
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    double x = a.as_double();
    double y = b.as_double();
    if (std::isnan(x) || std::isnan(y))
      raise(errc::unsupported, pos, "ordering comparisons with NaN are not supported");
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!py_equal(x[i], y[i]))
        return py_compare(x[i], y[i], op, pos);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined())
    raise(errc::invalid_arg, pos, "an undefined value cannot be compared");
  raise(errc::invalid_arg, pos, "'" + op + "' not supported between instances of '" + type_name(a) + "' and '" +
                                  type_name(b) + "'");
}

bool py_in(const value& item, const value& container, std::size_t pos) {
  switch (container.type()) {
    case value::kind::undefined: return false;
    case value::kind::string:
      if (!item.is_string())
        raise(errc::invalid_arg, pos, std::string{"'in <string>' requires string as left operand, not "} + type_name(item));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case value::kind::list:
      for (const auto& x : container.as_list())
        if (py_equal(x, item))
          return true;
      return false;
    case value::kind::dict: return item.is_string() && container.find(item.as_string()) != nullptr;
    default: break;
  }
  raise(errc::invalid_arg, pos, std::string{"argument of type '"} + type_name(container) + "' is not iterable");
}

// Checked 64-bit arithmetic: Python's integers do not overflow, ours refuse to.
std::int64_t checked(bool overflow, std::int64_t v, std::size_t pos) {
  if (overflow)
    raise(errc::unsupported, pos, "integer overflow (only 64-bit integers are supported)");
  return v;
}

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0)))
    --q;
  return q;
}

std::int64_t length_of(const value& v, std::size_t pos) {
  switch (v.type()) {
    case value::kind::undefined: return 0;
    case value::kind::string: return static_cast<std::int64_t>(code_point_count(v.as_string()));
    case value::kind::list: return static_cast<std::int64_t>(v.as_list().size());
    case value::kind::dict: return static_cast<std::int64_t>(v.as_dict().size());
    default: break;
  }
  raise(errc::invalid_arg, pos, std::string{"object of type '"} + type_name(v) + "' has no len()");
}

// What `for x in v` iterates over.
value_list iterate(const value& v, std::size_t pos) {
  switch (v.type()) {
    case value::kind::undefined: return {};
    case value::kind::list: return v.as_list();
    case value::kind::dict: {
      value_list keys;
      for (const auto& m : v.as_dict())
        keys.emplace_back(m.first);
      return keys;
    }
    case value::kind::string: {
      value_list chars;
      for (char32_t c : code_points(v.as_string()))
        chars.emplace_back(from_code_points({c}));
      return chars;
    }
    default: break;
  }
  raise(errc::invalid_arg, pos, std::string{"'"} + type_name(v) + "' object is not iterable");
}

std::size_t py_index(std::int64_t i, std::size_t n, bool& ok) {
  if (i < 0)
    i += static_cast<std::int64_t>(n);
  ok = i >= 0 && static_cast<std::size_t>(i) < n;
  return ok ? static_cast<std::size_t>(i) : 0;
}

// Python's slice.indices() and the element positions it selects.
std::vector<std::size_t> slice_positions(std::size_t n, const value& start, const value& stop, const value& step,
                                         std::size_t pos) {
  auto as_opt_int = [&](const value& v, const char* what) -> std::optional<std::int64_t> {
    if (v.is_none() || v.is_undefined())
      return std::nullopt;
    if (!is_int_like(v))
      raise(errc::invalid_arg, pos, std::string{"slice "} + what + " must be an integer or none");
    return v.as_int();
  };
  auto st = as_opt_int(step, "step").value_or(1);
  if (st == 0)
    raise(errc::invalid_arg, pos, "slice step cannot be zero");
  const auto len = static_cast<std::int64_t>(n);
  auto clamp = [&](std::optional<std::int64_t> x, std::int64_t def) {
    if (!x)
      return def;
    std::int64_t v = *x;
    if (v < 0) {
      v += len;
      if (v < 0)
        v = st < 0 ? -1 : 0;
    } else if (v >= len) {
      v = st < 0 ? len - 1 : len;
    }
    return v;
  };
  std::int64_t b = clamp(as_opt_int(start, "start"), st < 0 ? len - 1 : 0);
  std::int64_t e = clamp(as_opt_int(stop, "stop"), st < 0 ? -1 : len);
  std::vector<std::size_t> out;
  if (st > 0)
    for (std::int64_t i = b; i < e; i += st)
      out.push_back(static_cast<std::size_t>(i));
  else
    for (std::int64_t i = b; i > e; i += st)
      out.push_back(static_cast<std::size_t>(i));
  return out;
}

struct scope {
  std::unordered_map<std::string, value> vars;
  scope* parent = nullptr;
};

enum class flow : std::uint8_t { normal, break_, continue_ };

class evaluator {
public:
  evaluator(const render_options& opt, std::string& out) : opt_(opt), out_(out) {}

  flow exec(const body& b, scope& sc) {
    for (const auto& n : b) {
      auto f = exec(n, sc);
      if (f != flow::normal)
        return f;
    }
    return flow::normal;
  }

  value eval(const expr& e, scope& sc);

private:
  flow exec(const node& n, scope& sc) {
    switch (n.k) {
      case node::kind::text: out_ += n.text; return flow::normal;
      case node::kind::output: out_ += to_str(eval(*n.e, sc), n.e->pos); return flow::normal;
      case node::kind::block: return exec(n.inner, sc);
      case node::kind::break_: return flow::break_;
      case node::kind::continue_: return flow::continue_;
      case node::kind::if_:
        for (const auto& [test, b] : n.branches)
          if (!test || eval(*test, sc).truthy())
            return exec(b, sc);
        return flow::normal;
      case node::kind::set: {
        auto v = eval(*n.e, sc);
        assign(n, std::move(v), sc);
        return flow::normal;
      }
      case node::kind::set_block: {
        std::string captured;
        std::swap(captured, out_);
        auto f = exec(n.inner, sc);
        std::swap(captured, out_);
        assign(n, value{std::move(captured)}, sc);
        return f;
      }
      case node::kind::for_: return exec_for(n, sc);
    }
    return flow::normal;
  }

  void assign(const node& n, value v, scope& sc) {
    if (!n.ns_attr.empty()) {
      value* target = lookup(n.targets[0], sc);
      if (target == nullptr || target->type() != value::kind::ns)
        raise(errc::invalid_arg, n.pos, "cannot assign attribute on non-namespace object");
      auto& members = target->namespace_members();
      for (auto& [k, x] : members)
        if (k == n.ns_attr) {
          x = std::move(v);
          return;
        }
      members.emplace_back(n.ns_attr, std::move(v));
      return;
    }
    if (!n.tuple_target) {
      sc.vars[n.targets[0]] = std::move(v);
      return;
    }
    auto items = unpack(v, n.targets.size(), n.pos);
    for (std::size_t i = 0; i < items.size(); ++i)
      sc.vars[n.targets[i]] = std::move(items[i]);
  }

  static value_list unpack(const value& v, std::size_t want, std::size_t pos) {
    auto items = iterate(v, pos);
    if (items.size() != want)
      raise(errc::invalid_arg, pos, items.size() < want ? "not enough values to unpack (expected " +
                                                              std::to_string(want) + ", got " + std::to_string(items.size()) + ")"
                                                        : "too many values to unpack (expected " + std::to_string(want) + ")");
    return items;
  }

  flow exec_for(const node& n, scope& sc) {
    auto all = iterate(eval(*n.e, sc), n.e->pos);
    value_list items;
    if (n.loop_filter) {
      for (auto& x : all) {
        scope probe{{}, &sc};
        bind_targets(n, x, probe);
        if (eval(*n.loop_filter, probe).truthy())
          items.push_back(std::move(x));
      }
    } else {
      items = std::move(all);
    }
    if (items.empty())
      return exec(n.otherwise, sc);
    const auto len = static_cast<std::int64_t>(items.size());
    for (std::int64_t i = 0; i < len; ++i) {
      scope iter{{}, &sc}; // each iteration starts from the enclosing scope, as in jinja2
      bind_targets(n, items[static_cast<std::size_t>(i)], iter);
      value_dict loop{
        {"index", value{i + 1}},
        {"index0", value{i}},
        {"revindex", value{len - i}},
        {"revindex0", value{len - i - 1}},
        {"first", value{i == 0}},
        {"last", value{i == len - 1}},
        {"length", value{len}},
        {"depth", value{std::int64_t{1}}},
        {"depth0", value{std::int64_t{0}}},
        {"previtem", i > 0 ? items[static_cast<std::size_t>(i - 1)] : value{}},
        {"nextitem", i + 1 < len ? items[static_cast<std::size_t>(i + 1)] : value{}},
      };
      loop.emplace_back("cycle", value::function("loop.cycle", [i](const call_args& a) -> value {
        if (a.positional.empty())
          throw template_error{errc::invalid_arg, std::string::npos, "no items for cycling given"};
        return a.positional[static_cast<std::size_t>(i) % a.positional.size()];
      }));
      iter.vars["loop"] = value{std::move(loop)};
      auto f = exec(n.inner, iter);
      if (f == flow::break_)
        break;
    }
    return flow::normal;
  }

  void bind_targets(const node& n, const value& item, scope& sc) {
    if (!n.tuple_target) {
      sc.vars[n.targets[0]] = item;
      return;
    }
    auto parts = unpack(item, n.targets.size(), n.pos);
    for (std::size_t k = 0; k < parts.size(); ++k)
      sc.vars[n.targets[k]] = std::move(parts[k]);
  }

  static value* lookup(const std::string& name, scope& sc) {
    for (scope* s = &sc; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end())
        return &it->second;
    }
    return nullptr;
  }

public:
  value global(const std::string& name);
  value get_attr(const value& obj, const std::string& name, std::size_t pos);
  value get_item(const value& obj, const value& key, std::size_t pos);
  value method(const value& obj, const std::string& name, std::size_t pos);
  value call(const value& fn, call_args args, std::size_t pos);
  value filter(const expr& e, scope& sc);
  bool test(const std::string& name, const value& v, const std::vector<value>& args, std::size_t pos);
  value binary(const std::string& op, const value& a, const value& b, std::size_t pos);

  const render_options& opt_;
  std::string& out_;
};

// An error raised inside a builtin, which does not know where it was called from; call() adds
// the position.
[[noreturn]] void raise_in_call(errc code, std::string message) {
  throw template_error{code, std::string::npos, std::move(message)};
}

// By value: callers pass temporaries as defaults.
value arg_at(const call_args& a, std::size_t i, const char* name, const value& def) {
  if (i < a.positional.size())
    return a.positional[i];
  for (const auto& [k, v] : a.keyword)
    if (k == name)
      return v;
  return def;
}

void check_arity(const call_args& a, std::size_t max_positional, std::initializer_list<const char*> keywords,
                 const std::string& what) {
  if (a.positional.size() > max_positional)
    raise_in_call(errc::invalid_arg, what + " takes at most " + std::to_string(max_positional) + " positional arguments");
  for (const auto& [k, v] : a.keyword)
    if (std::find_if(keywords.begin(), keywords.end(), [&](const char* w) { return k == w; }) == keywords.end())
      raise_in_call(errc::invalid_arg, what + " got an unexpected keyword argument '" + k + "'");
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

value evaluator::method(const value& obj, const std::string& name, std::size_t pos) {
  (void)pos;
  if (obj.type() == value::kind::dict) {
    if (name == "items" || name == "keys" || name == "values")
      return value::function("dict." + name, [obj, name](const call_args& a) -> value {
        check_arity(a, 0, {}, "dict." + name + "()");
        value_list out;
        for (const auto& [k, v] : obj.as_dict()) {
          if (name == "items")
            out.emplace_back(value_list{value{k}, v}, true);
          else if (name == "keys")
            out.emplace_back(k);
          else
            out.push_back(v);
        }
        return value{std::move(out)};
      });
    if (name == "get")
      return value::function("dict.get", [obj](const call_args& a) -> value {
        if (a.positional.empty() || a.positional.size() > 2 || !a.keyword.empty())
          raise_in_call(errc::invalid_arg, "dict.get() takes 1 or 2 positional arguments");
        const auto& key = a.positional[0];
        if (key.is_string())
          if (const value* v = obj.find(key.as_string()))
            return *v;
        return a.positional.size() > 1 ? a.positional[1] : value::none();
      });
    static const std::set<std::string, std::less<>> others = {"pop", "update", "copy", "clear", "setdefault",
                                                              "popitem", "fromkeys"};
    if (others.count(name) != 0)
      return value::function("dict." + name, [name](const call_args&) -> value {
        raise_in_call(errc::unsupported, "dict." + name + "() is not supported (the sandbox forbids changing data)");
      });
    return {};
  }
  if (obj.is_string()) {
    const std::string s = obj.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return value::function("str." + name, [s, name](const call_args& a) -> value {
        check_arity(a, 1, {}, "str." + name + "()");
        const value chars = arg_at(a, 0, "", value::none());
        std::vector<char32_t> set;
        if (!chars.is_none()) {
          if (!chars.is_string())
            raise_in_call(errc::invalid_arg, name + " arg must be None or str");
          set = code_points(chars.as_string());
        }
        return value{py_strip(s, name != "rstrip", name != "lstrip", chars.is_none() ? nullptr : &set)};
      });
    if (name == "split")
      return value::function("str.split", [s](const call_args& a) -> value {
        check_arity(a, 2, {"sep", "maxsplit"}, "str.split()");
        const value sep = arg_at(a, 0, "sep", value::none());
        const value maxsplit = arg_at(a, 1, "maxsplit", value{std::int64_t{-1}});
        if (!is_int_like(maxsplit))
          raise_in_call(errc::invalid_arg, "maxsplit must be an integer");
        return py_split(s, sep, maxsplit.as_int());
      });
    if (name == "startswith" || name == "endswith")
      return value::function("str." + name, [s, name](const call_args& a) -> value {
        if (a.positional.size() != 1 || !a.keyword.empty())
          raise_in_call(errc::unsupported, "str." + name + "() with start/end arguments is not supported");
        const value& p = a.positional[0];
        value_list options = p.is_tuple() ? p.as_list() : value_list{p};
        for (const auto& o : options) {
          if (!o.is_string())
            raise_in_call(errc::invalid_arg, name + " first arg must be str or a tuple of str");
          const auto& x = o.as_string();
          bool hit = name == "startswith" ? s.compare(0, x.size(), x) == 0
                                          : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
          if (hit)
            return value{true};
        }
        return value{false};
      });
    if (name == "upper" || name == "lower")
      return value::function("str." + name, [s, name](const call_args& a) -> value {
        check_arity(a, 0, {}, "str." + name + "()");
        return value{ascii_case(s, name == "upper", "str." + name + "()")};
      });
    if (name == "replace")
      return value::function("str.replace", [s](const call_args& a) -> value {
        check_arity(a, 3, {"count"}, "str.replace()");
        const value from = arg_at(a, 0, "", value{});
        const value to = arg_at(a, 1, "", value{});
        const value count = arg_at(a, 2, "count", value{std::int64_t{-1}});
        if (!from.is_string() || !to.is_string() || !is_int_like(count))
          raise_in_call(errc::invalid_arg, "str.replace() takes two strings and an optional count");
        return value{py_replace(s, from.as_string(), to.as_string(), count.as_int())};
      });
    static const std::set<std::string, std::less<>> others = {
      "capitalize", "casefold", "center", "count", "encode", "expandtabs", "find", "format", "format_map", "index",
      "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric",
      "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "maketrans", "partition", "removeprefix",
      "removesuffix", "rfind", "rindex", "rjust", "rpartition", "rsplit", "splitlines", "swapcase", "title",
      "translate", "zfill"};
    if (others.count(name) != 0)
      return value::function("str." + name, [name](const call_args&) -> value {
        raise_in_call(errc::unsupported, "str." + name + "() is not supported");
      });
    return {};
  }
  if (obj.is_list()) {
    static const std::set<std::string, std::less<>> others = {"append", "extend", "insert", "pop", "remove",
                                                              "clear", "sort", "reverse", "index", "count", "copy"};
    if (others.count(name) != 0)
      return value::function("list." + name, [name](const call_args&) -> value {
        raise_in_call(errc::unsupported, "list." + name + "() is not supported");
      });
  }
  return {};
}

value evaluator::get_attr(const value& obj, const std::string& name, std::size_t pos) {
  // Python objects have many dunder attributes (the sandbox hides some, not all); none is modelled.
  if (name.rfind("__", 0) == 0)
    raise(errc::unsupported, pos, "the attribute '" + name + "' is not supported");
  if (obj.is_undefined())
    raise(errc::invalid_arg, pos, "'" + name + "' of an undefined value: the object is undefined");
  if (obj.type() == value::kind::ns) {
    if (const value* v = obj.find(name))
      return *v;
    return {};
  }
  // Python attribute first (the methods), then the item, as the sandbox's getattr does.
  auto m = method(obj, name, pos);
  if (!m.is_undefined())
    return m;
  if (obj.type() == value::kind::dict)
    if (const value* v = obj.find(name))
      return *v;
  return {};
}

value evaluator::get_item(const value& obj, const value& key, std::size_t pos) {
  if (obj.is_undefined())
    raise(errc::invalid_arg, pos, "item of an undefined value: the object is undefined");
  if (key.type() == value::kind::list && key.is_tuple() && !obj.is_dict())
    raise(errc::unsupported, pos, "multi-dimensional subscripts are not supported");
  switch (obj.type()) {
    case value::kind::dict:
    case value::kind::ns:
      if (key.is_string()) {
        if (const value* v = obj.find(key.as_string()))
          return *v;
        if (key.as_string().rfind("__", 0) == 0)
          raise(errc::unsupported, pos, "the attribute '" + key.as_string() + "' is not supported");
        if (obj.type() == value::kind::dict) {
          auto m = method(obj, key.as_string(), pos);
          if (!m.is_undefined())
            return m;
        }
      }
      return {};
    case value::kind::list:
      if (is_int_like(key)) {
        bool ok = false;
        auto i = py_index(key.as_int(), obj.as_list().size(), ok);
        return ok ? obj.as_list()[i] : value{};
      }
      break;
    case value::kind::string:
      if (is_int_like(key)) {
        auto cps = code_points(obj.as_string());
        bool ok = false;
        auto i = py_index(key.as_int(), cps.size(), ok);
        return ok ? value{from_code_points(cps, i, i + 1)} : value{};
      }
      break;
    default: break;
  }
  if (key.is_string()) {
    if (key.as_string().rfind("__", 0) == 0)
      raise(errc::unsupported, pos, "the attribute '" + key.as_string() + "' is not supported");
    return method(obj, key.as_string(), pos);
  }
  return {};
}

value evaluator::call(const value& fn, call_args args, std::size_t pos) {
  if (fn.is_undefined())
    raise(errc::invalid_arg, pos, "call of an undefined value");
  if (fn.type() != value::kind::function)
    raise(errc::invalid_arg, pos, std::string{"'"} + type_name(fn) + "' object is not callable");
  try {
    return fn.as_function()(args);
  } catch (template_error& e) {
    if (e.pos == std::string::npos)
      e.pos = pos;
    throw;
  }
}

value evaluator::global(const std::string& name) {
  if (name == "raise_exception")
    return value::function(name, [](const call_args& a) -> value {
      std::string msg = a.positional.empty() ? "" : (a.positional[0].is_string() ? a.positional[0].as_string() : "");
      raise_in_call(errc::invalid_arg, "the template raised an exception: " + msg);
    });
  if (name == "strftime_now") {
    auto now = opt_.now;
    return value::function(name, [now](const call_args& a) -> value {
      if (a.positional.size() != 1 || !a.positional[0].is_string())
        raise_in_call(errc::invalid_arg, "strftime_now() takes one format string");
      std::time_t t = std::chrono::system_clock::to_time_t(now);
      std::tm tm{};
      localtime_r(&t, &tm);
      const auto& fmt = a.positional[0].as_string();
      for (std::size_t i = 0; i + 1 < fmt.size(); ++i)
        if (fmt[i] == '%' && std::strchr("fzZ", fmt[i + 1]) != nullptr)
          raise_in_call(errc::unsupported, "strftime_now: %f, %z and %Z are not supported");
      std::string buf(fmt.size() * 8 + 64, '\0');
      auto n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
      if (n == 0 && !fmt.empty())
        raise_in_call(errc::unsupported, "strftime_now: format gives no output");
      buf.resize(n);
      return value{buf};
    });
  }
  if (name == "namespace" || name == "dict")
    return value::function(name, [name](const call_args& a) -> value {
      value_dict members;
      for (const auto& p : a.positional) {
        if (!p.is_dict())
          raise_in_call(errc::unsupported, name + "() with a positional argument other than a dict is not supported");
        for (const auto& m : p.as_dict())
          members.push_back(m);
      }
      for (const auto& [k, v] : a.keyword) {
        auto it = std::find_if(members.begin(), members.end(), [&](const auto& m) { return m.first == k; });
        if (it != members.end())
          it->second = v;
        else
          members.emplace_back(k, v);
      }
      return name == "namespace" ? value::make_namespace(std::move(members)) : value{std::move(members)};
    });
  if (name == "range")
    return value::function(name, [](const call_args& a) -> value {
      if (a.positional.empty() || a.positional.size() > 3 || !a.keyword.empty())
        raise_in_call(errc::invalid_arg, "range expected 1 to 3 integer arguments");
      for (const auto& p : a.positional)
        if (!is_int_like(p))
          raise_in_call(errc::invalid_arg, "range() arguments must be integers");
      std::int64_t start = 0, stop = 0, step = 1;
      if (a.positional.size() == 1) {
        stop = a.positional[0].as_int();
      } else {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() == 3)
          step = a.positional[2].as_int();
      }
      if (step == 0)
        raise_in_call(errc::invalid_arg, "range() arg 3 must not be zero");
      value_list out;
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= 100000) // jinja2.sandbox.MAX_RANGE
          raise_in_call(errc::invalid_arg, "range too big");
        out.emplace_back(i);
      }
      return value{std::move(out)};
    });
  static const std::set<std::string, std::less<>> others = {"lipsum", "cycler", "joiner"};
  if (others.count(name) != 0)
    return value::function(name, [name](const call_args&) -> value {
      raise_in_call(errc::unsupported, "the global '" + name + "' is not supported");
    });
  return {};
}

value evaluator::binary(const std::string& op, const value& a, const value& b, std::size_t pos) {
  if (a.is_undefined() || b.is_undefined())
    raise(errc::invalid_arg, pos, "'" + op + "' with an undefined value");
  auto type_error = [&]() -> value {
    raise(errc::invalid_arg, pos, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                                    type_name(b) + "'");
  };
  const bool ints = is_int_like(a) && is_int_like(b);
  const bool nums = is_number(a) && is_number(b);
  if (op == "+") {
    if (ints) {
      std::int64_t r = 0;
      const bool overflow = __builtin_add_overflow(a.as_int(), b.as_int(), &r);
      return value{checked(overflow, r, pos)};
    }
    if (nums)
      return value{a.as_double() + b.as_double()};
    if (a.is_string() && b.is_string())
      return value{a.as_string() + b.as_string()};
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      value_list l = a.as_list();
      l.insert(l.end(), b.as_list().begin(), b.as_list().end());
      return value{std::move(l), a.is_tuple()};
    }
    if (a.is_string() && !b.is_string())
      raise(errc::invalid_arg, pos, std::string{"can only concatenate str (not \""} + type_name(b) + "\") to str");
    return type_error();
  }
  if (op == "-") {
    if (ints) {
      std::int64_t r = 0;
      const bool overflow = __builtin_sub_overflow(a.as_int(), b.as_int(), &r);
      return value{checked(overflow, r, pos)};
    }
    if (nums)
      return value{a.as_double() - b.as_double()};
    return type_error();
  }
  if (op == "*") {
    if (ints) {
      std::int64_t r = 0;
      const bool overflow = __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
      return value{checked(overflow, r, pos)};
    }
    if (nums)
      return value{a.as_double() * b.as_double()};
    const value* seq = (a.is_string() || a.is_list()) && is_int_like(b) ? &a
                       : (b.is_string() || b.is_list()) && is_int_like(a) ? &b
                                                                          : nullptr;
    if (seq != nullptr) {
      std::int64_t n = (seq == &a ? b : a).as_int();
      if (n > 0 && length_of(*seq, pos) * n > 100000000)
        raise(errc::unsupported, pos, "repetition result too large");
      if (seq->is_string()) {
        std::string out;
        for (std::int64_t i = 0; i < n; ++i)
          out += seq->as_string();
        return value{std::move(out)};
      }
      value_list out;
      for (std::int64_t i = 0; i < n; ++i)
        out.insert(out.end(), seq->as_list().begin(), seq->as_list().end());
      return value{std::move(out), seq->is_tuple()};
    }
    return type_error();
  }
  if (op == "/") {
    if (!nums)
      return type_error();
    if (b.as_double() == 0)
      raise(errc::invalid_arg, pos, "division by zero");
    return value{a.as_double() / b.as_double()};
  }
  if (op == "//" || op == "%") {
    if (a.is_string() && op == "%")
      raise(errc::unsupported, pos, "printf-style string formatting is not supported");
    if (!nums)
      return type_error();
    if (b.as_double() == 0)
      raise(errc::invalid_arg, pos, op == "//" ? "integer division or modulo by zero" : "modulo by zero");
    if (ints) {
      if (a.as_int() == std::numeric_limits<std::int64_t>::min() && b.as_int() == -1)
        raise(errc::unsupported, pos, "integer overflow (only 64-bit integers are supported)");
      auto q = floor_div(a.as_int(), b.as_int());
      return op == "//" ? value{q} : value{a.as_int() - q * b.as_int()};
    }
    // CPython's float divmod.
    double x = a.as_double(), y = b.as_double();
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    if (op == "%")
      return value{mod};
    double fd;
    if (div != 0) {
      fd = std::floor(div);
      if (div - fd > 0.5)
        fd += 1.0;
    } else {
      fd = std::copysign(0.0, x / y);
    }
    return value{fd};
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      std::int64_t r = 1;
      for (std::int64_t i = 0; i < b.as_int(); ++i)
        if (__builtin_mul_overflow(r, a.as_int(), &r))
          checked(true, r, pos);
      return value{r};
    }
    if (nums) {
      if (a.as_double() == 0 && b.as_double() < 0)
        raise(errc::invalid_arg, pos, "0.0 cannot be raised to a negative power");
      double r = std::pow(a.as_double(), b.as_double());
      if (std::isnan(r))
        raise(errc::unsupported, pos, "complex results of ** are not supported");
      return value{r};
    }
    return type_error();
  }
  raise(errc::unsupported, pos, "operator " + op + " is not supported");
}

// Filters and tests by name, shared by `|name`, `is name`, select/reject and map.
value apply_filter(evaluator& ev, const std::string& name, const value& v, const call_args& a);
bool apply_test(evaluator& ev, const std::string& name, const value& v, const std::vector<value>& args);

value attr_path(evaluator& ev, const value& item, const std::string& path, std::size_t pos);

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

value apply_filter(evaluator& ev, const std::string& name, const value& v, const call_args& a) {
  const value none = value::none();
  auto str_of = [&](const value& x) { return to_str(x, std::string::npos); };
  if (name == "length" || name == "count") {
    check_arity(a, 0, {}, name);
    return value{length_of(v, std::string::npos)};
  }
  if (name == "trim") {
    check_arity(a, 1, {"chars"}, name);
    const value chars = arg_at(a, 0, "chars", none);
    if (chars.is_none())
      return value{py_strip(str_of(v), true, true)};
    if (!chars.is_string())
      raise_in_call(errc::invalid_arg, "strip arg must be None or str");
    auto set = code_points(chars.as_string());
    return value{py_strip(str_of(v), true, true, &set)};
  }
  if (name == "default" || name == "d") {
    check_arity(a, 2, {"default_value", "boolean"}, name);
    const value def = arg_at(a, 0, "default_value", value{std::string{}});
    const value boolean = arg_at(a, 1, "boolean", value{false});
    if (v.is_undefined() || (boolean.truthy() && !v.truthy()))
      return def;
    return v;
  }
  if (name == "tojson") {
    check_arity(a, 4, {"ensure_ascii", "indent", "separators", "sort_keys"}, name);
    json_style st;
    st.ensure_ascii = arg_at(a, 0, "ensure_ascii", value{false}).truthy();
    const value indent = arg_at(a, 1, "indent", none);
    const value seps = arg_at(a, 2, "separators", none);
    st.sort_keys = arg_at(a, 3, "sort_keys", value{false}).truthy();
    if (!indent.is_none()) {
      st.indent_set = true;
      if (is_int_like(indent))
        st.indent = std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, indent.as_int())), ' ');
      else if (indent.is_string())
        st.indent = indent.as_string();
      else
        raise_in_call(errc::invalid_arg, "tojson: indent must be an integer or a string");
      st.item_sep = ",";
    }
    if (!seps.is_none()) {
      if (!seps.is_list() || seps.as_list().size() != 2 || !seps.as_list()[0].is_string() ||
          !seps.as_list()[1].is_string())
        raise_in_call(errc::invalid_arg, "tojson: separators must be a pair of strings");
      st.item_sep = seps.as_list()[0].as_string();
      st.key_sep = seps.as_list()[1].as_string();
    }
    std::string out;
    to_json(out, v, st, 0, std::string::npos);
    return value{std::move(out)};
  }
  if (name == "join") {
    check_arity(a, 2, {"d", "attribute"}, name);
    const value sep = arg_at(a, 0, "d", value{std::string{}});
    const value attribute = arg_at(a, 1, "attribute", none);
    std::string out;
    bool first = true;
    for (const auto& item : iterate(v, std::string::npos)) {
      if (!first)
        out += str_of(sep);
      first = false;
      out += str_of(attribute.is_none() ? item : attr_path(ev, item, str_of(attribute), std::string::npos));
    }
    return value{std::move(out)};
  }
  if (name == "first" || name == "last") {
    check_arity(a, 0, {}, name);
    auto items = iterate(v, std::string::npos);
    if (items.empty())
      return {};
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    check_arity(a, 0, {}, name);
    return value{iterate(v, std::string::npos)};
  }
  if (name == "reverse") {
    check_arity(a, 0, {}, name);
    if (v.is_string()) {
      auto cps = code_points(v.as_string());
      std::reverse(cps.begin(), cps.end());
      return value{from_code_points(cps)};
    }
    auto items = iterate(v, std::string::npos);
    std::reverse(items.begin(), items.end());
    return value{std::move(items)};
  }
  if (name == "items") {
    check_arity(a, 0, {}, name);
    if (v.is_undefined())
      return value{value_list{}};
    if (v.type() != value::kind::dict)
      raise_in_call(errc::invalid_arg, "Can only get item pairs from a mapping.");
    value_list out;
    for (const auto& [k, x] : v.as_dict())
      out.emplace_back(value_list{value{k}, x}, true);
    return value{std::move(out)};
  }
  if (name == "string") {
    check_arity(a, 0, {}, name);
    return value{str_of(v)};
  }
  if (name == "upper" || name == "lower") {
    check_arity(a, 0, {}, name);
    return value{ascii_case(str_of(v), name == "upper", "the " + name + " filter")};
  }
  if (name == "capitalize") {
    check_arity(a, 0, {}, name);
    auto s = ascii_case(str_of(v), false, "the capitalize filter");
    if (!s.empty())
      s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return value{s};
  }
  if (name == "replace") {
    check_arity(a, 3, {"old", "new", "count"}, name);
    const value from = arg_at(a, 0, "old", value{});
    const value to = arg_at(a, 1, "new", value{});
    const value count = arg_at(a, 2, "count", none);
    if (!from.is_string() || !to.is_string())
      raise_in_call(errc::invalid_arg, "replace: old and new must be strings");
    if (!count.is_none() && !is_int_like(count))
      raise_in_call(errc::invalid_arg, "replace: count must be an integer");
    return value{py_replace(str_of(v), from.as_string(), to.as_string(), count.is_none() ? -1 : count.as_int())};
  }
  if (name == "abs") {
    check_arity(a, 0, {}, name);
    if (is_int_like(v)) {
      if (v.as_int() == std::numeric_limits<std::int64_t>::min())
        raise_in_call(errc::unsupported, "integer overflow (only 64-bit integers are supported)");
      return value{v.as_int() < 0 ? -v.as_int() : v.as_int()};
    }
    if (v.type() == value::kind::floating)
      return value{std::fabs(v.as_double())};
    raise_in_call(errc::invalid_arg, std::string{"bad operand type for abs(): '"} + type_name(v) + "'");
  }
  if (name == "int") {
    check_arity(a, 2, {"default", "base"}, name);
    const value def = arg_at(a, 0, "default", value{std::int64_t{0}});
    const value base = arg_at(a, 1, "base", value{std::int64_t{10}});
    if (!is_int_like(base) || base.as_int() != 10)
      raise_in_call(errc::unsupported, "the int filter supports base 10 only");
    if (is_int_like(v))
      return value{v.as_int()};
    std::optional<double> d;
    if (v.is_string()) {
      if (auto i = parse_py_int(v.as_string(), 10))
        return value{*i};
      d = parse_py_float(v.as_string());
    } else if (v.type() == value::kind::floating) {
      d = v.as_double();
    }
    if (!d || std::isnan(*d) || std::isinf(*d))
      return def;
    if (std::fabs(*d) >= 9.2e18)
      raise_in_call(errc::unsupported, "integer overflow (only 64-bit integers are supported)");
    return value{static_cast<std::int64_t>(std::trunc(*d))};
  }
  if (name == "float") {
    check_arity(a, 1, {"default"}, name);
    const value def = arg_at(a, 0, "default", value{0.0});
    if (is_number(v))
      return value{v.as_double()};
    if (v.is_string())
      if (auto d = parse_py_float(v.as_string()))
        return value{*d};
    return def;
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    if (!a.keyword.empty())
      raise_in_call(errc::unsupported, name + " with keyword arguments is not supported");
    std::size_t k = 0;
    std::string attribute;
    if (attr) {
      if (a.positional.empty() || !a.positional[0].is_string())
        raise_in_call(errc::invalid_arg, name + " needs an attribute name");
      attribute = a.positional[0].as_string();
      k = 1;
    }
    std::string test_name;
    std::vector<value> test_args;
    if (k < a.positional.size()) {
      if (!a.positional[k].is_string())
        raise_in_call(errc::invalid_arg, name + ": the test name must be a string");
      test_name = a.positional[k].as_string();
      if (jinja_tests.count(test_name) == 0)
        raise_in_call(errc::invalid_arg, "no test named '" + test_name + "'");
      test_args.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(k + 1), a.positional.end());
    }
    value_list out;
    for (const auto& item : iterate(v, std::string::npos)) {
      const value x = attr ? attr_path(ev, item, attribute, std::string::npos) : item;
      bool hit = test_name.empty() ? x.truthy() : apply_test(ev, test_name, x, test_args);
      if (hit == keep_if)
        out.push_back(item);
    }
    return value{std::move(out)};
  }
  if (name == "map") {
    value_list out;
    const value* attribute = nullptr;
    const value* def = nullptr;
    for (const auto& [k, x] : a.keyword) {
      if (k == "attribute")
        attribute = &x;
      else if (k == "default")
        def = &x;
    }
    if (attribute != nullptr) {
      if (!a.positional.empty() || a.keyword.size() > (def ? 2u : 1u))
        raise_in_call(errc::invalid_arg, "map: attribute= takes no other arguments but default=");
      for (const auto& item : iterate(v, std::string::npos)) {
        auto x = attr_path(ev, item, to_str(*attribute, std::string::npos), std::string::npos);
        out.push_back(x.is_undefined() && def ? *def : x);
      }
      return value{std::move(out)};
    }
    if (a.positional.empty() || !a.positional[0].is_string())
      raise_in_call(errc::invalid_arg, "map: expected a filter name or attribute=");
    auto fname = a.positional[0].as_string();
    if (jinja_filters.count(fname) == 0)
      raise_in_call(errc::invalid_arg, "no filter named '" + fname + "'");
    call_args rest{{a.positional.begin() + 1, a.positional.end()}, a.keyword};
    for (const auto& item : iterate(v, std::string::npos))
      out.push_back(apply_filter(ev, fname, item, rest));
    return value{std::move(out)};
  }
  raise_in_call(errc::unsupported, "the filter '" + name + "' is not supported");
}

bool apply_test(evaluator& ev, const std::string& name, const value& v, const std::vector<value>& args) {
  (void)ev;
  auto need = [&](std::size_t n) {
    if (args.size() != n)
      raise_in_call(errc::invalid_arg, "the test '" + name + "' takes " + std::to_string(n) + " argument(s)");
  };
  using k = value::kind;
  if (name == "defined") return need(0), !v.is_undefined();
  if (name == "undefined") return need(0), v.is_undefined();
  if (name == "none") return need(0), v.is_none();
  if (name == "boolean") return need(0), v.type() == k::boolean;
  if (name == "true") return need(0), v.type() == k::boolean && v.as_bool();
  if (name == "false") return need(0), v.type() == k::boolean && !v.as_bool();
  if (name == "integer") return need(0), v.type() == k::integer;
  if (name == "float") return need(0), v.type() == k::floating;
  if (name == "number") return need(0), is_number(v);
  if (name == "string") return need(0), v.is_string();
  if (name == "mapping") return need(0), v.type() == k::dict;
  if (name == "callable") return need(0), v.type() == k::function;
  if (name == "iterable")
    return need(0), v.is_undefined() || v.is_string() || v.is_list() || v.type() == k::dict;
  if (name == "sequence")
    return need(0), v.is_undefined() || v.is_string() || v.is_list() || v.type() == k::dict;
  if (name == "lower" || name == "upper") {
    need(0);
    // str.islower(): at least one cased character and no character of the other case.
    auto s = to_str(v, std::string::npos);
    bool cased = false;
    for (unsigned char c : s) {
      if (c >= 0x80)
        raise_in_call(errc::unsupported, "the test '" + name + "' on non-ASCII text is not supported");
      if (std::isalpha(c)) {
        cased = true;
        if ((name == "lower") != (std::islower(c) != 0))
          return false;
      }
    }
    return cased;
  }
  if (name == "odd" || name == "even") {
    need(0);
    if (!is_int_like(v))
      raise_in_call(errc::invalid_arg, "the test '" + name + "' needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    need(1);
    if (!is_int_like(v) || !is_int_like(args[0]))
      raise_in_call(errc::unsupported, "divisibleby of non-integers is not supported");
    if (args[0].as_int() == 0)
      raise_in_call(errc::invalid_arg, "integer division or modulo by zero");
    return v.as_int() % args[0].as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return need(1), py_equal(v, args[0]);
  if (name == "ne" || name == "!=") return need(1), !py_equal(v, args[0]);
  if (name == "lt" || name == "lessthan" || name == "<") return need(1), py_compare(v, args[0], "<", std::string::npos) < 0;
  if (name == "le" || name == "<=") return need(1), py_compare(v, args[0], "<=", std::string::npos) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return need(1), py_compare(v, args[0], ">", std::string::npos) > 0;
  if (name == "ge" || name == ">=") return need(1), py_compare(v, args[0], ">=", std::string::npos) >= 0;
  if (name == "in") return need(1), py_in(v, args[0], std::string::npos);
  raise_in_call(errc::unsupported, "the test '" + name + "' is not supported");
}

// Jinja's attribute getter for filters: dotted parts, integers as indices, item lookup first.
value attr_path(evaluator& ev, const value& item, const std::string& path, std::size_t pos) {
  value cur = item;
  std::size_t i = 0;
  while (true) {
    auto dot = path.find('.', i);
    auto part = path.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
    value key{part};
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      key = value{static_cast<std::int64_t>(std::stoll(part))};
    cur = ev.get_item(cur, key, pos);
    if (dot == std::string::npos)
      return cur;
    i = dot + 1;
  }
}

value evaluator::eval(const expr& e, scope& sc) {
  switch (e.kind) {
    case expr::op::literal: return e.lit;
    case expr::op::name: {
      if (value* v = lookup(e.name, sc))
        return *v;
      return global(e.name);
    }
    case expr::op::getattr: return get_attr(eval(*e.args[0], sc), e.name, e.pos);
    case expr::op::getitem: {
      auto obj = eval(*e.args[0], sc);
      const auto& k = *e.args[1];
      if (k.kind == expr::op::slice) {
        if (obj.is_undefined())
          raise(errc::invalid_arg, e.pos, "slice of an undefined value");
        value start = k.args[0] ? eval(*k.args[0], sc) : value::none();
        value stop = k.args[1] ? eval(*k.args[1], sc) : value::none();
        value step = k.args[2] ? eval(*k.args[2], sc) : value::none();
        if (obj.is_string()) {
          auto cps = code_points(obj.as_string());
          std::vector<char32_t> sel;
          for (auto i : slice_positions(cps.size(), start, stop, step, k.pos))
            sel.push_back(cps[i]);
          return value{from_code_points(sel)};
        }
        if (obj.is_list()) {
          value_list sel;
          for (auto i : slice_positions(obj.as_list().size(), start, stop, step, k.pos))
            sel.push_back(obj.as_list()[i]);
          return value{std::move(sel), obj.is_tuple()};
        }
        return {};
      }
      return get_item(obj, eval(k, sc), e.pos);
    }
    case expr::op::call: {
      auto fn = eval(*e.args[0], sc);
      call_args a;
      for (std::size_t i = 1; i < e.args.size(); ++i)
        a.positional.push_back(eval(*e.args[i], sc));
      for (const auto& [k, x] : e.kwargs)
        a.keyword.emplace_back(k, eval(*x, sc));
      return call(fn, std::move(a), e.pos);
    }
    case expr::op::filter: {
      auto v = eval(*e.args[0], sc);
      call_args a;
      for (std::size_t i = 1; i < e.args.size(); ++i)
        a.positional.push_back(eval(*e.args[i], sc));
      for (const auto& [k, x] : e.kwargs)
        a.keyword.emplace_back(k, eval(*x, sc));
      try {
        return apply_filter(*this, e.name, v, a);
      } catch (template_error& err) {
        if (err.pos == std::string::npos)
          err.pos = e.pos;
        throw;
      }
    }
    case expr::op::test: {
      auto v = eval(*e.args[0], sc);
      std::vector<value> args;
      for (std::size_t i = 1; i < e.args.size(); ++i)
        args.push_back(eval(*e.args[i], sc));
      if (!e.kwargs.empty())
        raise(errc::unsupported, e.pos, "keyword arguments to tests are not supported");
      try {
        return value{apply_test(*this, e.name, v, args)};
      } catch (template_error& err) {
        if (err.pos == std::string::npos)
          err.pos = e.pos;
        throw;
      }
    }
    case expr::op::not_: return value{!eval(*e.args[0], sc).truthy()};
    case expr::op::neg:
    case expr::op::pos: {
      auto v = eval(*e.args[0], sc);
      if (!is_number(v))
        raise(errc::invalid_arg, e.pos, std::string{"bad operand type for unary "} +
                                          (e.kind == expr::op::neg ? "-" : "+") + ": '" + type_name(v) + "'");
      if (e.kind == expr::op::pos)
        return is_int_like(v) ? value{v.as_int()} : v;
      if (is_int_like(v)) {
        if (v.as_int() == std::numeric_limits<std::int64_t>::min())
          raise(errc::unsupported, e.pos, "integer overflow (only 64-bit integers are supported)");
        return value{-v.as_int()};
      }
      return value{-v.as_double()};
    }
    case expr::op::binary: {
      auto l = eval(*e.args[0], sc);
      auto r = eval(*e.args[1], sc);
      return binary(e.name, l, r, e.pos);
    }
    case expr::op::compare: {
      auto left = eval(*e.args[0], sc);
      for (std::size_t i = 0; i < e.ops.size(); ++i) {
        auto right = eval(*e.args[i + 1], sc);
        const auto& op = e.ops[i];
        bool r;
        if (op == "==")
          r = py_equal(left, right);
        else if (op == "!=")
          r = !py_equal(left, right);
        else if (op == "in")
          r = py_in(left, right, e.pos);
        else if (op == "not in")
          r = !py_in(left, right, e.pos);
        else {
          int c = py_compare(left, right, op, e.pos);
          r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!r)
          return value{false};
        left = std::move(right);
      }
      return value{true};
    }
    case expr::op::and_: {
      auto l = eval(*e.args[0], sc);
      return l.truthy() ? eval(*e.args[1], sc) : l;
    }
    case expr::op::or_: {
      auto l = eval(*e.args[0], sc);
      return l.truthy() ? l : eval(*e.args[1], sc);
    }
    case expr::op::cond:
      if (eval(*e.args[0], sc).truthy())
        return eval(*e.args[1], sc);
      return e.args[2] ? eval(*e.args[2], sc) : value{};
    case expr::op::list:
    case expr::op::tuple: {
      value_list items;
      for (const auto& x : e.args)
        items.push_back(eval(*x, sc));
      return value{std::move(items), e.kind == expr::op::tuple};
    }
    case expr::op::dict: {
      value_dict members;
      for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
        auto k = eval(*e.args[i], sc);
        if (!k.is_string())
          raise(errc::unsupported, e.args[i]->pos, "dict keys other than strings are not supported");
        auto v = eval(*e.args[i + 1], sc);
        auto it = std::find_if(members.begin(), members.end(), [&](const auto& m) { return m.first == k.as_string(); });
        if (it != members.end())
          it->second = std::move(v);
        else
          members.emplace_back(k.as_string(), std::move(v));
      }
      return value{std::move(members)};
    }
    case expr::op::concat: {
      std::string out;
      for (const auto& x : e.args)
        out += to_str(eval(*x, sc), x->pos);
      return value{std::move(out)};
    }
    case expr::op::slice: raise(errc::invalid_arg, e.pos, "a slice outside a subscript");
  }
  raise(errc::unsupported, e.pos, "unsupported expression");
}

// Line and column (1-based, column in characters) of a byte offset.
std::pair<std::size_t, std::size_t> line_col(const std::string& src, std::size_t pos) {
  pos = std::min(pos, src.size());
  std::size_t line = 1, start = 0;
  for (std::size_t i = 0; i < pos; ++i)
    if (src[i] == '\n') {
      ++line;
      start = i + 1;
    }
  return {line, code_point_count(std::string_view{src}.substr(start, pos - start)) + 1};
}

} // namespace

struct program::impl {
  std::string name;
  std::string source; // normalised
  body root;

  crucible::error to_error(const template_error& e) const {
    auto [line, col] = line_col(source, e.pos == std::string::npos ? 0 : e.pos);
    return crucible::error{e.code, name + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " + e.message};
  }
};

program::program(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
program::program(program&&) noexcept = default;
program& program::operator=(program&&) noexcept = default;
program::~program() = default;

const std::string& program::name() const noexcept { return impl_->name; }

result<program> program::parse(std::string_view source, std::string name) {
  auto p = std::make_unique<impl>();
  p->name = std::move(name);
  // jinja2: "\r\n", "\r" and "\n" all become "\n"; one trailing newline is dropped.
  std::string norm;
  norm.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      norm += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n')
        ++i;
    } else {
      norm += source[i];
    }
  }
  if (!norm.empty() && norm.back() == '\n')
    norm.pop_back();
  p->source = std::move(norm);
  try {
    lexer lx{p->source};
    parser ps{lx.run()};
    p->root = ps.parse_template();
  } catch (const template_error& e) {
    return p->to_error(e);
  }
  return program{std::move(p)};
}

result<std::string> program::render(const value& context, const render_options& opt) const {
  if (!context.is_dict())
    return fail(errc::invalid_arg, impl_->name, ": the render context must be a dict");
  std::string out;
  scope root;
  for (const auto& [k, v] : context.as_dict())
    root.vars[k] = v;
  try {
    evaluator ev{opt, out};
    ev.exec(impl_->root, root);
  } catch (const template_error& e) {
    return impl_->to_error(e);
  }
  return out;
}

result<std::string> render_chat(const program& chat_template, std::span<const chat_message> messages,
                                const std::map<std::string, std::string>& special_tokens,
                                bool add_generation_prompt, const render_options& opt) {
  value_list msgs;
  for (const auto& m : messages)
    msgs.emplace_back(value_dict{{"role", value{m.role}}, {"content", value{m.content}}});
  value_dict ctx;
  for (const auto& [k, v] : special_tokens)
    ctx.emplace_back(k, value{v});
  // transformers passes these after the special tokens; a special token of the same name loses.
  auto put = [&](const std::string& k, value v) {
    auto it = std::find_if(ctx.begin(), ctx.end(), [&](const auto& m) { return m.first == k; });
    if (it != ctx.end())
      it->second = std::move(v);
    else
      ctx.emplace_back(k, std::move(v));
  };
  put("messages", value{std::move(msgs)});
  put("tools", value::none());
  put("documents", value::none());
  put("add_generation_prompt", value{add_generation_prompt});
  return chat_template.render(value{std::move(ctx)}, opt);
}

} // namespace crucible::jinja
