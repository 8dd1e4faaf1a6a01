// core/json_parse.cpp: JSON read by nlohmann/json (its SAX interface) into crucible's json_value;
// positions are turned into line:column only when an error is reported.
#include "core/json_parse.hpp"

#include <cassert>
#include <climits>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/file_io.hpp"
#include "core/json.hpp"

namespace crucible {

json_value::json_value(std::uint64_t u) {
  if (u <= static_cast<std::uint64_t>(INT64_MAX))
    v_ = static_cast<std::int64_t>(u);
  else
    v_ = u;
}

double json_value::as_double() const {
  if (is_int())
    return static_cast<double>(as_int());
  if (v_.index() == big_uint)
    return static_cast<double>(std::get<std::uint64_t>(v_));
  return std::get<double>(v_);
}

std::uint64_t json_value::as_uint() const {
  if (v_.index() == big_uint)
    return std::get<std::uint64_t>(v_);
  assert(is_uint());
  return static_cast<std::uint64_t>(as_int());
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

constexpr std::size_t max_depth = 512;

// Builds a json_value from nlohmann/json's SAX events: the library reads and checks the text
// (RFC 8259, UTF-8, surrogates, numbers); this keeps members in document order, duplicates
// included, and refuses nesting deeper than max_depth.
class dom_builder {
public:
  explicit dom_builder(std::string_view text) : text_(text) {}

  bool null() { return add(json_value{}); }
  bool boolean(bool b) { return add(json_value{b}); }
  bool number_integer(std::int64_t i) { return add(json_value{i}); }
  // Beyond int64 a double, as integers beyond uint64 are, but one that keeps its exact value.
  bool number_unsigned(std::uint64_t u) { return add(json_value{u}); }
  bool number_float(double d, const std::string&) { return add(json_value{d}); }
  bool string(std::string& s) { return add(json_value{std::move(s)}); }
  bool binary(nlohmann::json::binary_t&) { return false; } // not produced by the JSON reader
  bool start_object(std::size_t) { return open(true); }
  bool key(std::string& k) {
    stack_.back().key = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(false); }
  bool end_array() { return close(); }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    // nlohmann's message less its "[json.exception.parse_error.101] parse error at line 1,
    // column 2: " prefix; the position is said once, as SOURCE:LINE:COLUMN.
    std::string_view what = e.what();
    if (auto p = what.find("] "); p != std::string_view::npos)
      what.remove_prefix(p + 2);
    if (what.starts_with("parse error"))
      if (auto p = what.find(": "); p != std::string_view::npos)
        what.remove_prefix(p + 2);
    fail(position == 0 ? 0 : position - 1, what);
    return false;
  }

  result<json_value> finish(std::string_view source) && {
    if (!error_.empty()) {
      auto [line, column] = line_column(error_at_);
      return crucible::error{errc::corrupt, std::string{source} + ":" + std::to_string(line) + ":"
                                                + std::to_string(column) + ": " + error_};
    }
    return std::move(root_);
  }

private:
  struct frame {
    bool object = false;
    std::string key;
    json_array items;
    json_object members;
  };

  bool add(json_value v) {
    if (stack_.empty()) {
      root_ = std::move(v);
    } else if (auto& f = stack_.back(); f.object) {
      f.members.push_back(json_member{std::move(f.key), std::move(v)});
    } else {
      f.items.push_back(std::move(v));
    }
    return true;
  }

  bool open(bool object) {
    if (stack_.size() >= max_depth) {
      fail(opener_at_depth(max_depth + 1), "nesting deeper than 512 levels");
      return false;
    }
    stack_.push_back(frame{.object = object});
    return true;
  }

  bool close() {
    frame f = std::move(stack_.back());
    stack_.pop_back();
    return add(f.object ? json_value{std::move(f.members)} : json_value{std::move(f.items)});
  }

  void fail(std::size_t at, std::string_view what) {
    if (error_.empty()) {
      error_at_ = at;
      error_ = what;
    }
  }

  // The offset of the '[' or '{' that opens nesting level `depth` (outside strings).
  std::size_t opener_at_depth(std::size_t depth) const {
    std::size_t level = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < text_.size(); ++i) {
      const char c = text_[i];
      if (in_string) {
        if (c == '\\')
          ++i;
        else if (c == '"')
          in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        if (++level == depth)
          return i;
      } else if (c == ']' || c == '}') {
        --level;
      }
    }
    return text_.size();
  }

  // 1-based line and column (columns count bytes) of offset `at`.
  std::pair<std::size_t, std::size_t> line_column(std::size_t at) const {
    std::size_t line = 1, line_start = 0;
    for (std::size_t i = 0; i < at && i < text_.size(); ++i)
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    return {line, at - line_start + 1};
  }

  std::string_view text_;
  json_value root_;
  std::vector<frame> stack_;
  std::string error_;
  std::size_t error_at_ = 0;
};

} // namespace

result<json_value> parse_json(std::string_view text, std::string_view source) {
  dom_builder builder{text};
  nlohmann::json::sax_parse(text.begin(), text.end(), &builder, nlohmann::json::input_format_t::json,
                            /*strict=*/true, /*ignore_comments=*/false);
  return std::move(builder).finish(source);
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
    case json_value::kind::real:
      if (v.is_uint())
        w.value(v.as_uint()); // exactly, as it was read
      else
        w.value(v.as_double());
      break;
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

std::optional<std::int64_t> json_int(const json_value* n) {
  if (n == nullptr || !n->is_int())
    return std::nullopt;
  return n->as_int();
}

std::optional<std::uint64_t> json_uint(const json_value* n) {
  if (n == nullptr || !n->is_uint())
    return std::nullopt;
  return n->as_uint();
}

std::optional<double> json_double(const json_value* n) {
  if (n == nullptr || !n->is_number())
    return std::nullopt;
  return n->as_double();
}

std::optional<bool> json_bool(const json_value* n) {
  if (n == nullptr || !n->is_bool())
    return std::nullopt;
  return n->as_bool();
}

std::optional<std::string> json_string(const json_value* n) {
  if (n == nullptr || !n->is_string())
    return std::nullopt;
  return n->as_string();
}

} // namespace crucible
