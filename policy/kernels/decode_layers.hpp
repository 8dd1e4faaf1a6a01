// policy/kernels/decode_layers.hpp: every transformer layer of a one-row decoding step in one
// persistent kernel (policy/kernels/decode_layers.cu). Called by policy/kernels/fused.cpp, which
// checks the tensors; no torch here, as in policy/kernels/kernels.hpp, whose rounding points it
// follows.
//
// Why one kernel: at batch 1 a layer is about 30 MB of weights read by five dependent kernels,
// and each kernel can only load its weights once its blocks are resident, so the device's
// memory is idle at every kernel boundary and in every kernel's short tail. Here one block per
// SM stays resident for the whole step; a producer warp streams that block's share of every
// layer's weights, in the order they are used, into a ring of shared-memory slots with bulk
// copies (the weights depend on nothing, so it runs as far ahead as the ring allows), while the
// other warps compute and meet the other blocks at a counter in global memory after each stage.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "policy/kernels/kernels.hpp"

namespace crucible::policy::kernels {

/// Layers one launch takes (its arguments are passed by value: 96 bytes a layer).
inline constexpr int decode_layers_max_layers = 96;
/// Splits of a KV head's slots among blocks (flash-decoding); partial_out holds this many per head.
inline constexpr int decode_layers_max_splits = 16;

/// One layer's parameters and cache (all of the storage type, row-major, 16-byte aligned).
struct decode_layer_params {
  const void* qkv_weight = nullptr;     ///< [(heads + 2 kv_heads) * head_dim, hidden]: q, k, v rows joined
  const void* qkv_bias = nullptr;       ///< [(heads + 2 kv_heads) * head_dim] or null
  const void* o_weight = nullptr;       ///< [hidden, heads * head_dim]
  const void* o_bias = nullptr;         ///< [hidden] or null
  const void* gate_up_weight = nullptr; ///< [2 inter, hidden]: gate rows, then up rows
  const void* gate_up_bias = nullptr;   ///< [2 inter] or null
  const void* down_weight = nullptr;    ///< [hidden, inter]
  const void* down_bias = nullptr;      ///< [hidden] or null
  const void* input_norm = nullptr;     ///< [hidden]: RMSNorm weight before attention
  const void* post_norm = nullptr;      ///< [hidden]: RMSNorm weight before the MLP
  void* k_cache = nullptr;              ///< row 0 of the layer's cache: element (h, s, d) at h*head_stride + s*slot_stride + d
  void* v_cache = nullptr;              ///< same strides
};

/// A one-row decoding step through `layers` layers: residual (the embedded token) in, the residual
/// stream after the last layer out (the final norm and the output matrix stay outside). Per layer
/// it computes what the small-batch kernels do (norm, q/k/v + bias, RoPE and the cache write at
/// slot lengths[0]; attention over slots [0, min(lengths[0] + 1, slots)); o projection and
/// residual add; norm, gate/up, silu * up; down projection and residual add) with the same
/// rounding points; sums run in another order.
struct decode_layers_args {
  decode_layer_params layer[decode_layers_max_layers];
  int layers = 0;
  std::int64_t hidden = 0, inter = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float eps = 0.0f;                  ///< RMSNorm epsilon
  float scale = 1.0f;                ///< attention's q.k scale (1 / sqrt(head_dim))
  std::int64_t head_stride = 0, slot_stride = 0, slots = 0; ///< the caches' strides (elements) and slots
  const std::int64_t* lengths = nullptr; ///< [1]: the new token's position and slot (not changed here)
  const float* inv_freq = nullptr;   ///< float32 [head_dim / 2]: RoPE's inverse frequencies at this position
  float attention_scaling = 1.0f;    ///< cos and sin are multiplied by it (YaRN)
  void* residual = nullptr;          ///< [hidden], updated in place
  void* qkv = nullptr;               ///< scratch [(heads + 2 kv_heads) * head_dim]
  void* act = nullptr;               ///< scratch [inter]
  float* partial = nullptr;          ///< scratch [heads, decode_layers_max_splits, head_dim + 2]
  unsigned* counters = nullptr;      ///< [layers * 5], zero at launch: blocks through each stage
  int kv_tile = 0;                   ///< set by decode_layers: cache slots an attention block stages at a time
  /// Set by decode_layers from set_decode_layers_prefetch: each block's producer prefetches its
  /// share of the next layer's weights to L2 as it starts a layer.
  bool prefetch_l2 = false;
  /// Set by decode_layers from set_decode_layers_timeline: where each block writes, per layer and
  /// stage, the %globaltimer nanoseconds at which it began and ended the stage (null: nowhere).
  unsigned long long* timeline = nullptr;
};

/// Whether decode_layers takes these shapes on the current device (compute capability 9.0, the
/// whole ring and work space in one SM's shared memory, rows of whole 16 bytes, at most
/// decode_layers_max_layers layers); false says to run the per-stage kernels.
bool decode_layers_supported(dtype t, std::int64_t layers, std::int64_t hidden, std::int64_t inter,
                             std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim);

/// Runs the step on `stream` (one cooperative launch, one block per SM; capturable in CUDA
/// graphs). The caller zeroes `counters` first and owns every buffer.
cudaError_t decode_layers(dtype t, const decode_layers_args& a, cudaStream_t stream);

/// Whether the fused decoding step runs its layers in decode_layers where it can, or as five
/// kernels a layer (the default: on an H100 the persistent kernel's step took 1.32 ms against
/// 0.77 ms, docs/performance-history.md); for this process, so that benchmarks and tests compare
/// the two.
void set_decode_layers(bool on);
bool decode_layers_enabled();

/// Whether decode_layers prefetches the next layer's weights to L2 (off by default: slower on an
/// H100, docs/performance-history.md); for this process, so that benchmarks and tests compare
/// the two.
void set_decode_layers_prefetch(bool on);

/// Stages of a layer in decode_layers' timeline: q/k/v, attention, o, gate/up, down.
inline constexpr int decode_layers_stages = 5;

/// Makes every later decode_layers launch of this process write its timeline to `buffer` (device
/// memory of decode_layers_timeline_entries(layers) int64, owned by the caller; null stops it):
/// entry ((layer * decode_layers_stages + stage) * blocks + block) * 2 + {0: began, 1: ended}.
/// For benchmarks; launches captured in a CUDA graph keep the pointer they were captured with.
void set_decode_layers_timeline(unsigned long long* buffer);

/// The blocks decode_layers launches on the current device (one per SM) and the timeline's size.
int decode_layers_blocks();
std::int64_t decode_layers_timeline_entries(std::int64_t layers);

} // namespace crucible::policy::kernels
