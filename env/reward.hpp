// env/reward.hpp: from a verdict to the scalar reward the learner sees.
#pragma once

#include "core/config.hpp"
#include "env/verdict.hpp"

namespace crucible::env {

/// The reward for `v` under `opt` (reward_options in core/config.hpp): failed statuses get
/// `opt.failed`, format errors `opt.format_error`, ok verdicts a function of the speedup.
double compute_reward(const verdict& v, const reward_options& opt) noexcept;

} // namespace crucible::env
