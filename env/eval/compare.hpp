// env/eval/compare.hpp: comparing candidate outputs with reference outputs, in the evaluator's own
// process, on raw bytes the worker sent or on device memory it exported (env/eval/device/device_bytes.hpp):
// nothing the candidate's process can patch is involved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "env/eval/device/device_bytes.hpp"
#include "env/dtype.hpp"

namespace crucible::env {

/// "float32", ...; the names torch uses without the "torch." prefix.
const char* to_string(dtype t) noexcept;
std::optional<dtype> parse_dtype(std::string_view name) noexcept;
bool is_floating(dtype t) noexcept;

/// An output as the worker sent it: dtype, shape and contiguous bytes (on the host in `bytes`,
/// or on a CUDA device in `device`), or `kind` when it was not a plain tensor (e.g. "tensor
/// subclass LazyTensor"). Owns its bytes or holds its device mapping.
struct tensor_blob {
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
  std::shared_ptr<device_bytes> device; ///< set instead of `bytes` for outputs kept on the device
  std::string kind; ///< empty for a plain tensor
  /// Added to atol when this blob is the reference of a comparison: evaluator.rounding_factor
  /// times the reference's own rounding error on this output (docs/evaluator.md, Correctness).
  double slack = 0;

  std::int64_t numel() const noexcept;
};

/// Tolerances by dtype; integers and bools compare exactly.
struct tolerances {
  tolerance f64{1e-4, 1e-4};
  tolerance f32{1e-4, 1e-4};
  tolerance f16{1e-2, 1e-2};
  tolerance bf16{1e-2, 1e-2};

  tolerance for_dtype(dtype t) const noexcept;
};

/// Result of comparing one output (or a list of outputs). Plain value.
struct comparison {
  bool ok = true;
  std::string message;     ///< first problem found, e.g. "output 0: dtype float16, expected float32"
  double max_abs_diff = 0; ///< over all elements compared
  std::uint64_t mismatches = 0;
  /// The outputs whose tolerance followed their scale (atol_for_scale), whether they matched or
  /// not, e.g. "output 0: values ~0.000977 (RMS), the tolerance is judged relative to the
  /// outputs (atol 0.0001 -> 9.77e-07)"; "; " between outputs, empty where none did.
  std::string scale_note;
  /// The comparison itself failed in this process (a device error, e.g. out of memory): says
  /// nothing about the candidate.
  bool evaluator_error = false;
};

/// Differences of pairs of outputs kept on the device, computed ahead in one batch
/// (compare_on_device_ahead), keyed by the pair's (want, got) spans.
using device_differences = std::map<std::pair<const device_bytes*, const device_bytes*>, device_difference>;

/// A list of reference outputs and a list of outputs to compare with them.
using output_lists = std::pair<const std::vector<tensor_blob>*, const std::vector<tensor_blob>*>;

/// Compares, in one batch on the device (one wait instead of one per output), every pair of
/// outputs at the same position of each pair of lists that are both kept on the device and have
/// the same dtype and shape. Pairs it leaves out, and all of them when the batch fails, are
/// compared one at a time by compare_outputs.
device_differences compare_on_device_ahead(const std::vector<output_lists>& lists, const tolerances& tol);

/// Compares outputs element by element: same count, kind, dtype and shape, then values within
/// the dtype's tolerance. NaN matches NaN; infinities must match exactly. Device pairs found in
/// `ahead` take their difference from it.
comparison compare_outputs(const std::vector<tensor_blob>& want, const std::vector<tensor_blob>& got,
                           const tolerances& tol, const device_differences* ahead = nullptr);

/// How a reference output's own scale bears on its absolute tolerance (atol_for_scale in
/// env/eval/device/device_bytes.hpp; docs/evaluator.md, Correctness). Plain value.
struct output_scale {
  bool floating = false;     ///< a plain floating tensor: the only kind the rule looks at
  std::uint64_t finite = 0;  ///< its finite elements
  double rms = 0;            ///< their root mean square
  double share_under_atol = 0; ///< share of them with |value| <= atol (0 where none is finite)
  tolerance configured;      ///< the dtype's tolerance as configured
  double atol = 0;           ///< the absolute tolerance in force, before the reference's slack
  bool scaled = false;       ///< atol < configured.atol: the error is judged relative to the outputs
};

/// Measures `want` (a reference output: host bytes are read here; device bytes with one kernel
/// and one wait) and applies the scale rule with the dtype's tolerance from `tol`. An output that
/// is not a plain floating tensor is returned with floating false and scaled false. Fails only
/// where the device cannot be read (not the task's fault).
result<output_scale> measure_output_scale(const tensor_blob& want, const tolerances& tol);

/// "output 0: values ~1.2e-05 (RMS), 100% of them within atol 0.0001 of zero; the tolerance is
/// judged relative to the outputs (atol 0.0001 -> 1.2e-08)": one output's part of a task check's
/// within-tolerance line.
std::string describe_output_scale(std::size_t index, const output_scale& s);

/// The words that open the line a check of a task alone (device_evaluator::check_task) appends
/// to its verdict's message where any of the task's outputs sits within the tolerance (its
/// scale rule applies); `crucible tasks import` finds the line by them.
inline constexpr std::string_view within_tolerance_phrase = "outputs within the tolerance: ";

/// That line for a task's reference outputs on one trial's inputs: within_tolerance_phrase, then
/// describe_output_scale() of each output the rule applies to, joined by "; ". Empty where the
/// rule applies to none (or an output cannot be read, which the comparison reports in its turn).
std::string within_tolerance_line(const std::vector<tensor_blob>& reference, const tolerances& tol);

/// What follows within_tolerance_phrase in a verdict's `message`, to the end of its line: the
/// outputs' part of the line above; empty where the message has none.
std::string within_tolerance_of(std::string_view message);

/// One element at `p` (native byte order) as a double.
double element_value(const std::byte* p, dtype t) noexcept;

/// Decodes IEEE half and bfloat16 values (inline: the host comparison's loops call them an element
/// at a time).
inline float half_to_float(std::uint16_t h) noexcept {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1f;
  std::uint32_t mant = h & 0x3ff;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else { // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float bfloat16_to_float(std::uint16_t b) noexcept {
  std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

} // namespace crucible::env
