#include "env/reward.hpp"

#include <algorithm>
#include <cmath>

namespace crucible::env {

double compute_reward(const verdict& v, const reward_options& opt) noexcept {
  if (v.status == verdict_status::format_error)
    return opt.format_error;
  if (v.status != verdict_status::ok || !v.has_speedup() || v.speedup <= 0)
    return opt.failed;
  // The fraction of the hardware's limit (evaluator.limits), where the weight asks for it and
  // the verdict has one: at most 1 (a candidate that needs less than the bytes the bound counts
  // can pass it).
  const double fraction = v.fraction();
  const double limit = opt.limit_weight != 0 && std::isfinite(fraction) && fraction > 0 ? opt.limit_weight * std::min(fraction, 1.0) : 0.0;
  switch (opt.shape) {
    case reward_shape::speedup: return v.speedup + limit;
    case reward_shape::log_speedup: return std::log(v.speedup) + limit;
    case reward_shape::clipped: return std::clamp(v.speedup, opt.clip_min, opt.clip_max) + limit;
  }
  return opt.failed;
}

} // namespace crucible::env
