// jinja/lexer.cpp: normalised template source in, tokens out (to parser.cpp): text, tags and the
// names, literals and operators inside them, following jinja2's own lexer rule by rule, with
// trim_blocks, lstrip_blocks and the `-`/`+` whitespace control.
#include <cctype>
#include <charconv>
#include <cstring>

#include "core/utf8.hpp"
#include "jinja/detail.hpp"

namespace crucible::jinja::detail {

namespace {

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

} // namespace

std::vector<token> lex(const std::string& source) { return lexer{source}.run(); }

} // namespace crucible::jinja::detail
