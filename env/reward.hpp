// env/reward.hpp: from a verdict to the scalar reward the learner sees.
#pragma once

#include "core/config.hpp"
#include "env/verdict.hpp"

namespace crucible::env {

/// The reward for `v` under `opt` (reward_options in core/config.hpp): failed statuses get
/// `opt.failed`, format errors `opt.format_error`, ok verdicts a function of the speedup, plus
/// `opt.limit_weight` times the verdict's fraction of its hardware's limit (at most 1) where it
/// carries a bound.
double compute_reward(const verdict& v, const reward_options& opt) noexcept;

} // namespace crucible::env
