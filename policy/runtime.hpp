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

#include "core/device.hpp"
#include "core/error.hpp"

namespace crucible::policy {

class CausalLMImpl; // policy/model/model.hpp

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

/// The index N of a CUDA device's name (core/device.hpp: "cuda" is 0), or -1 for anything else.
using crucible::cuda_index;
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

/// (The decoding kernels' variants are CausalLMImpl::set_decode_options, kernels::decode_options.
/// The copy bandwidth, which only bench_decode uses, is in tools/bench/bench_timers.hpp.)
///
/// One kernel of a one-row decoding layer of five kernels (q/k/v, attention, o, gate/up, down),
/// timed by its blocks (kernels::decode_timeline), as medians over the layers after the first
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

/// Runs `fn`, which decodes with `model` at one row on the current CUDA device with five kernels a
/// layer and no CUDA graph captured before it (the launches record where they write when they are
/// made), with those kernels recording their blocks' times (the model's decode_options with a
/// timeline, its own again afterwards), and summarises the last step's. Errors without CUDA, with
/// fewer than two layers, or when no step's kernels were recorded.
result<std::vector<layer_kernel_time>> time_decode_kernels(CausalLMImpl& model, const std::function<void()>& fn,
                                                           std::int64_t layers);

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
