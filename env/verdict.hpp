// env/verdict.hpp: the verdict on one candidate (DESIGN §3), as `crucible eval --json` prints it.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crucible {
class json_value;
}

namespace crucible::env {

/// Outcome classes of an evaluation. Values are part of the JSON contract.
enum class verdict_status : std::uint8_t {
  ok,            ///< correct; speedup measured
  incorrect,     ///< ran, but outputs differ from the reference (or wrong type/shape/dtype)
  compile_error, ///< the candidate module or its extension did not build or import
  runtime_error, ///< an exception, crash, signal or out-of-memory while running
  timeout,       ///< a wall-clock deadline passed; the worker was killed
  rejected,      ///< an anti-hacking check failed (named in checks_failed)
  format_error,  ///< the policy's response had no usable code (never reaches an evaluator)
};

/// "ok", "compile_error", ...
const char* to_string(verdict_status s) noexcept;
/// Inverse of to_string; nullopt for any other text.
std::optional<verdict_status> parse_verdict_status(std::string_view s) noexcept;

/// True if `s` is one of the enumerators (a value read from a file or the wire may not be).
constexpr bool is_valid(verdict_status s) noexcept {
  return static_cast<std::uint8_t>(s) <= static_cast<std::uint8_t>(verdict_status::format_error);
}

/// One kernel (on a device; an operator on the CPU) of the candidate's profiled call and its
/// share of that call's time.
struct kernel_share {
  std::string name;
  double share = 0; ///< in [0, 1]
  friend bool operator==(const kernel_share&, const kernel_share&) = default;
};

/// What the task's reference does in one call (on trial 0's inputs), counted in the reference's
/// worker before any candidate code exists: floating-point operations by the dtype of their
/// inputs (the matrix products, convolutions and attention that torch's FLOP counter knows;
/// elementwise work is not counted), and the bytes of its inputs and outputs, each of which a call
/// reads or writes at least once. What a lower bound on a call's time on the device is made of.
struct task_work {
  std::map<std::string, double> flops; ///< dtype name ("float32", "bfloat16", ...) to operations
  double bytes_read = NAN;             ///< the inputs' tensors' bytes; NaN: not counted
  double bytes_written = NAN;          ///< the outputs' tensors' bytes
  bool counted() const noexcept { return !std::isnan(bytes_read); }
  friend bool operator==(const task_work&, const task_work&) noexcept;
};

/// A task_work from its JSON (`{"flops": {DTYPE: N}, "bytes_read": N, "bytes_written": N}`, as
/// to_json writes it and the reference's worker sends it): none where a field is missing, a count
/// is not a finite number of 0 or more, or a dtype's name is empty or 32 characters or longer.
std::optional<task_work> task_work_from_json(const json_value& w);

/// A lower bound on one call's time on the verdict's device (env/eval/limits.hpp, bound_of): the
/// larger of the task's bytes (its inputs read once, its outputs written) at the device's copy
/// rate and its FLOPs at their dtype's fastest matrix-product rate, both rates measured on that
/// hardware. The FLOP part counts the reference's own algorithm (a candidate that needs fewer
/// operations can be faster than it); NaN everywhere where it is not known (no peaks for the
/// hardware, or the work not counted).
struct task_bound {
  double ms = NAN;       ///< max(bytes_ms, flops_ms)
  double bytes_ms = NAN; ///< (bytes read + bytes written) / the copy rate
  double flops_ms = NAN; ///< the sum over dtypes of FLOPs / the dtype's matrix-product rate
  bool known() const noexcept { return !std::isnan(ms); }
  friend bool operator==(const task_bound&, const task_bound&) noexcept;
};

/// A task_bound from its JSON (`{"ms": N, "bytes_ms": N, "flops_ms": N}`, as to_json writes it):
/// none where a field is missing or not a finite number of 0 or more, or `ms` is not the larger.
std::optional<task_bound> task_bound_from_json(const json_value& b);

/// Everything the evaluator says about one candidate. Plain value; it is also the verdict
/// message the actors exchange (actors/messages.hpp holds its inspect()).
struct verdict {
  verdict_status status = verdict_status::runtime_error;
  bool correct = false;
  double speedup = NAN;        ///< reference time / candidate time; NaN unless status is ok
  double speedup_spread = NAN; ///< relative half-width of the speedup's band: the rounds' 95% band and evaluator.band_floor in quadrature
  double ref_ms = NAN;         ///< median reference time per call
  double cand_ms = NAN;        ///< median candidate time per call
  double reward = 0.0;
  std::vector<std::string> checks_failed; ///< e.g. "static:threads", "runtime:patched"
  std::string message;                    ///< what happened, for people
  std::string hardware;                   ///< device model, e.g. "NVIDIA H100 80GB HBM3"
  bool cache_hit = false;
  std::uint32_t rounds = 0;   ///< timed rounds behind the speedup
  double wall_s = 0.0;        ///< wall time of the evaluation
  std::string baseline = "eager";
  /// The candidate's own profile, for the feedback of a multi-turn episode (env/prompt/feedback.hpp):
  /// the kernels that took most of its profiled trial call, largest first (at most 5), and the
  /// share of that call's time in kernels the reference's call did not run (NaN: not known). Both
  /// are counted in the candidate's process: they tell the policy where its time goes and never
  /// enter the reward. Empty and NaN where no trial profiled it (a verdict that failed before
  /// the second call of trial 0, or one cached before verdicts carried a profile).
  std::vector<kernel_share> profile;
  double own_share = NAN;
  /// The settings that decide the precision of arithmetic (TF32 and reduced-precision matmul
  /// allowances, float32_matmul_precision, fp32_precision, ...) each side's calls ran with, name to
  /// value as the harness read them: the reference's are the harness's; the candidate's are the
  /// same with any it chose for itself (its outputs are judged as they come out). Empty where the
  /// verdict ended before the side reported them, or in verdicts cached before they carried them.
  std::map<std::string, std::string> precision_reference, precision_candidate;
  /// How the verdict was judged: "boundary" (the reference and the candidate in two workers, the
  /// evaluator timing and checking every timed call: every verdict now), "shared" (one worker for
  /// both: a debugging mode, removed; in verdicts cached or stored before), or "" (a task checked
  /// alone, or a verdict cached before verdicts carried it).
  std::string judged;
  /// The reference's work in one call (task_work); not counted in a task checked alone before
  /// verdicts carried it, or where the worker could not count it.
  task_work work;
  /// The lower bound on a call's time on this hardware (task_bound); not known where the
  /// evaluator has no peaks for its hardware (evaluator.limits) or the work was not counted.
  task_bound bound;
  /// The part of `bound` the candidate's call is measured against: the whole bound, or its bytes
  /// part alone where the candidate's median call beat the FLOP part. The FLOP part counts the
  /// reference's algorithm, so a candidate faster than it did fewer operations (CUDA-L1's
  /// level1/12 kernel scales rows where its reference multiplies by a dense diagonal matrix: 5.6
  /// of the whole bound on an H200); the bytes part holds for any candidate that reads its inputs.
  bool beat_flops() const noexcept { return cand_ms < bound.flops_ms; }
  double cand_bound_ms() const noexcept { return beat_flops() ? bound.bytes_ms : bound.ms; }
  /// Which part that is, as the verdict's JSON and the run's records name it: "bytes_ms" or "ms".
  const char* fraction_of() const noexcept { return beat_flops() ? "bytes_ms" : "ms"; }
  /// cand_bound_ms() / cand_ms and bound.ms / ref_ms: how close each side's median call came to
  /// the limit (1.0 is at it); NaN where either number is not known.
  double fraction() const noexcept { return cand_bound_ms() / cand_ms; }
  double ref_fraction() const noexcept { return bound.ms / ref_ms; }
  /// The candidate's settings that differ from the reference's: "name: candidate (reference X)".
  std::vector<std::string> precision_changes() const;

  bool has_speedup() const noexcept { return !std::isnan(speedup); }

  /// Field-wise equality in which two NaN numbers ("no value") are equal.
  friend bool operator==(const verdict& x, const verdict& y) noexcept;
};

/// One JSON object with the DESIGN §3 fields (null where a number is absent) plus
/// `rounds`, `wall_s` and `baseline`.
std::string to_json(const verdict& v);

/// Parses what to_json wrote (used by the verdict cache). nullopt if malformed.
std::optional<verdict> verdict_from_json(std::string_view json);

} // namespace crucible::env
