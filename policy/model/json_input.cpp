#include "policy/model/json_input.hpp"

#include <set>

namespace crucible::policy::json_input {

result<json_value> parse(std::string_view text, std::string_view origin) {
  auto doc = parse_json(text, origin);
  if (doc)
    return doc;
  // parse_json says "ORIGIN:LINE:COLUMN: why"; the position stays where it is.
  auto msg = doc.error().message;
  if (auto at = msg.find(": ", origin.size()); at != std::string::npos)
    msg.insert(at + 2, "not valid JSON: ");
  return crucible::error{errc::corrupt, std::move(msg)};
}

std::optional<std::string> duplicate_key(const json_value& n) {
  if (!n.is_object())
    return std::nullopt;
  std::set<std::string_view> seen;
  for (const auto& m : n.as_object())
    if (!seen.insert(m.key).second)
      return m.key;
  return std::nullopt;
}

std::string text_of(const json_value* n) {
  if (n == nullptr)
    return {};
  return n->is_string() ? n->as_string() : to_json_text(*n);
}

} // namespace crucible::policy::json_input
