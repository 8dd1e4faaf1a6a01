// core/string_map.hpp: hash maps keyed by std::string that can be probed with a string_view
// (no temporary string per lookup).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace crucible {

/// Transparent string hash for heterogeneous lookup.
struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

/// std::unordered_map<std::string, V> whose find() also takes a string_view.
template <class V>
using string_map = std::unordered_map<std::string, V, string_hash, std::equal_to<>>;

} // namespace crucible
