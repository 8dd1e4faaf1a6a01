// core/json_parse.cpp: recursive-descent JSON parser. Speed matters (a 7 MB tokenizer.json must
// load in well under a second), so strings are scanned in runs and numbers go through
// std::from_chars; positions are turned into line:column only when an error is reported.
#include "core/json_parse.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/file_io.hpp"
#include "core/json.hpp"
#include "core/utf8.hpp"

namespace crucible {

double json_value::as_double() const {
  if (is_int())
    return static_cast<double>(as_int());
  return std::get<double>(v_);
}

const json_value* json_value::find(std::string_view key) const {
  if (!is_object())
    return nullptr;
  for (const auto& m : as_object())
    if (m.key == key)
      return &m.value;
  return nullptr;
}

const char* json_value::kind_name(kind k) noexcept {
  switch (k) {
    case kind::null: return "null";
    case kind::boolean: return "boolean";
    case kind::integer: return "integer";
    case kind::real: return "number";
    case kind::string: return "string";
    case kind::array: return "array";
    case kind::object: return "object";
  }
  return "?";
}

namespace {

constexpr int max_depth = 512;

class parser {
public:
  parser(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  result<json_value> run() {
    skip_ws();
    json_value v;
    if (!parse_value(v, 0))
      return error();
    skip_ws();
    if (pos_ != s_.size()) {
      fail_at(pos_, "unexpected content after the document");
      return error();
    }
    return v;
  }

private:
  crucible::error error() const { return crucible::error{errc::corrupt, message_}; }

  // Records the first error with its line and column (1-based, columns count bytes).
  bool fail_at(std::size_t at, std::string_view what) {
    if (!message_.empty())
      return false;
    std::size_t line = 1, line_start = 0;
    for (std::size_t i = 0; i < at && i < s_.size(); ++i)
      if (s_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    message_.append(source_).append(":").append(std::to_string(line)).append(":");
    message_.append(std::to_string(at - line_start + 1)).append(": ").append(what);
    return false;
  }

  void skip_ws() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t')
        break;
      ++pos_;
    }
  }

  bool parse_value(json_value& out, int depth) {
    if (pos_ >= s_.size())
      return fail_at(pos_, "unexpected end of input, expected a value");
    switch (s_[pos_]) {
      case '{': return parse_object(out, depth);
      case '[': return parse_array(out, depth);
      case '"': {
        std::string str;
        if (!parse_string(str))
          return false;
        out = json_value{std::move(str)};
        return true;
      }
      case 't': return parse_literal("true", json_value{true}, out);
      case 'f': return parse_literal("false", json_value{false}, out);
      case 'n': return parse_literal("null", json_value{}, out);
      default:
        if (s_[pos_] == '-' || (s_[pos_] >= '0' && s_[pos_] <= '9'))
          return parse_number(out);
        return fail_at(pos_, unexpected("a value"));
    }
  }

  std::string unexpected(std::string_view expected) const {
    auto c = static_cast<unsigned char>(s_[pos_]);
    std::string got = c >= 0x20 && c < 0x7F ? std::string{"'"} + static_cast<char>(c) + "'"
                                             : "byte " + std::to_string(c);
    return "unexpected " + got + ", expected " + std::string{expected};
  }

  bool parse_literal(std::string_view word, json_value value, json_value& out) {
    if (s_.substr(pos_, word.size()) != word)
      return fail_at(pos_, "invalid literal, expected " + std::string{word});
    pos_ += word.size();
    out = std::move(value);
    return true;
  }

  bool parse_object(json_value& out, int depth) {
    if (depth >= max_depth)
      return fail_at(pos_, "nesting deeper than 512 levels");
    ++pos_; // '{'
    json_object members;
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      out = json_value{std::move(members)};
      return true;
    }
    for (;;) {
      skip_ws();
      if (pos_ >= s_.size())
        return fail_at(pos_, "unexpected end of input in an object");
      if (s_[pos_] != '"')
        return fail_at(pos_, unexpected("a string key"));
      json_member m;
      if (!parse_string(m.key))
        return false;
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != ':')
        return fail_at(pos_, pos_ >= s_.size() ? "unexpected end of input, expected ':'" : unexpected("':'"));
      ++pos_;
      skip_ws();
      if (!parse_value(m.value, depth + 1))
        return false;
      members.push_back(std::move(m));
      skip_ws();
      if (pos_ >= s_.size())
        return fail_at(pos_, "unexpected end of input in an object");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == '}') {
        ++pos_;
        out = json_value{std::move(members)};
        return true;
      }
      return fail_at(pos_, unexpected("',' or '}'"));
    }
  }

  bool parse_array(json_value& out, int depth) {
    if (depth >= max_depth)
      return fail_at(pos_, "nesting deeper than 512 levels");
    ++pos_; // '['
    json_array items;
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      out = json_value{std::move(items)};
      return true;
    }
    for (;;) {
      skip_ws();
      items.emplace_back();
      if (!parse_value(items.back(), depth + 1))
        return false;
      skip_ws();
      if (pos_ >= s_.size())
        return fail_at(pos_, "unexpected end of input in an array");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == ']') {
        ++pos_;
        out = json_value{std::move(items)};
        return true;
      }
      return fail_at(pos_, unexpected("',' or ']'"));
    }
  }

  // Four hex digits at pos_, or -1.
  long hex4() {
    if (pos_ + 4 > s_.size())
      return -1;
    long v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[pos_ + static_cast<std::size_t>(k)];
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0)
        return -1;
      v = v * 16 + d;
    }
    pos_ += 4;
    return v;
  }

  bool parse_string(std::string& out) {
    const std::size_t open = pos_;
    ++pos_; // '"'
    for (;;) {
      // Copy the run of plain ASCII in one go.
      std::size_t run = pos_;
      while (run < s_.size()) {
        auto c = static_cast<unsigned char>(s_[run]);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80)
          break;
        ++run;
      }
      out.append(s_.data() + pos_, run - pos_);
      pos_ = run;
      if (pos_ >= s_.size())
        return fail_at(open, "unterminated string");
      auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20)
        return fail_at(pos_, "control character in a string (must be escaped)");
      if (c >= 0x80) {
        auto u = decode_utf8(s_, pos_);
        if (u.len == 0)
          return fail_at(pos_, "invalid UTF-8 in a string");
        out.append(s_.data() + pos_, u.len);
        pos_ += u.len;
        continue;
      }
      // Backslash escape.
      const std::size_t esc = pos_;
      if (++pos_ >= s_.size())
        return fail_at(open, "unterminated string");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          long hi = hex4();
          if (hi < 0)
            return fail_at(esc, "invalid \\u escape (expected four hex digits)");
          char32_t cp = static_cast<char32_t>(hi);
          if (hi >= 0xDC00 && hi <= 0xDFFF)
            return fail_at(esc, "lone low surrogate in a \\u escape");
          if (hi >= 0xD800 && hi <= 0xDBFF) {
            if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u')
              return fail_at(esc, "high surrogate not followed by a low surrogate \\u escape");
            pos_ += 2;
            long lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF)
              return fail_at(esc, "high surrogate not followed by a low surrogate \\u escape");
            cp = 0x10000 + ((static_cast<char32_t>(hi) - 0xD800) << 10) + (static_cast<char32_t>(lo) - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          return fail_at(esc, "invalid escape in a string");
      }
    }
  }

  bool parse_number(json_value& out) {
    const std::size_t start = pos_;
    auto digit = [&](std::size_t i) { return i < s_.size() && s_[i] >= '0' && s_[i] <= '9'; };
    std::size_t i = pos_;
    if (s_[i] == '-')
      ++i;
    if (!digit(i))
      return fail_at(i, "invalid number (expected a digit)");
    if (s_[i] == '0') {
      ++i;
      if (digit(i))
        return fail_at(start, "invalid number (leading zero)");
    } else {
      while (digit(i))
        ++i;
    }
    bool integral = true;
    if (i < s_.size() && s_[i] == '.') {
      integral = false;
      ++i;
      if (!digit(i))
        return fail_at(i, "invalid number (expected a digit after '.')");
      while (digit(i))
        ++i;
    }
    if (i < s_.size() && (s_[i] == 'e' || s_[i] == 'E')) {
      integral = false;
      ++i;
      if (i < s_.size() && (s_[i] == '+' || s_[i] == '-'))
        ++i;
      if (!digit(i))
        return fail_at(i, "invalid number (expected a digit in the exponent)");
      while (digit(i))
        ++i;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + i;
    pos_ = i;
    if (integral) {
      std::int64_t v = 0;
      auto [p, ec] = std::from_chars(first, last, v);
      if (ec == std::errc{} && p == last) {
        out = json_value{v};
        return true;
      }
      // Too large for int64: fall through to double, as most JSON readers do.
    }
    double d = 0;
    auto [p, ec] = std::from_chars(first, last, d);
    if (ec == std::errc::result_out_of_range) {
      // Underflow reads as zero (as in strtod); overflow has no finite value and is refused.
      std::string copy{first, last};
      d = std::strtod(copy.c_str(), nullptr);
      if (std::isinf(d))
        return fail_at(start, "number out of range");
      out = json_value{d};
      return true;
    }
    if (ec != std::errc{} || p != last)
      return fail_at(start, "invalid number");
    out = json_value{d};
    return true;
  }

  std::string_view s_;
  std::string_view source_;
  std::size_t pos_ = 0;
  std::string message_;
};

} // namespace

result<json_value> parse_json(std::string_view text, std::string_view source) {
  return parser{text, source}.run();
}

result<json_value> read_json_file(const std::filesystem::path& path) {
  auto text = read_file(path);
  if (!text)
    return text.error();
  return parse_json(*text, path.string());
}

void write_json(json_writer& w, const json_value& v) {
  switch (v.type()) {
    case json_value::kind::null: w.null(); break;
    case json_value::kind::boolean: w.value(v.as_bool()); break;
    case json_value::kind::integer: w.value(v.as_int()); break;
    case json_value::kind::real: w.value(v.as_double()); break;
    case json_value::kind::string: w.value(v.as_string()); break;
    case json_value::kind::array:
      w.begin_array();
      for (const auto& x : v.as_array())
        write_json(w, x);
      w.end_array();
      break;
    case json_value::kind::object:
      w.begin_object();
      for (const auto& m : v.as_object()) {
        w.key(m.key);
        write_json(w, m.value);
      }
      w.end_object();
      break;
  }
}

std::string to_json_text(const json_value& v) {
  json_writer w;
  write_json(w, v);
  return std::move(w).take();
}

} // namespace crucible
