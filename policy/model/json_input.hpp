// policy/model/json_input.hpp: small JSON documents (safetensors headers, config.json, shard
// indexes) read through yaml-cpp, whose flow syntax is a superset of JSON. Internal to policy/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>

#include "core/error.hpp"

namespace crucible::policy::json_input {

/// Parses `text` as one JSON document. errc::corrupt naming `origin` (a file name) and yaml-cpp's
/// line and column on a syntax error.
result<YAML::Node> parse(std::string_view text, std::string_view origin);

/// True for a JSON string (a quoted scalar); false for numbers, booleans, null, containers.
bool is_string(const YAML::Node& n);

/// The first key that occurs twice in map `n`, or nullopt. yaml-cpp keeps duplicates.
std::optional<std::string> duplicate_key(const YAML::Node& n);

/// Converts a scalar, or nullopt when it has another type (e.g. 1.5 asked as an integer,
/// a quoted "3" asked as a number).
std::optional<std::int64_t> as_int(const YAML::Node& n);
std::optional<std::uint64_t> as_uint(const YAML::Node& n);
std::optional<double> as_double(const YAML::Node& n);
std::optional<bool> as_bool(const YAML::Node& n);
std::optional<std::string> as_string(const YAML::Node& n);

} // namespace crucible::policy::json_input
