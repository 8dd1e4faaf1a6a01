#include "env/eval/timing.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace crucible::env {

double median(std::vector<double> v) {
  assert(!v.empty());
  auto mid = v.begin() + static_cast<long>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2 == 1)
    return *mid;
  auto lo = *std::max_element(v.begin(), mid);
  return (lo + *mid) / 2;
}

double quantile(std::vector<double> v, double q) {
  assert(!v.empty());
  std::sort(v.begin(), v.end());
  const double at = std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(at);
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (at - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

double student_t95(std::size_t df) noexcept {
  static const double table[] = {0,      12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365,
                                 2.306, 2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
                                 2.120, 2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069,
                                 2.064, 2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  if (df == 0)
    return INFINITY;
  if (df <= 30)
    return table[df];
  return 1.96 + 2.4 / static_cast<double>(df); // within 0.3% of the exact quantile for df > 30
}

timing_summary summarize_rounds(const std::vector<double>& ref_ms, const std::vector<double>& cand_ms,
                                const timing_policy& policy) {
  assert(ref_ms.size() == cand_ms.size());
  assert(policy.buckets >= 2 && ref_ms.size() >= policy.buckets);
  timing_summary s;
  s.rounds = ref_ms.size();
  std::vector<double> ratios(s.rounds);
  for (size_t i = 0; i < s.rounds; ++i)
    ratios[i] = ref_ms[i] / cand_ms[i];
  // Consecutive rounds per bucket: drift over time (clocks, thermals, other tenants) shows as
  // buckets that disagree, which a pooled mean would hide.
  auto k = policy.buckets;
  for (size_t b = 0; b < k; ++b) {
    auto lo = b * s.rounds / k;
    auto hi = (b + 1) * s.rounds / k;
    double sum = 0;
    for (auto i = lo; i < hi; ++i)
      sum += ratios[i];
    s.bucket_means.push_back(sum / static_cast<double>(hi - lo));
  }
  s.speedup = median(s.bucket_means);
  double mean = 0;
  for (auto m : s.bucket_means)
    mean += m;
  mean /= static_cast<double>(k);
  double var = 0;
  for (auto m : s.bucket_means)
    var += (m - mean) * (m - mean);
  var /= static_cast<double>(k - 1);
  s.spread = student_t95(k - 1) * std::sqrt(var / static_cast<double>(k)) / s.speedup;
  s.band = std::hypot(s.spread, policy.band_floor);
  auto [mn, mx] = std::minmax_element(s.bucket_means.begin(), s.bucket_means.end());
  s.disagreement = (*mx - *mn) / s.speedup;
  s.ref_ms = median(ref_ms);
  s.cand_ms = median(cand_ms);
  s.stable = s.spread <= policy.max_spread && s.disagreement <= policy.max_bucket_disagreement;
  return s;
}

bool band_clears(const timing_summary& s, double threshold) noexcept {
  return std::isfinite(s.band) && std::isfinite(s.speedup) && s.speedup * (1.0 - s.band) > threshold;
}

double credited_speedup(const timing_summary& s, double threshold, bool no_own_work) noexcept {
  const bool capped = no_own_work || (s.speedup > 1.0 && !band_clears(s, threshold));
  return round_toward_one(capped ? std::min(s.speedup, 1.0) : s.speedup);
}

bool may_stop_early(const timing_summary& first, double early_stop_spread, const timing_policy& policy) noexcept {
  return early_stop_spread > 0 && std::isfinite(first.spread) && first.spread <= early_stop_spread
         && first.disagreement <= policy.max_bucket_disagreement;
}

bool clearly_slower(const timing_summary& first, double below) noexcept {
  if (!std::isfinite(first.band) || !std::isfinite(first.speedup) || first.bucket_means.empty())
    return false;
  // Every bucket too: a candidate that turns faster within the look (or any drift toward the
  // bar) is not stopped on its early rounds.
  const double fastest = *std::max_element(first.bucket_means.begin(), first.bucket_means.end());
  return first.speedup * (1.0 + first.band) < below && fastest < below;
}

double round_toward_one(double speedup) noexcept {
  if (!std::isfinite(speedup))
    return speedup;
  // The epsilon keeps values that are exact in decimal (1.23 stored as 1.2299999...) in place.
  if (speedup >= 1.0)
    return std::floor(speedup * 100.0 + 1e-9) / 100.0;
  return std::ceil(speedup * 100.0 - 1e-9) / 100.0;
}

} // namespace crucible::env
