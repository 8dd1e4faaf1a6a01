// env/prompt/template_file.hpp: what the project's template files (the prompt's, the multi-turn
// feedback's) share when they are read: the YAML map at the top, its unknown keys, and where a
// node stands in the file. Internal to env/prompt/prompt.cpp and env/feedback.cpp.
#pragma once

#include <yaml-cpp/yaml.h>

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace crucible::env {

/// "FILE:LINE" of node `n` (FILE alone where the node has no place).
inline std::string where(const std::string& origin, const YAML::Node& n) {
  auto m = n.Mark();
  return m.line >= 0 ? origin + ":" + std::to_string(m.line + 1) : origin;
}

/// The top-level map of a template file's text: errc::config naming the file (and line) when it
/// is not YAML or not a map of `what`; each key not in `known` is added to `problems`.
inline result<YAML::Node> template_root(std::string_view yaml_text, const std::string& origin, const char* what,
                                        const std::set<std::string>& known, std::vector<std::string>& problems) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string{yaml_text});
  } catch (const YAML::ParserException& e) {
    return fail(errc::config, origin, ":", std::to_string(e.mark.line + 1), ": not valid YAML: ", e.msg);
  }
  if (!root.IsMap())
    return fail(errc::config, origin, ": expected a map of ", what, " at the top level");
  for (auto it = root.begin(); it != root.end(); ++it) {
    const auto key = it->first.IsScalar() ? it->first.Scalar() : std::string{"?"};
    if (known.count(key) == 0)
      problems.push_back(where(origin, it->first) + ": " + key + ": unknown key");
  }
  return root;
}

} // namespace crucible::env
