#include "env/eval/recheck.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "env/reward.hpp"

namespace crucible::env {

namespace {

// "4.125x on <device>"
std::string measured(double speedup, std::string_view device) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3fx on ", speedup);
  return buf + std::string{device};
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%%", 100 * fraction);
  return buf;
}

std::string with_note(const std::string& message, const std::string& note) {
  return message.empty() ? note : message + "; " + note;
}

} // namespace

bool needs_recheck(const verdict& v, const recheck_options& opt) noexcept {
  return v.status == verdict_status::ok && v.has_speedup() && v.speedup > opt.above;
}

verdict reconcile_recheck(const verdict& first, std::string_view first_device, const verdict& second,
                          std::string_view second_device, const recheck_options& opt) {
  auto both = measured(first.speedup, first_device) + " and " + measured(second.speedup, second_device);
  if (second.status != verdict_status::ok || !second.has_speedup()) {
    auto out = second;
    out.message = with_note(out.message, "this was the recheck on " + std::string{second_device} + " of "
                                           + measured(first.speedup, first_device));
    return out;
  }
  auto lo = std::min(first.speedup, second.speedup);
  auto hi = std::max(first.speedup, second.speedup);
  if ((hi - lo) / lo <= opt.tolerance) {
    // The lower one whole: its speedup, band, times and reward belong together.
    auto out = second.speedup < first.speedup ? second : first;
    out.message = with_note(out.message, "recheck agrees: " + both + " (within " + percent(opt.tolerance) + ")");
    return out;
  }
  auto out = first;
  out.status = verdict_status::rejected;
  out.speedup = out.speedup_spread = out.ref_ms = out.cand_ms = NAN;
  if (std::find(out.checks_failed.begin(), out.checks_failed.end(), "runtime:recheck") == out.checks_failed.end())
    out.checks_failed.push_back("runtime:recheck");
  out.message = "measurements of a large speedup on two devices of the same kind disagree: " + both
                + " differ by more than " + percent(opt.tolerance);
  out.reward = compute_reward(out, opt.reward);
  out.cache_hit = false; // decided by a fresh measurement, whatever the first one was
  return out;
}

verdict recheck_lost(verdict first, std::string_view why) {
  first.message = with_note(first.message, "the recheck on a second device was lost: " + std::string{why});
  return first;
}

} // namespace crucible::env
