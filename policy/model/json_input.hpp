// policy/model/json_input.hpp: small JSON documents (safetensors headers, config.json, shard
// indexes) read as core/json_parse's json_value (its json_int, json_string, ... refuse a value of
// another kind). Internal to policy/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "core/json_parse.hpp"

namespace crucible::policy::json_input {

/// Parses `text` as one strict JSON document. errc::corrupt "ORIGIN:LINE:COLUMN: not valid JSON:
/// why" on a syntax error, `origin` naming the file.
result<json_value> parse(std::string_view text, std::string_view origin);

/// The first key that occurs twice in object `n`, or nullopt (json_value keeps duplicates).
std::optional<std::string> duplicate_key(const json_value& n);

/// `n` as an error message quotes it: a string's text, any other value as JSON, "" where missing.
std::string text_of(const json_value* n);

} // namespace crucible::policy::json_input
