#include "env/reward.hpp"

#include <algorithm>
#include <cmath>

namespace crucible::env {

double compute_reward(const verdict& v, const reward_options& opt) noexcept {
  if (v.status == verdict_status::format_error)
    return opt.format_error;
  if (v.status != verdict_status::ok || !v.has_speedup() || v.speedup <= 0)
    return opt.failed;
  switch (opt.shape) {
    case reward_shape::speedup: return v.speedup;
    case reward_shape::log_speedup: return std::log(v.speedup);
    case reward_shape::clipped: return std::clamp(v.speedup, opt.clip_min, opt.clip_max);
  }
  return opt.failed;
}

} // namespace crucible::env
