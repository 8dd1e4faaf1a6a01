// core/json_parse.hpp: JSON documents as crucible's json_value (read by nlohmann/json, strict
// RFC 8259): tokenizer.json, tokenizer_config.json, model configs, records and helpers' output.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/error.hpp"

namespace crucible {

class json_writer;

class json_value;
struct json_member;

/// A JSON array: its elements in document order.
using json_array = std::vector<json_value>;
/// A JSON object: its members in document order (duplicate keys are kept, `find` sees the first).
using json_object = std::vector<json_member>;

/// One parsed JSON value. Integers without fraction or exponent that fit in int64 are
/// integers; every other number is a double. Strings hold UTF-8. Value type; immutable after
/// parsing, so concurrent readers are safe.
///
/// An integer beyond int64 that fits uint64 (a counter near 2^64) is a double to type(),
/// is_int() and as_double(), as every other large number, but keeps its exact value for
/// is_uint() and as_uint().
class json_value {
public:
  enum class kind : std::uint8_t { null, boolean, integer, real, string, array, object };

  json_value() = default;
  explicit json_value(bool b) : v_(b) {}
  explicit json_value(std::int64_t i) : v_(i) {}
  /// An integer: int64 where it fits, else a double that keeps its exact uint64 value.
  explicit json_value(std::uint64_t u);
  explicit json_value(double d) : v_(d) {}
  explicit json_value(std::string s) : v_(std::move(s)) {}
  explicit json_value(const char* s) : v_(std::string{s}) {}
  explicit json_value(json_array a) : v_(std::move(a)) {}
  explicit json_value(json_object o) : v_(std::move(o)) {}

  kind type() const noexcept { return v_.index() == big_uint ? kind::real : static_cast<kind>(v_.index()); }
  bool is_null() const noexcept { return type() == kind::null; }
  bool is_bool() const noexcept { return type() == kind::boolean; }
  bool is_int() const noexcept { return type() == kind::integer; }
  /// An integer or a double.
  bool is_number() const noexcept { return type() == kind::integer || type() == kind::real; }
  /// A non-negative integer that fits uint64: an integer >= 0, or an integer beyond int64 that
  /// the text wrote without fraction or exponent.
  bool is_uint() const noexcept { return (is_int() && as_int() >= 0) || v_.index() == big_uint; }
  bool is_string() const noexcept { return type() == kind::string; }
  bool is_array() const noexcept { return type() == kind::array; }
  bool is_object() const noexcept { return type() == kind::object; }

  /// Accessors; calling one for the wrong kind is a bug (asserted).
  bool as_bool() const { return std::get<bool>(v_); }
  std::int64_t as_int() const { return std::get<std::int64_t>(v_); }
  /// The number as a double (integers are converted).
  double as_double() const;
  /// The value of an is_uint() number, exactly.
  std::uint64_t as_uint() const;
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const json_array& as_array() const { return std::get<json_array>(v_); }
  const json_object& as_object() const { return std::get<json_object>(v_); }

  /// The first member named `key`, or nullptr when there is none or this is not an object.
  /// A linear scan: meant for objects with a handful of keys.
  const json_value* find(std::string_view key) const;

  /// "null", "boolean", "integer", "number", "string", "array" or "object", for messages.
  static const char* kind_name(kind k) noexcept;

private:
  // The alternatives follow `kind`; the last, an integer beyond int64, reads as kind::real.
  static constexpr std::size_t big_uint = 7;
  std::variant<std::monostate, bool, std::int64_t, double, std::string, json_array, json_object, std::uint64_t> v_;
};

/// One member of a JSON object.
struct json_member {
  std::string key;
  json_value value;
};

/// Typed reads of a value that may be missing (find's result): nullopt where it is (nullptr) or
/// is of another kind (1.5 asked as an integer, a quoted "3" asked as a number, -1 asked as
/// unsigned).
std::optional<std::int64_t> json_int(const json_value* n);
std::optional<std::uint64_t> json_uint(const json_value* n);
std::optional<double> json_double(const json_value* n);
std::optional<bool> json_bool(const json_value* n);
std::optional<std::string> json_string(const json_value* n);

/// Parses one JSON document with nlohmann/json (surrounding whitespace and a leading UTF-8
/// byte-order mark allowed, nothing else). Strict: no comments, trailing commas, NaN, leading
/// zeros, control characters in strings, invalid UTF-8 or lone surrogates; nesting deeper than
/// 512 levels is refused. Errors are errc::corrupt with "SOURCE:LINE:COLUMN: what" (what is
/// nlohmann's description), `source` naming the file (or "json").
result<json_value> parse_json(std::string_view text, std::string_view source = "json");

/// Reads and parses a JSON file. errc::not_found / errc::io name the file; parse errors as
/// in parse_json with the path as source.
result<json_value> read_json_file(const std::filesystem::path& path);

/// Writes `v` with `w`: members in document order, numbers as json_writer writes them
/// (shortest round trip), strings escaped as json_writer escapes them.
void write_json(json_writer& w, const json_value& v);
/// `v` as compact JSON text.
std::string to_json_text(const json_value& v);

} // namespace crucible
