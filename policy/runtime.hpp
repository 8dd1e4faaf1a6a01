// policy/runtime.hpp: what LibTorch and the CUDA driver offer this process (devices, versions).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace crucible::policy {

/// One CUDA device as the runtime reports it.
struct cuda_device {
  int index = 0;
  std::string name;              ///< e.g. "NVIDIA H100 80GB HBM3"
  std::uint64_t memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
};

/// The tensor runtime of this process. Plain value.
struct runtime_info {
  std::string torch_version;     ///< LibTorch's version string, e.g. "2.11.0"
  bool cuda_built = false;       ///< this binary was built with CRUCIBLE_CUDA
  std::string cuda_runtime;      ///< CUDA runtime version, e.g. "13.0" ("" without CUDA)
  std::vector<cuda_device> devices;
  int cpu_threads = 0;           ///< LibTorch's intra-op thread count
};

/// The index N of "cuda:N", or -1 for anything else ("cuda" alone included).
int cuda_index(std::string_view device);
/// Whether CUDA device `index` exists on this machine (false without CUDA, or for a negative index).
bool cuda_device_exists(int index);

/// Makes a device the calling thread's current one until the scope ends: for a thread that drives
/// one GPU's work (a data-parallel learner rank), whose kernels launched outside LibTorch's own ops
/// and whose collectives go to the current device (cuda:0 unless set). "cpu" changes nothing.
/// Non-copyable; destroy on the thread that made it.
class device_scope final {
public:
  /// `device` is "cpu" or "cuda:N" (anything else: no change).
  explicit device_scope(std::string_view device);
  ~device_scope();
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

private:
  std::shared_ptr<void> guard_; // a c10::OptionalDeviceGuard, or null
};

/// Probes LibTorch and, in a CUDA build, the CUDA runtime. Never throws; a CUDA build on a
/// machine without a driver or device reports no devices. Thread-safe.
runtime_info probe_runtime();

/// What LibTorch's CUDA caching allocator holds for tensors on one device, in bytes. Plain value.
struct device_memory {
  std::uint64_t allocated = 0;      ///< held by live tensors now
  std::uint64_t peak_allocated = 0; ///< most held by live tensors since reset_peak_memory
  std::uint64_t reserved = 0;       ///< obtained from the driver (live tensors and cached free blocks)
  std::uint64_t peak_reserved = 0;  ///< most obtained from the driver since reset_peak_memory
};

/// The allocator's counters for `device` ("cuda:N"); nullopt for "cpu", in a build without
/// CUDA, or for a device that does not exist. Thread-safe.
std::optional<device_memory> memory_stats(std::string_view device);

/// Starts new peaks for memory_stats(device).peak_allocated and peak_reserved (no-op where
/// memory_stats has none).
void reset_peak_memory(std::string_view device);

/// Turns the one-row projections' single round of weight loads for a long k
/// (kernels::set_small_gemm_one_round) on, the default, or off for this process, so that a
/// benchmark can run them side by side. No effect without CUDA.
void set_small_gemm_one_round(bool on);

/// The one-row gate/up projection with a unit a half-warp (kernels::set_small_gemm_half_warps),
/// the default, or a unit a warp, for this process. No effect without CUDA.
void set_small_gemm_half_warps(bool on);

/// Turns the decoding kernels' early reads (kernels::set_decode_early_reads: what the previous
/// kernel leaves alone is read before waiting for it) on, the default, or off for this process.
/// No effect without CUDA.
void set_decode_early_reads(bool on);

/// Lets fused::decode_attention choose its wide kernel (kernels::set_decode_wide_attention: one
/// block per query head, no combine, at batch 1), the default, or not, for this process. No
/// effect without CUDA.
void set_decode_wide_attention(bool on);

/// Lets a one-row decoding step run its attention in splits that the o projection merges
/// (kernels::set_decode_attention_merge), the default, or in one wide block a query head, for
/// this process. No effect without CUDA.
void set_decode_attention_merge(bool on);

/// The most splits that merge takes (kernels::set_decode_attention_merge_splits), and whether the
/// one-row o and down projections load all their inputs before staging them
/// (kernels::set_small_gemm_batched_staging), for this process. No effect without CUDA.
void set_decode_attention_merge_splits(int most);
/// Warps of each block of that split attention (kernels::set_decode_attention_merge_warps: 8, the
/// default, or 16).
void set_decode_attention_merge_warps(int warps);
void set_small_gemm_batched_staging(bool on);

/// Lets greedy decoding steps of one row in CUDA graphs end in one kernel that applies the final
/// norm and the output matrix and samples, without writing the logits (kernels::set_decode_greedy_head),
/// the default, or in the output matrix's GEMM and the two sampling kernels, for this process.
/// No effect without CUDA.
void set_decode_greedy_head(bool on);

/// Lets the decoding kernels of one row launch the next kernel as they begin
/// (kernels::set_decode_early_launch), the default, or after their wait, for this process. No
/// effect without CUDA.
void set_decode_early_launch(bool on);

/// Lets the fused decoding step run all its layers in one persistent kernel at one row
/// (kernels::set_decode_layers; off by default: five kernels a layer), for this process. No
/// effect without CUDA.
void set_decode_layers(bool on);

/// Lets the persistent kernel prefetch each next layer's weights to L2
/// (kernels::set_decode_layers_prefetch; off by default), for this process. No effect without CUDA.
void set_decode_layers_prefetch(bool on);

/// (The copy bandwidth and the persistent kernel's stage timeline, which only bench_decode uses,
/// are in tools/bench/bench_timers.hpp.)
///
/// One kernel of a one-row decoding layer of five kernels (q/k/v, attention, o, gate/up, down),
/// timed by its blocks (kernels::set_decode_timeline), as medians over the layers after the first
/// of the last step. Every time is from the end of the kernel before (its last block's): so
/// `end_us` is the kernel's share of a layer's time, and the five add up to it.
struct layer_kernel_time {
  std::string kernel;
  std::int64_t blocks = 0;
  double first_start_us = 0, last_start_us = 0; ///< blocks beginning (negative: while the kernel before ran)
  double first_wait_us = 0, last_wait_us = 0;   ///< blocks' waits for the kernel before returning
  double end_us = 0;                            ///< the last block ending
  double after_wait_us = 0, slowest_after_wait_us = 0; ///< a block's time from its wait to its end: median, longest
  /// A block's time from its wait to its midpoint and from there to its end (medians;
  /// kernels::decode_timeline_entries says where the midpoint is).
  double to_midpoint_us = 0, from_midpoint_us = 0;
  std::int64_t late_blocks = 0;                 ///< blocks that began only after the kernel before ended
};

/// Runs `fn`, which decodes at one row on the current CUDA device with five kernels a layer and
/// no CUDA graph captured before it (the launches record where they write when they are made),
/// with those kernels recording their blocks' times, and summarises the last step's. Errors
/// without CUDA, with fewer than two layers, or when no step's kernels were recorded.
result<std::vector<layer_kernel_time>> time_decode_kernels(const std::function<void()>& fn, std::int64_t layers);

/// One row of a profile: an operator (CPU) or a kernel (CUDA) with its summed time.
struct profile_row {
  std::string name;
  std::string device; ///< "cpu" or "cuda"
  double total_ms = 0;
  std::int64_t count = 0;
};

/// Runs `fn` under LibTorch's Kineto profiler (CPU operators, and CUDA kernels when `cuda`),
/// writes a Chrome trace to `trace` unless it is empty, and returns one row per (name, device)
/// sorted by total time, longest first. Not reentrant: one profile at a time per process.
result<std::vector<profile_row>> profile(const std::function<void()>& fn, bool cuda,
                                         const std::filesystem::path& trace);

} // namespace crucible::policy
