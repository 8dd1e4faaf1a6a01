// `{name}` placeholders of the project's text templates (env/prompt/placeholders.hpp).
#include "env/prompt/placeholders.hpp"

#include <algorithm>

namespace crucible::env {

bool substitute_placeholders(std::string_view text, const std::vector<std::pair<std::string, std::string>>& vars,
                             std::string& out, std::string& problem, std::set<std::string>* used) {
  out.clear();
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '}') {
      if (i + 1 < text.size() && text[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      problem = "a single '}' (write '}}' for a literal brace)";
      return false;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < text.size() && text[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    auto close = text.find('}', i + 1);
    std::string_view name = close == std::string_view::npos ? std::string_view{} : text.substr(i + 1, close - i - 1);
    bool ok_name = !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
      return (ch >= 'a' && ch <= 'z') || ch == '_';
    });
    if (!ok_name) {
      problem = "a '{' that does not start a placeholder (write '{{' for a literal brace)";
      return false;
    }
    auto it = std::find_if(vars.begin(), vars.end(), [&](const auto& v) { return v.first == name; });
    if (it == vars.end()) {
      std::string allowed;
      for (const auto& v : vars)
        allowed += (allowed.empty() ? "{" : ", {") + v.first + "}";
      problem = "unknown placeholder {" + std::string{name} + "} (allowed here: " + (allowed.empty() ? "none" : allowed) + ")";
      return false;
    }
    if (used != nullptr)
      used->insert(it->first);
    out += it->second;
    i = close;
  }
  return true;
}

} // namespace crucible::env
