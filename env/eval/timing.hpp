// env/eval/timing.hpp: from per-round reference and candidate times to a speedup with a confidence band.
#pragma once

#include <cstddef>
#include <vector>

namespace crucible::env {

/// How the per-round measurements are summarised.
struct timing_policy {
  std::size_t buckets = 5;            ///< consecutive rounds per bucket = rounds / buckets
  double max_spread = 0.02;           ///< a wider band (relative half-width) asks for more rounds
  double max_bucket_disagreement = 0.05; ///< (max - min bucket mean) / speedup above this: more rounds
  double win_threshold = 1.01;        ///< a speedup counts as a win only above this
  /// Relative half-width that repeated verdicts of one kernel vary by beyond their own rounds'
  /// band (a fresh worker, its allocations, the device's state): added in quadrature to the
  /// rounds' band to give the band a verdict reports and credits by (timing_summary::band).
  double band_floor = 0;
};

/// The summary of paired rounds. Plain value.
struct timing_summary {
  double speedup = 0;        ///< median of the bucket means of per-round ratios ref/cand
  double spread = 0;         ///< relative half-width of the 95% band of the bucket means
  double band = 0;           ///< the verdict's band: hypot(spread, policy.band_floor)
  double disagreement = 0;   ///< (max - min bucket mean) / speedup
  double ref_ms = 0;         ///< median reference time per round
  double cand_ms = 0;        ///< median candidate time per round
  std::size_t rounds = 0;
  std::vector<double> bucket_means;
  bool stable = false;       ///< spread and disagreement within the policy
};

/// Summarises rounds (ref_ms[i] and cand_ms[i] are one paired round). Needs at least
/// `policy.buckets` rounds with positive times (asserted). `stable` and early stopping judge
/// `spread` (more rounds narrow it); credit judges `band`, which more rounds cannot narrow below
/// the floor.
timing_summary summarize_rounds(const std::vector<double>& ref_ms, const std::vector<double>& cand_ms,
                                const timing_policy& policy);

/// Whether the whole band of `s` lies above `threshold`: speedup × (1 − band) > threshold.
/// Only then is a speedup credited (a NaN or infinite band never clears).
bool band_clears(const timing_summary& s, double threshold) noexcept;

/// The speedup a verdict credits from its summary: the measured speedup (rounded toward 1.00)
/// when the band clears `threshold`; at most 1.00 when it does not, or when the candidate ran
/// only the reference's own kernels (`no_own_work`). Below 1.00 the measured figure stands.
double credited_speedup(const timing_summary& s, double threshold, bool no_own_work) noexcept;

/// Whether a measurement may end with the rounds summarised in `first` (its first
/// evaluator.min_rounds rounds) instead of going on to evaluator.rounds: their band is already
/// within `early_stop_spread` (a fraction of policy.max_spread) and their buckets agree within
/// policy.max_bucket_disagreement. `early_stop_spread` 0 never stops early.
bool may_stop_early(const timing_summary& first, double early_stop_spread, const timing_policy& policy) noexcept;

/// Whether the rounds summarised in `first` (a measurement's first evaluator.slow_stop_rounds
/// rounds) show a clearly slower candidate, whose measurement may end there: the whole band lies
/// below `below` (speedup × (1 + band) < below) and so does every bucket's mean. A NaN or
/// infinite band never stops.
bool clearly_slower(const timing_summary& first, double below) noexcept;

/// The median of `v` (the mean of the two middle values of an even count). `v` non-empty.
double median(std::vector<double> v);

/// The `q` quantile of `v` (0 <= q <= 1), linear between the two nearest ranks. `v` non-empty.
double quantile(std::vector<double> v, double q);

/// Rounds a speedup to two decimals toward 1.00 (1.2369 → 1.23, 0.8731 → 0.88), so rounding
/// never flatters a candidate.
double round_toward_one(double speedup) noexcept;

/// Two-sided 95% Student-t quantile for `df` degrees of freedom.
double student_t95(std::size_t df) noexcept;

} // namespace crucible::env
