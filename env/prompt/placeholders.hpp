// env/prompt/placeholders.hpp: the `{name}` placeholders of the project's text templates (the prompt's,
// the multi-turn feedback's): one pass, so substituted values (code full of braces) are never
// scanned again.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace crucible::env {

/// `text` with each `{name}` replaced by vars' value for name; `{{` and `}}` are literal braces.
/// On a malformed or unknown placeholder returns false with `problem` saying which (and the
/// placeholders allowed). `used`, when given, collects the names that occurred.
bool substitute_placeholders(std::string_view text, const std::vector<std::pair<std::string, std::string>>& vars,
                             std::string& out, std::string& problem, std::set<std::string>* used = nullptr);

} // namespace crucible::env
