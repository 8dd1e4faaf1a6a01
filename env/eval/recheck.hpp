// env/eval/recheck.hpp: a large speedup measured on two devices of the same kind becomes one verdict.
// The evaluator pool (actors/evaluator.cpp) runs the second measurement; the decision is here.
#pragma once

#include <string_view>

#include "core/config.hpp"
#include "env/verdict.hpp"

namespace crucible::env {

/// When a second device re-measures a speedup and how far the two may disagree.
struct recheck_options {
  double above = 3.0;      ///< evaluator.recheck_above: ok speedups above this are rechecked
  double tolerance = 0.10; ///< evaluator.recheck_tolerance: allowed difference, relative to the lower
  reward_options reward;   ///< reward: a rejected recheck gets the reward of a failed verdict

  /// The recheck settings of `evaluator:` with the `reward:` options of the same config.
  static recheck_options from(const evaluator_options& e, const reward_options& r) noexcept {
    return {e.recheck_above, e.recheck_tolerance, r};
  }
};

/// True if `v` must be measured again on a second device: ok, with a speedup above `opt.above`.
bool needs_recheck(const verdict& v, const recheck_options& opt) noexcept;

/// The one verdict for a candidate whose `first` verdict (on device `first_device`, a label
/// for messages) needed a recheck and got `second` on `second_device`:
///  - both ok and within `opt.tolerance` of each other (relative to the lower speedup): the
///    verdict with the lower speedup, its message noting both devices' speedups;
///  - both ok but further apart: `rejected`, `runtime:recheck` added to checks_failed, the
///    message naming both speedups and devices, no speedup, the reward of a failed verdict;
///  - `second` not ok: `second` (it says what went wrong there), its message noting the
///    speedup the first device measured.
verdict reconcile_recheck(const verdict& first, std::string_view first_device, const verdict& second,
                          std::string_view second_device, const recheck_options& opt);

/// `first` when its recheck could not be run or did not come back (`why`, e.g. "the
/// evaluator of cuda:1 went down"): the verdict stands, its message says the recheck was lost.
verdict recheck_lost(verdict first, std::string_view why);

} // namespace crucible::env
