// policy/kernels/decode_options.hpp: the decoding kernels' variants as one plain value, held by
// the model (CausalLMImpl::set_decode_options) and passed down through fused:: to each launch.
// Every field's default is the variant measured fastest (docs/performance-history.md); the others
// stay so that benchmarks (tools/bench/bench_decode.cpp) and tests (tests/gpu/test_gpu_kernels.cpp)
// can run them side by side. Nothing here is process-wide. No CUDA or torch headers.
#pragma once

#include <cstdint>
#include <mutex>

#include "policy/kernels/attention_plan.hpp"

namespace crucible::policy::kernels {

/// Where the one-row decoding kernels record when their blocks run, for benchmarks
/// (policy::time_decode_kernels): each launch of a one-row projection (small_gemm_*) or wide
/// attention with early reads (decode_attention; its combine kernel is not recorded, nor other
/// attention launches, which take their record all the same) takes the next of `launches` records
/// of `buffer` in turn, wrapping around, and each of its blocks writes its decode_timeline_entries
/// (kernels.hpp) at entry (record * max_blocks + block) * decode_timeline_entries (block =
/// blockIdx.y * gridDim.x + blockIdx.x). `buffer` is device memory of launches * max_blocks *
/// decode_timeline_entries entries that the owner zeroed (the end entries are maxima); a launch of
/// more than max_blocks blocks takes its record but writes nothing. Launches captured in a CUDA
/// graph keep their record on every replay. The kernels' work is the same either way.
struct decode_timeline {
  decode_timeline(unsigned long long* buffer, std::int64_t launches, std::int64_t max_blocks)
      : buffer(buffer), launches(launches), max_blocks(max_blocks) {}
  decode_timeline(const decode_timeline&) = delete;
  decode_timeline& operator=(const decode_timeline&) = delete;

  unsigned long long* const buffer;
  const std::int64_t launches, max_blocks;

  /// The record of a launch of `blocks` blocks at `rows` rows, or null (more rows or blocks than
  /// it records, or a kernel that records nothing: `recorded` false, its record taken).
  unsigned long long* record(std::int64_t blocks, std::int64_t rows, bool recorded, int entries) {
    if (rows != 1 || buffer == nullptr || launches <= 0 || max_blocks <= 0)
      return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto r = next_++ % launches;
    return recorded && blocks <= max_blocks ? buffer + r * max_blocks * entries : nullptr;
  }

 private:
  std::mutex mutex_; // launches come from several threads
  std::int64_t next_ = 0;
};

/// The decoding kernels' variants. Plain value; `timeline` is borrowed.
struct decode_options {
  /// The decoding kernels read what the previous kernel leaves alone before waiting for it
  /// (decode_attention_args::early_reads, small_gemm_args::early_reads); off, every read waits.
  bool early_reads = true;
  /// With early reads at one row, a kernel lets the next start as it begins
  /// (griddepcontrol.launch_dependents), before its own wait; off, after it (and, in the
  /// projections, after staging their inputs; at batch 4 launching early was slower).
  bool early_launch = true;
  /// fused::decode_attention's automatic choice may take the wide kernel (one block a query head,
  /// no combine, at batch 1); off, it always splits.
  bool wide_attention = true;
  /// A one-row step's attention runs in splits that the o projection merges
  /// (fused::attention_project_add, choose_decode_attention_merge_split) where that suits; off,
  /// one wide block a query head and a separate o projection.
  bool attention_merge = true;
  /// The most splits that merge takes: 2 to decode_attention_merge_max_splits (8, the default).
  int merge_splits = decode_attention_merge_max_splits;
  /// Warps of each block of that split attention: decode_attention_half_wide_warps (8, the
  /// default: a whole round each at 256-slot splits) or decode_attention_wide_warps (16).
  int merge_warps = decode_attention_half_wide_warps;
  /// One-row projections keep eight 16-byte loads a weight row in flight per lane where four do
  /// not cover k in one round; off: four, and a second round after the wait, as at more rows.
  bool small_gemm_one_round = true;
  /// The one-row gate/up projection gives each half-warp a unit of two weight rows where eight
  /// loads a lane cover k (k <= 1024 in 16-bit types); off: a warp a unit.
  bool small_gemm_half_warps = true;
  /// The one-row projections that copy their inputs (o and down) issue all of a thread's loads of
  /// them before storing any to shared memory; off, load and store one at a time.
  bool small_gemm_batched_staging = true;
  /// Greedy decoding steps of one row in CUDA graphs end in one kernel that applies the final norm
  /// and the output matrix and samples, without writing the logits (kernels::greedy_head); off,
  /// the output matrix's GEMM and the two sampling kernels.
  bool greedy_head = true;
  /// Null: nothing recorded.
  decode_timeline* timeline = nullptr;
};

} // namespace crucible::policy::kernels
