// core/json.hpp: a streaming JSON writer for metrics lines, verdicts and status files (strings
// escaped by nlohmann/json, numbers written by std::to_chars).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace crucible {

/// Appends `text` to `out` as a JSON string literal (quotes included), as nlohmann/json writes
/// it: control characters escaped, other UTF-8 kept, invalid UTF-8 replaced by U+FFFD, so the
/// output is always valid JSON.
void append_json_string(std::string& out, std::string_view text);

/// Builds one JSON document in a string. Non-finite doubles become null. The caller pairs
/// begin/end calls; misuse is a bug (asserted). Not thread-safe.
class json_writer {
public:
  json_writer& begin_object();
  json_writer& end_object();
  json_writer& begin_array();
  json_writer& end_array();
  /// Object key; the next call writes its value.
  json_writer& key(std::string_view k);

  json_writer& value(std::string_view v);
  json_writer& value(const char* v) { return value(std::string_view{v}); }
  json_writer& value(const std::string& v) { return value(std::string_view{v}); }
  json_writer& value(bool v);
  json_writer& value(double v);
  json_writer& value(std::int64_t v);
  json_writer& value(std::uint64_t v);
  json_writer& value(int v) { return value(static_cast<std::int64_t>(v)); }
  json_writer& value(unsigned v) { return value(static_cast<std::uint64_t>(v)); }
  json_writer& null();
  /// Writes `json`, a complete JSON value the caller has already validated (e.g. an array kept
  /// as canonical text), unchanged.
  json_writer& raw(std::string_view json);
  json_writer& value(const std::vector<std::string>& v);

  /// Shorthand for key(k).value(v).
  template <class T>
  json_writer& field(std::string_view k, const T& v) {
    key(k);
    return value(v);
  }

  /// The document so far.
  const std::string& str() const noexcept { return out_; }
  std::string take() && { return std::move(out_); }

private:
  void before_value();

  std::string out_;
  std::vector<bool> first_; // one entry per open container: no element written yet
  bool after_key_ = false;
};

} // namespace crucible
