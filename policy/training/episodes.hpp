// policy/training/episodes.hpp: multi-turn episodes as plain numbers (docs/training.md, "Multi-turn
// episodes"). A turn's return from the episode's per-turn rewards, turn-level advantages over a
// group of episodes that may end at different turns, and the rows an episode trains as: each
// turn's completion after the whole history before it, the feedback turns masked out of the loss.
// No torch types.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/learner_options.hpp"

namespace crucible::policy {

/// How a turn's return is made (core/learner_options.hpp: discounted, best, immediate).
using turn_return_kind = crucible::turn_return;

/// Each turn's return (same length as `rewards`). errc::invalid_arg for gamma outside [0, 1] or
/// a reward that is not finite (named by its turn).
result<std::vector<double>> turn_returns(std::span<const double> rewards, turn_return_kind kind, double gamma);

/// How returns become advantages across a group's episodes, turn by turn: at turn t only the
/// episodes that reached turn t take part (N_t of them).
/// - grpo: A = G - mean_t, divided by (std_t + eps) when std_normalize (std with Bessel's
///   correction, as group_advantages); 0 where N_t is 1 or all returns are equal.
/// - trloo: turn-level leave-one-out (TRLOO, Dr.Kernel): A_i = G_i - mean of the other N_t - 1
///   episodes' returns at turn t, never divided; 0 where N_t is 1.
using turn_advantage_kind = crucible::turn_advantage;

/// Advantages in the shape of `returns` (returns[i][t]: episode i's return at its turn t; episodes
/// may hold different numbers of turns). errc::invalid_arg for a return that is not finite.
result<std::vector<std::vector<double>>> turn_advantages(const std::vector<std::vector<double>>& returns,
                                                         turn_advantage_kind kind, bool std_normalize, double eps);

/// One episode as tokens: the first prompt; per turn the policy's completion; after each turn but
/// the last, the feedback the next turn begins with (its user message in the chat format, and the
/// assistant header before the next completion).
struct episode_tokens {
  std::vector<std::int32_t> prompt;
  std::vector<std::vector<std::int32_t>> completions;
  std::vector<std::vector<std::int32_t>> feedback; ///< completions.size() - 1 entries
};

/// The episode as one sequence: the tokens in order, a loss mask that is 1 on the completions'
/// tokens only (never on the prompt or a feedback turn), and each token's turn (-1 outside the
/// completions). errc::invalid_arg for an episode without turns, an empty prompt or a number of
/// feedback turns other than completions - 1.
struct episode_sequence {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> mask;
  std::vector<std::int32_t> turn;
};
result<episode_sequence> flatten(const episode_tokens& e);

/// Turn t as a training row: what the policy saw before it (the prompt, then each earlier
/// completion and its feedback) and what it wrote.
struct turn_row {
  std::size_t turn = 0;
  std::vector<std::int32_t> context;
  std::vector<std::int32_t> completion;
};
/// Every turn's row, in order (the same checks as flatten).
result<std::vector<turn_row>> turn_rows(const episode_tokens& e);

} // namespace crucible::policy
