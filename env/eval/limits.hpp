// env/eval/limits.hpp: how fast a kind of hardware can go (its peaks, measured once per hardware by
// a reference worker: env/eval/harness/reference.py, measure_peaks) and the lower bound on a
// task's call they give with the task's work (env/verdict.hpp, task_work and task_bound). Every
// verdict on a hardware whose peaks are known carries its bound and both sides' fractions of it
// (docs/evaluator.md, "How far from the limit").
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "env/verdict.hpp"

namespace crucible {
class json_value;
}

namespace crucible::env {

/// One hardware's measured peaks: bytes per ms written (a fill) and copied (read and written: the
/// fastest of a byte copy, a float32 negation and a ReLU), and FLOPs per ms of a square matrix
/// product by dtype ("float64", "float32", "tf32", "float16", "bfloat16"; each the fastest seen).
struct device_peaks {
  std::string hardware;
  double write_bytes_per_ms = 0;
  double copy_bytes_per_ms = 0;
  /// The fewest bytes a call moved where the copy rate was measured (1 GiB on a GPU, 64 MiB on the
  /// CPU); 0 where the worker did not say. A call that moves fewer may run from caches, faster.
  double copy_bytes = 0;
  std::map<std::string, double> matmul_flops_per_ms;
  /// The copy rate as the worker measured it, before any raise_copy_rate (0: never raised).
  double copy_measured = 0;
  friend bool operator==(const device_peaks&, const device_peaks&) = default;
};

/// The peaks a worker reported (`{"write_bytes_per_ms": N, "copy_bytes_per_ms": N, "copy_bytes": N,
/// "matmul_flops_per_ms": {DTYPE: N}}`; `copy_bytes` may be absent) for `hardware`: none where a
/// rate is missing, not finite or not above 0, `copy_bytes` is given and not a finite number above
/// 0, no matrix-product rate is given, or a dtype's name is empty or 32 characters or longer.
std::optional<device_peaks> peaks_from_json(const json_value& p, std::string hardware);
/// The peaks as one JSON object with their hardware.
std::string to_json(const device_peaks& p);

/// The bound of one call of `work` on hardware with `peaks`: the bytes read and written at the
/// copy rate, and each dtype's FLOPs at its matrix-product rate (float32's at the faster of
/// float32's and TF32's, where the hardware has TF32: a candidate may use it where its outputs
/// stay within the tolerance; a dtype without a rate of its own at the fastest rate measured).
/// Not known where the work was not counted.
task_bound bound_of(const task_work& work, const device_peaks& peaks);

/// The floor the bound sets on a candidate's median call (ms): half its bytes part, where the
/// call moves at least the bytes the copy rate was measured at (fewer may come from caches at
/// their own rate); NaN where that is not known. Under it, the call moved the bytes every
/// candidate must (its inputs read once, its outputs written) at more than twice the fastest copy
/// this hardware showed: its outputs were not computed from its inputs inside the window.
double bound_floor_ms(const task_work& work, const device_peaks& peaks);

/// A reference's own call (ms; the evaluator passes its median at the fast edge of the verdict's
/// band, where the same code measures too) as evidence of the copy rate: where it moved its bytes
/// (inputs read once, outputs written: fewer than it really moved) faster than `peaks` copy, and
/// at least the bytes the rate was measured at (fewer may come from caches), the copy rate is
/// raised to its rate and true returned. A bound is a time no call beats: a measured peak below
/// what a reference shows (4.14 TB/s measured in a verdict's reference phase under MPS, KernelBench's
/// ELU reference at 4.22 TB/s on an H200) would put honest calls above 1.0 of their bound. Never
/// past raise_copy_limit times the measured rate: a reference that far ahead reads fewer bytes
/// than its inputs hold (a task that uses part of an input), which says nothing of the device.
bool raise_copy_rate(device_peaks& peaks, const task_work& work, double ref_ms);
inline constexpr double raise_copy_limit = 1.10;

/// The peaks measured in this process, by hardware (each measured once, by the first verdict
/// of an evaluator on that hardware whose reference worker was asked). Thread-safe.
class peaks_registry final {
public:
  static peaks_registry& process();
  std::optional<device_peaks> find(const std::string& hardware) const;
  void keep(device_peaks p);
  /// raise_copy_rate on `hardware`'s peaks, where they are known: the raised copy rate (bytes per
  /// ms) where it was raised, NaN otherwise.
  double observe(const std::string& hardware, const task_work& work, double ref_ms);

private:
  mutable std::mutex mtx_;
  std::map<std::string, device_peaks> by_hardware_;
};

} // namespace crucible::env
