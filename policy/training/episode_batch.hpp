// policy/training/episode_batch.hpp: a group of scored multi-turn episodes as the learner's GRPO
// groups (docs/training.md, "Multi-turn episodes"): each turn of each episode is one row, its
// context (the prompt and the earlier turns with their feedback, none of it in the loss) and its
// completion, with the turn's advantage across the group (policy/training/episodes.hpp).
#pragma once

#include <span>
#include <vector>

#include "policy/training/episodes.hpp"
#include "policy/training/learner.hpp"

namespace crucible::policy {

/// One episode as the rollouts give it to the learner.
struct scored_episode {
  /// The prompt, completions and feedback; with `contexts`, only the completions are read.
  episode_tokens tokens;
  /// Empty, or one per turn: the tokens the policy was sampled on at that turn (the prompt and
  /// the earlier turns with their feedback, as the engine was given them, older turns shortened
  /// where the prompt budget asked), which then are the turn's row's context as they are.
  std::vector<std::vector<std::int32_t>> contexts;
  std::vector<std::vector<float>> behaviour_log_probs; ///< per turn, one per completion token
  std::vector<double> rewards;                         ///< per turn, the verdict's reward
};

/// How a group of episodes becomes rows. Plain value.
struct episode_options {
  turn_return_kind returns = turn_return_kind::discounted;
  double gamma = 1.0;
  turn_advantage_kind advantages = turn_advantage_kind::grpo;
  bool std_normalize = true;
  double eps = 1e-6;
};

/// The GRPO groups of one group of episodes (episodes may end at different turns): one group a
/// (episode, turn), in episode then turn order, whose prompt is the turn's context and whose one
/// sample is its completion, with the turn's return as its reward and its advantage given.
/// errc::invalid_arg naming the episode for turns, log-probs and rewards that do not line up, and
/// as turn_returns / turn_advantages / turn_rows.
result<std::vector<grpo_group>> episode_groups(std::span<const scored_episode> episodes, const episode_options& opt,
                                               std::uint64_t policy_version);

} // namespace crucible::policy
