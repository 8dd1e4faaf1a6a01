#include "policy/model/json_input.hpp"

#include <set>

namespace crucible::policy::json_input {

result<YAML::Node> parse(std::string_view text, std::string_view origin) {
  try {
    return YAML::Load(std::string{text});
  } catch (const YAML::Exception& e) {
    return fail(errc::corrupt, origin, ": not valid JSON: ", e.what());
  }
}

bool is_string(const YAML::Node& n) {
  // yaml-cpp tags a quoted scalar "!" and a plain one "?": JSON strings are always quoted.
  // A missing key reads as an invalid node, on which yaml-cpp's type queries throw.
  return n.IsDefined() && n.IsScalar() && n.Tag() == "!";
}

std::optional<std::string> duplicate_key(const YAML::Node& n) {
  if (!n.IsDefined() || !n.IsMap())
    return std::nullopt;
  std::set<std::string> seen;
  for (const auto& kv : n) {
    auto key = kv.first.Scalar();
    if (!seen.insert(key).second)
      return key;
  }
  return std::nullopt;
}

namespace {

// Plain JSON scalars (numbers, true/false) only: a quoted "3" is a string, not a number.
template <class T>
std::optional<T> plain_as(const YAML::Node& n) {
  if (!n.IsDefined() || !n.IsScalar() || is_string(n))
    return std::nullopt;
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    return std::nullopt;
  }
}

} // namespace

std::optional<std::int64_t> as_int(const YAML::Node& n) { return plain_as<std::int64_t>(n); }

std::optional<std::uint64_t> as_uint(const YAML::Node& n) {
  // yaml-cpp converts "-1" to a huge unsigned value; refuse signs explicitly.
  if (n.IsDefined() && n.IsScalar() && !n.Scalar().empty() && n.Scalar()[0] == '-')
    return std::nullopt;
  return plain_as<std::uint64_t>(n);
}

std::optional<double> as_double(const YAML::Node& n) { return plain_as<double>(n); }

std::optional<bool> as_bool(const YAML::Node& n) {
  if (!n.IsDefined() || !n.IsScalar() || is_string(n))
    return std::nullopt;
  // yaml-cpp also accepts yes/no/on/off; JSON has only true and false.
  if (n.Scalar() == "true")
    return true;
  if (n.Scalar() == "false")
    return false;
  return std::nullopt;
}

std::optional<std::string> as_string(const YAML::Node& n) {
  if (!is_string(n))
    return std::nullopt;
  return n.Scalar();
}

} // namespace crucible::policy::json_input
