// core/ids.hpp: strongly typed identifiers stamped on tasks, variants, groups and weights.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <string>

namespace crucible {

/// A value with a tag type, so a group id cannot be passed where a variant id is expected.
template <class Tag, class T>
struct strong_id {
  using value_type = T;
  T value{};

  friend auto operator<=>(const strong_id&, const strong_id&) = default;
  friend bool operator==(const strong_id&, const strong_id&) = default;
};

/// Task name as it appears in a task directory, e.g. "level1/19_ReLU".
using task_id = strong_id<struct task_tag, std::string>;
/// One evaluated candidate (a variant of a task); unique within a run.
using variant_id = strong_id<struct variant_tag, std::uint64_t>;
/// One GRPO group: G completions of one prompt.
using group_id = strong_id<struct group_tag, std::uint64_t>;
/// Version of the policy weights; 0 is the initial model, each learner update adds one.
using policy_version = strong_id<struct version_tag, std::uint64_t>;
/// A node of the cluster as it announced itself, e.g. "gpu-node-3:4711".
using node_id = strong_id<struct node_tag, std::string>;

inline std::string to_string(const task_id& x) { return x.value; }
inline std::string to_string(const node_id& x) { return x.value; }
inline std::string to_string(const variant_id& x) { return "v" + std::to_string(x.value); }
inline std::string to_string(const group_id& x) { return "g" + std::to_string(x.value); }
inline std::string to_string(const policy_version& x) { return "p" + std::to_string(x.value); }

} // namespace crucible

template <class Tag, class T>
struct std::hash<crucible::strong_id<Tag, T>> {
  std::size_t operator()(const crucible::strong_id<Tag, T>& x) const noexcept {
    return std::hash<T>{}(x.value);
  }
};
