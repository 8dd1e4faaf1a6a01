// env/eval/device_kind.hpp: what differs between the kinds of device the evaluator judges on (the
// CPU and CUDA), in one table; every evaluator site that would otherwise ask "is this the CPU?"
// reads its row instead. A new kind of device starts here: a row, then the code each field
// names (docs/architecture.md, "Adding a kind of device").
#pragma once

#include <cstdint>
#include <string_view>

namespace crucible::env {

/// One kind of device, as the evaluator treats it.
struct device_kind {
  /// The kind's name, and the worker's `--device` (env/eval/harness/worker.py, device.py).
  const char* name;
  /// Timed samples across the boundary run on the device, on its own clock, buffers and flush
  /// (boundary_device.cpp); false: on the host, charged the worker's CPU time (boundary.cpp).
  /// Such a kind's verdicts are judged only where this process has the device's context
  /// (evaluation.cpp's judge).
  bool samples_on_device;
  /// Outputs stay in the worker's device memory, exported, and are compared on the device
  /// (evaluator.cpp, evaluation.cpp's decode_outputs; a check of a task alone sends host bytes).
  bool outputs_on_device;
  /// One device gate for the whole process, shared with the policy's host work on the device
  /// (device_gate.cpp's shared_gate, gate_for_host_work); false: a gate of each evaluator's own.
  bool process_wide_gate;
  /// A worker's address space is limited to evaluator.memory_limit_mb (sandbox.cpp); on a CUDA
  /// device the driver's mappings exceed any such limit, and device memory is not address space.
  bool address_space_limit;
  /// The worker loads the harness's own kernels (evaluator.harness_kernels, `--kernels`), and a
  /// worker that reports none is warned about (worker_pool.cpp).
  bool harness_kernels;
  /// The worker's CUDA_VISIBLE_DEVICES names the device (sandbox.cpp); otherwise it names none.
  bool visible_device;
  /// A verdict that ran out of the device's memory is judged again alone (evaluator.cpp).
  bool out_of_memory_alone;
  /// Bytes that flush the kind's caches before a timed sample where evaluator.flush_bytes is 0.
  std::uint64_t flush_bytes;
};

/// The row of `device` ("cpu", "cuda", "cuda:N"): CUDA's for a CUDA device, the CPU's for
/// anything else (config validation refuses other names before they get here).
const device_kind& kind_of(std::string_view device) noexcept;

/// evaluator.flush_bytes, or where that is 0 the kind's own.
inline std::uint64_t flush_bytes_of(std::uint64_t configured, const device_kind& kind) noexcept {
  return configured != 0 ? configured : kind.flush_bytes;
}

} // namespace crucible::env
