// env/eval/device/device_bytes.hpp: output bytes that stay on a CUDA device. A worker exports each output
// it computed (a CUDA IPC handle of the allocation, an offset and a size); the evaluator maps
// it read-only into its own process, copies reference outputs into memory it owns, and compares
// candidate outputs there with its own kernel (device_compare). Nothing the candidate's process
// can patch takes part in the comparison, and no output is copied to the host.
//
// Built with CUDA (CRUCIBLE_HAVE_CUDA) only; otherwise device_bytes_available() is false and
// every function fails with errc::unsupported. The evaluator asks for exported outputs only
// when device_bytes_available() is true.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "env/dtype.hpp"

namespace crucible::env {

/// A span of device memory in this process: a mapping of a worker's export, or an allocation of
/// the evaluator's own. Unmapped or freed when the last reference goes.
class device_bytes {
public:
  virtual ~device_bytes() = default;
  virtual const void* data() const noexcept = 0;
  virtual std::uint64_t size() const noexcept = 0;
  virtual int device() const noexcept = 0;
};

/// Whether this build can keep outputs on the device.
bool device_bytes_available() noexcept;

/// This process's device work on `device`, one thread at a time: every function here takes it for
/// its call (and the objects' release for theirs), and a device clock holds it from arm() to
/// finish(). A clock holds the device with a kernel from arm() until it is let go, and a call of
/// another thread's that waits for the device meanwhile (an IPC mapping opened or closed, memory
/// freed) held the driver where the clock's own thread needed it before letting go: verdicts in
/// flight together on a device stopped for good (KernelBench's level1/1 beside level1/46, two
/// evaluations at once on an H200). Recursive: the clock's thread works on the device inside its
/// window. Under a device agent it is taken in both processes. One definition for the CUDA
/// build and the one without (device_bytes.cu, device_bytes_host.cpp).
inline std::recursive_mutex& device_work_mutex(int device) noexcept {
  // Never destroyed: device memory of static lifetime is released at exit through it.
  static auto* per_device = new std::recursive_mutex[64];
  return per_device[static_cast<unsigned>(device) % 64];
}

/// Maps `bytes` bytes at `offset` inside the allocation named by `handle_hex` (a CUDA IPC memory
/// handle, 128 hex digits) on CUDA device `device` of this process. Refuses a handle that does
/// not open, a range outside the allocation, and an offset not aligned to `align` bytes: the
/// worker that sent them may be hostile, and a stray read would break this process's context.
result<std::shared_ptr<device_bytes>> map_exported(int device, std::string_view handle_hex, std::uint64_t offset,
                                                   std::uint64_t bytes, std::uint64_t align);

/// The whole allocation named by `handle_hex` (as map_exported), from the start of the handle's
/// range to the end of the allocation: spans inside it come from subspan. A caller that maps
/// many spans of one worker's allocations keeps one mapping per handle instead of opening the
/// handle again for each (an open inside a timed sample would be charged to the call).
result<std::shared_ptr<device_bytes>> map_allocation(int device, std::string_view handle_hex);

/// `bytes` bytes at `offset` of `parent`, which the span keeps alive. Refuses a range outside the
/// parent and an offset not aligned to `align` bytes (what a worker says is data to check).
result<std::shared_ptr<device_bytes>> subspan(std::shared_ptr<device_bytes> parent, std::uint64_t offset,
                                              std::uint64_t bytes, std::uint64_t align);

/// `bytes` bytes of device memory this process owns on `device`, uninitialised.
result<std::shared_ptr<device_bytes>> allocate_owned(int device, std::uint64_t bytes);

/// Copies `bytes` host bytes into `dst` (which must be at least that large) and waits.
result<void> upload(const device_bytes& dst, const std::byte* src, std::uint64_t bytes);

/// One device-to-device copy of `src`'s bytes into `dst` (which may be a mapping of a worker's
/// export: this process writes it), for copy_all.
struct device_copy {
  const device_bytes* dst;
  const device_bytes* src;
};
/// Queues every copy, then waits once. Sizes must match.
result<void> copy_all(const std::vector<device_copy>& copies);

/// A clock on the device for a sample timed across the trust boundary, read in this process
/// only. The worker keeps two words in its own device memory, which this process maps: `go`,
/// which its stream waits for (cuStreamWaitValue32, >= seq) before a sample's calls, and `done`,
/// which its stream writes (seq) after them. arm() queues, on a stream of this process's, a hold
/// and a sealed copy of the sample's inputs into the worker's buffers, then the write of `go`;
/// close() queues a wait for `done` and a sealed copy of the outputs into this process's memory;
/// finish() lets the held work run (let_go() does that alone, earlier: for a worker whose calls
/// wait for the device), waits for it (up to `timeout_s`; past it this process writes `done`
/// itself and refuses the sample) and returns the device time from the copy in's start to the
/// moment the copy out held the whole device.
///
/// A sealed copy is a grid of exactly as many blocks as the device holds at once, which copies
/// nothing until all its blocks are resident together: then no kernel of another process's runs
/// anywhere on the device (an MPS client's included), and one still running holds the copy back.
/// Its chunks are copied in an order drawn here for each copy. So no kernel of the worker's sees
/// the inputs before the window opens or works beside the copy in; what it has not written when
/// the copy out holds the device is read unwritten (in an order it cannot know), and a kernel of
/// its still running then holds the window open. The copy in lies inside the window on both
/// sides alike (the evaluator takes the empty sample's window off); the reads of the outputs lie
/// after it. A worker kernel that holds part of the device for seconds makes finish() fail with
/// errc::timeout. A clock destroyed armed lets its work go.
class device_clock {
public:
  virtual ~device_clock() = default;
  virtual result<void> arm(const std::vector<device_copy>& copies_in, const device_bytes& go, std::uint32_t seq) = 0;
  virtual result<std::vector<std::shared_ptr<device_bytes>>> close(const device_bytes& done, std::uint32_t seq,
                                                                   const std::vector<const device_bytes*>& outs) = 0;
  virtual void let_go() noexcept = 0;
  virtual result<double> finish(double timeout_s) = 0;
};
/// How a clock closes a sample's window once the worker's calls are queued. `poll` (the
/// evaluator's default): nothing of this process's waits on the device during the worker's calls;
/// its host reads the done word (4-byte copies on a second stream) and queues the copy out once it
/// has the sample's number. `wait`: a wait for the worker's done word queued on the clock's stream,
/// the copy out behind it (evaluator.cuda_clock_poll: false; docs/PERFORMANCE.md, "The clock's
/// close at scale").
enum class clock_close : std::uint8_t { wait, poll };
result<std::unique_ptr<device_clock>> make_device_clock(int device, clock_close close);

/// Writes `value` into every byte of each span (a worker's export included) and waits.
result<void> fill_all(const std::vector<const device_bytes*>& spans, unsigned char value);

/// The fastest of five fills of `bytes` bytes of this process's memory on `device`, timed with
/// device events (ms): what writing that many bytes takes there at least.
result<double> fastest_fill_ms(int device, std::uint64_t bytes);

/// Evicts the device's L2 cache: writes a buffer of this process's of twice its size (at least
/// `bytes`) and waits.
result<void> flush_device_cache(int device, std::uint64_t bytes);

/// A copy of `src` in memory this process owns (reference outputs outlive the worker's exports).
result<std::shared_ptr<device_bytes>> copy_to_owned(const device_bytes& src);
/// copy_to_owned for several spans (on one device) at once: the copies are queued together and
/// waited for once.
result<std::vector<std::shared_ptr<device_bytes>>> copy_all_to_owned(const std::vector<const device_bytes*>& srcs);

/// Copies device bytes to the host.
result<std::vector<std::byte>> download(const device_bytes& src);

#ifndef CRUCIBLE_HOST_DEVICE // as policy/kernels/attention_plan.hpp defines it
#if defined(__CUDACC__)
#define CRUCIBLE_HOST_DEVICE __host__ __device__
#else
#define CRUCIBLE_HOST_DEVICE
#endif
#endif

/// The outputs' scale rule, one definition for the host comparison and the device kernel
/// (docs/evaluator.md, Correctness, "Tolerances follow the outputs' scale"): the absolute
/// tolerance in force for a floating output whose reference has root mean square `rms` (over
/// its finite elements) is min(atol, scale_rule_factor * rtol * rms); the reference's rounding
/// slack is added after it.
///
/// Why: atol is there for elements near zero, where a relative error means nothing. Where the
/// outputs themselves are not much larger than atol (x / ||x|| of a million elements is ~1e-3
/// each, with an fp32 atol of 1e-4), atol alone lets every element be off by several percent,
/// and an estimate (the norm taken from a 1% sample: 0.7% off) passed as a kernel. Taking the
/// outputs' RMS as the magnitude below which an element counts as "near zero" keeps atol's
/// purpose and removes the hiding place. The RMS, not a median or the share of elements under
/// atol: a ReLU's half zeros leave it of the order of the other half, so such outputs keep
/// today's check. The factor 10 keeps the rule off wherever atol is already below a thousandth
/// of the RMS in fp32 (RMS >= 0.1 with the default tolerances: every output of ordinary scale),
/// and is the smallest power of ten that passes the least accurate legitimate float32 order we
/// know: one float accumulator over a million squares puts the norm 2.3e-4 off (factors 1 and 3
/// fail it), a blocked sum 1e-7 (tests/unit/env/test_compare.cpp). The rule only ever lowers
/// atol, so an output that is not the reference's (a determinism check compares the candidate's
/// two calls) can make its own check stricter, never looser. RMS 0 (all zeros), rtol 0 (an
/// absolute criterion asked for) and atol 0 leave atol as it is.
inline constexpr double scale_rule_factor = 10;
CRUCIBLE_HOST_DEVICE inline double atol_for_scale(double atol, double rtol, double rms) {
  const double scaled = scale_rule_factor * rtol * rms;
  return atol > 0 && rtol > 0 && rms > 0 && scaled < atol ? scaled : atol;
}

/// Element-wise difference of two device arrays of `n` elements of type `t`, with the rules of
/// compare_outputs: |got - want| <= atol' + slack + rtol * |want| where atol' follows the
/// reference's scale (atol_for_scale, with the RMS of `want`'s finite elements), NaN matches
/// NaN, infinities match exactly, integers and bools compare exactly (their tolerance is 0).
struct device_difference {
  std::uint64_t mismatches = 0;
  double max_abs_diff = 0;     ///< over finite pairs
  std::uint64_t first_bad = 0; ///< flat index of the first mismatch (when mismatches > 0)
  std::byte got_first[8]{};    ///< the elements at first_bad, native bytes (decode: element_value)
  std::byte want_first[8]{};
  /// `want`'s scale, measured where the rule can apply (a floating type, atol and rtol > 0):
  std::uint64_t finite = 0;     ///< its finite elements
  double rms = 0;               ///< their root mean square
  std::uint64_t under_atol = 0; ///< finite elements with |want| <= atol (atol without slack)
};
result<device_difference> device_compare(const device_bytes& want, const device_bytes& got, dtype t, std::uint64_t n,
                                         const tolerance& tol, double slack = 0);

/// The scale of `n` elements of type `t` on the device alone (device_difference's finite, rms
/// and under_atol; the rest zero): one kernel and one wait.
result<device_difference> device_scale(const device_bytes& want, dtype t, std::uint64_t n, double atol);

/// One pair for device_compare_all. `tol` is the dtype's tolerance as configured; `slack` (the
/// reference's rounding error) is added to atol after the scale rule.
struct device_comparison {
  const device_bytes* want;
  const device_bytes* got;
  dtype type;
  std::uint64_t n;
  tolerance tol;
  double slack = 0;
};
/// device_compare for several pairs (on one device) at once: the kernels are queued together and
/// waited for once. One result per pair, in order.
result<std::vector<device_difference>> device_compare_all(const std::vector<device_comparison>& pairs);

/// Lets this process's default memory pool on `device` keep up to `bytes` of freed memory
/// instead of returning it to the driver at the next synchronisation: each verdict's reference
/// copies (copy_to_owned) then reuse the previous verdict's memory rather than map new memory.
result<void> keep_freed_memory(int device, std::uint64_t bytes);

/// Returns the freed memory that pool keeps to the driver, after this process's work on `device`
/// has ended: for an evaluation that must have the device's memory to itself (a retry alone).
result<void> release_freed_memory(int device);

/// Where this process's calls above spent their time, summed over its threads since it started
/// (for figures: tools/bench/bench_eval_throughput prints them per pass). Zero without CUDA.
struct device_bytes_times {
  std::uint64_t open_ns = 0, opens = 0;       ///< map_exported: opening the handle, checking the range
  std::uint64_t close_ns = 0, closes = 0;     ///< unmapping an export
  std::uint64_t alloc_ns = 0, allocs = 0;     ///< allocating an owned copy
  std::uint64_t copy_ns = 0, copies = 0;      ///< copying into it and waiting for the copy
  std::uint64_t compare_ns = 0, compares = 0; ///< device_compare, its wait included
};
device_bytes_times device_bytes_time() noexcept;

/// The CUDA device's name for `device` (for logs and tests); an error without a device:
/// errc::not_found where this machine has no such device (no driver or GPU, or a number past the
/// visible ones), errc::device for another failure of the driver.
result<std::string> device_name(int device);

} // namespace crucible::env
