// What the evaluator is asked to judge: one candidate for one task (env/eval/evaluator.hpp judges
// it, env/eval/evaluation.hpp carries it through one verdict).
#pragma once

#include <cstdint>
#include <string>

#include "env/task.hpp"

namespace crucible::env {

/// One candidate for one task.
struct eval_request {
  task target;
  std::string candidate;   ///< Python source defining ModelNew
  std::uint64_t seed = 0;  ///< 0: a fresh random seed
  bool use_cache = true;
  /// The task alone (device_evaluator::check_task): its reference is built and run once, on one
  /// trial's inputs, and `candidate` is not looked at.
  bool reference_only = false;
};

} // namespace crucible::env
