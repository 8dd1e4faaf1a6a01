// policy/kernels/kernels.hpp: the fused CUDA kernels of a decoding step and of the learner's training
// forward (policy/kernels/kernels.cu), each a drop-in for a chain of LibTorch ops in policy/model/model.cpp. Raw pointers and sizes in, results
// written to caller-owned device memory; launched on `stream`, never synchronising, so they can
// be captured in CUDA graphs. No torch here: kernels.cu is compiled by nvcc as C++17; the ATen
// wrappers that check shapes are in policy/kernels/fused.hpp.
//
// Every kernel computes in float32 and rounds to the storage type at the points where the
// LibTorch ops it replaces round (each elementwise op of the reference rounds its result to the
// tensor's dtype), with no fused multiply-add where the reference has a rounded product. What
// cannot match bit for bit is the order of floating-point sums (the RMSNorm mean, attention).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "policy/kernels/attention_plan.hpp"
#include "policy/kernels/decode_options.hpp"

namespace crucible::policy::kernels {

/// Storage types the kernels take (LibTorch's float, half and bfloat16).
enum class dtype : std::uint8_t { f32, f16, bf16 };

/// For each of `rows` rows of `dim` contiguous elements: when `delta` is not null,
/// residual = residual + delta (rounded to the storage type, written back in place); then
/// out = weight * to_dtype(residual * rsqrt(mean(residual^2) + eps)), the mean and rsqrt in
/// float32, the product rounded. This is `x + delta` followed by RMSNormImpl::forward.
/// `out` must not overlap `residual` or `delta`.
cudaError_t add_rms_norm(dtype t, const void* delta, void* residual, const void* weight, void* out, std::int64_t rows,
                         std::int64_t dim, float eps, cudaStream_t stream);

/// RoPE of one new token per row, fused with the KV-cache write.
struct rope_kv_args {
  const void* qkv = nullptr;         ///< [rows, (heads + 2 kv_heads) * head_dim]: q heads, k heads, v heads
  /// [(heads + 2 kv_heads) * head_dim], added to every row of qkv first (rounded to the storage
  /// type), or null: the q/k/v projections' bias, which the GEMM then need not add.
  const void* qkv_bias = nullptr;
  void* q_out = nullptr;             ///< [rows, heads, head_dim] contiguous: q rotated
  void* k_cache = nullptr;           ///< element (r, h, s, d) at r*row_stride + h*head_stride + s*slot_stride + d
  void* v_cache = nullptr;           ///< same strides as k_cache
  std::int64_t row_stride = 0, head_stride = 0, slot_stride = 0;
  const std::int64_t* lengths = nullptr; ///< [rows]: the new token's position and cache slot
  /// float32 inverse frequencies [head_dim / 2], or [rows, head_dim / 2] with inv_row_stride =
  /// head_dim / 2 (dynamic RoPE); inv_row_stride 0 shares one table.
  const float* inv_freq = nullptr;
  std::int64_t inv_row_stride = 0;
  float attention_scaling = 1.0f;    ///< cos and sin are multiplied by it (YaRN)
  std::int64_t rows = 0, heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t slots = 0;            ///< cache slots; a row whose length is not below it is not written
};

/// q_out and the cache's rotated keys and values at slot lengths[r]: x = qkv (+ qkv_bias, rounded);
/// with p = lengths[r],
/// cos = to_dtype(cos(p * inv_freq) * scaling) (sin alike), x' = x * cos + rotate_half(x) * sin with
/// each product and the sum rounded, as CausalLMImpl::rope and apply_rope compute them.
cudaError_t rope_kv_write(dtype t, const rope_kv_args& a, cudaStream_t stream);

/// Attention of one query token per row over its cache rows, grouped-query, split over the
/// slots (flash-decoding) so that a batch of one still spreads over the device.
struct decode_attention_args {
  const void* q = nullptr;           ///< [rows, heads, head_dim] contiguous
  const void* k_cache = nullptr;     ///< strides as in rope_kv_args
  const void* v_cache = nullptr;
  std::int64_t row_stride = 0, head_stride = 0, slot_stride = 0;
  /// [rows]: row r attends to slots [0, min(lengths[r] + 1, slots)), its length before the
  /// step's increment (the new token's own slot included). Read on the device: a launch of a
  /// fixed shape serves any lengths (CUDA graphs), blocks past a row's slots return at once.
  const std::int64_t* lengths = nullptr;
  std::int64_t rows = 0, heads = 0, kv_heads = 0, head_dim = 0, slots = 0;
  float scale = 1.0f;                ///< applied to q.k (1 / sqrt(head_dim))
  /// Pieces of `chunk` slots computed by separate blocks, then combined by a second kernel; 1
  /// writes `out` directly. chunk * splits must cover `slots`; chunk a multiple of
  /// decode_attention_warps (a multiple of the plan's granule wastes no lanes).
  std::int64_t splits = 1, chunk = 0;
  void* out = nullptr;               ///< [rows, heads * head_dim] in the storage type
  float* partial_out = nullptr;      ///< [rows, heads, splits, head_dim] float32 (splits > 1)
  float* partial_ml = nullptr;       ///< [rows, heads, splits, 2] float32: max score (log2 units) and sum (splits > 1)
  /// One block of decode_attention_wide_warps warps per (row, query head) and split (16-byte
  /// aligned data, plan_decode_attention_wide), each warp an even share of the split's slots; with
  /// one split of chunk >= slots, over all of the row's slots and no combine.
  bool wide = false;
  /// splits > 1 (at most decode_attention_merge_max_splits): leave the splits' partial_out and
  /// partial_ml for the o projection to merge as it stages its input (small_gemm_args::attention),
  /// with no combine kernel and nothing written to `out`.
  bool merge_later = false;
  /// Wide only: warps a block, decode_attention_wide_warps (0 or 16) or
  /// decode_attention_half_wide_warps (8).
  int wide_warps = 0;
  /// No kernel that may still run when this one begins writes `lengths` or any cache slot below a
  /// row's length (in a decoding step the kernel just before writes q and the new token's slot
  /// only, and those before it other layers' caches), so the first keys and values are loaded
  /// before waiting for it. Off where decode_options::early_reads is.
  bool early_reads = false;
  /// Set by decode_attention from decode_options::early_launch (one row, early_reads); callers leave it.
  bool early_launch = false;
  /// Set by decode_attention from decode_options::timeline (one row); callers leave it.
  unsigned long long* timeline = nullptr;
};

/// The work division decode_attention uses for these arguments (their dtype, alignment, group and
/// head_dim; policy/kernels/attention_plan.hpp): callers pick `chunk` as a multiple of its granule
/// and count its head_blocks among the blocks.
decode_attention_plan plan_decode_attention(dtype t, const decode_attention_args& a);

/// Shared memory of one attention block of `warps` warps serving `heads_per_block` query heads of `head_dim`.
std::size_t decode_attention_shared_bytes(std::int64_t heads_per_block, std::int64_t head_dim,
                                          int warps = decode_attention_warps);

/// Entries of a block in a decoding timeline (decode_options::timeline, decode_timeline):
/// %globaltimer nanoseconds when it began, when its wait for the previous kernel returned, when it
/// reached its midpoint (a projection: its inputs staged; the attention: its first warp's rounds
/// done, before the warps merge) and when its last warp ended.
inline constexpr int decode_timeline_entries = 4;

/// out = softmax(q k^T * scale) v per row and head, in float32, rounded once to the storage type.
/// One block per (split, row, KV head, block of up to 4 of its query heads), four warps each
/// reading a contiguous quarter of the split's slots with 16-byte loads, then a combine kernel;
/// or (`wide`) one block of 16 warps per (row, query head); see docs/model.md.
/// `o`: early_reads, early_launch and timeline.
cudaError_t decode_attention(dtype t, const decode_attention_args& a, cudaStream_t stream,
                             const decode_options& o = {});

/// out[r, i] = to_dtype(to_dtype(silu(gate_up[r, i])) * gate_up[r, inter + i]) for gate_up [rows,
/// 2 inter] (the gate and up projections side by side), out [rows, inter]: torch::silu(gate) * up.
cudaError_t silu_mul(dtype t, const void* gate_up, void* out, std::int64_t rows, std::int64_t inter,
                     cudaStream_t stream);

/// Projections of a few rows (decoding at batch 1 to 4), each one kernel with the work before and
/// after it fused in: the weight matrix [n, k] (row-major, 16-byte aligned rows) is read once,
/// 16 bytes a lane, two output rows a warp (up to four warps splitting k when there are few rows),
/// float32 sums, the bias added before the one rounding LibTorch's `linear` makes.
struct small_gemm_args {
  /// [rows, k] contiguous: the input, or with norm_weight the residual stream, normalised first
  /// (RMSNorm with norm_weight and eps, rounded as add_rms_norm rounds).
  const void* x = nullptr;
  const void* norm_weight = nullptr;
  float eps = 0.0f;
  const void* weight = nullptr;      ///< [n, k]
  const void* bias = nullptr;        ///< [n] or null
  std::int64_t rows = 0, k = 0, n = 0;
  void* residual = nullptr;          ///< small_gemm_residual_add: [rows, n], residual += linear(x), in place
  void* out = nullptr;               ///< small_gemm_silu_mul: [rows, n / 2]
  rope_kv_args rope;                 ///< small_gemm_rope_kv: where q, k and v go (its qkv and qkv_bias unused)
  int sms = 0;                       ///< the device's SM count: how finely to split k
  /// No kernel that may still run when this one begins writes rope.lengths or rope.inv_freq
  /// (rope_kv), nor, when this one launches its successor after its wait, `residual`
  /// (residual_add: then only the kernel just before may still run, and it does not write it), so
  /// they are read before waiting (the bias, a weight, always is). With the early launch at the
  /// start, kernels further back may still run, and the residual is read after the wait. Off where
  /// decode_options::early_reads is.
  bool early_reads = false;
  /// Set by the launch from decode_options::early_launch (one row, early_reads); callers leave it.
  bool early_launch = false;
  /// Set by the launch from decode_options::timeline (one row); callers leave it.
  unsigned long long* timeline = nullptr;
  /// Set by the launch from decode_options::small_gemm_batched_staging (one row); callers leave it.
  bool batched_staging = false;
  /// residual_add only: when `out` is set, `x` is not read; its rows (k = heads * head_dim) are
  /// the attention's splits that a decode_attention launch with merge_later left, merged as its
  /// combine kernel merges them (each split's products rounded, added in split order: bit for bit
  /// the combine kernel's where it gives each split a thread group of its own) while the inputs
  /// are staged. The splits holding slots are read from `lengths`, which no kernel of a step writes
  /// (read before the wait with early_reads).
  struct attention_splits {
    const float* out = nullptr;            ///< partial_out [rows, heads, splits, head_dim]
    const float* ml = nullptr;             ///< partial_ml [rows, heads, splits, 2]
    const std::int64_t* lengths = nullptr; ///< [rows], as decode_attention_args::lengths
    std::int64_t slots = 0, splits = 0, chunk = 0, head_dim = 0;
  } attention;
};

/// Whether the small-GEMM kernels take `rows` rows of inputs `k` wide in `t` (at most 4 rows, the
/// inputs in 48 KiB of shared memory, rows of whole 16 bytes).
bool small_gemm_supported(dtype t, std::int64_t rows, std::int64_t k);

/// residual[r] = to_dtype(residual[r] + to_dtype(x[r] W^T + bias)): the o and down projections
/// with the residual add of the next norm.
cudaError_t small_gemm_residual_add(dtype t, const small_gemm_args& a, cudaStream_t stream,
                                    const decode_options& o = {});

/// out[r, j] = silu_mul of (g, u) = to_dtype(norm(x[r]) W^T + bias) at columns j and n/2 + j: the
/// post-attention RMSNorm, the joined gate and up projections and silu(gate) * up.
cudaError_t small_gemm_silu_mul(dtype t, const small_gemm_args& a, cudaStream_t stream,
                                const decode_options& o = {});

/// The input RMSNorm, the joined q/k/v projection with its bias (one rounding) and what
/// rope_kv_write does with the result: q rotated to rope.q_out, k rotated and v to the cache.
/// n = (heads + 2 kv_heads) * head_dim.
cudaError_t small_gemm_rope_kv(dtype t, const small_gemm_args& a, cudaStream_t stream,
                               const decode_options& o = {});

/// Where greedy_logprob also records its results, for decoding steps replayed in a CUDA graph
/// (device pointers; history null: nothing recorded). With s = *step (read by every row before
/// any changes it): history[r * row_stride + 2 s] = tokens[r] and history[... + 1] = logprobs[r]
/// (doubles hold both exactly), where s < capacity (later steps are not recorded); then the last
/// row to finish sets *step = s + 1 and *done back to 0 (*done counts the rows finished).
struct greedy_record {
  double* history = nullptr;
  std::int64_t row_stride = 0;
  std::int64_t capacity = 0;
  int* step = nullptr;
  unsigned* done = nullptr;
};

/// Greedy sampling of `rows` rows of `vocab` logits [rows, vocab] (contiguous, storage type t):
/// tokens[r] = the first index of the row's maximum (torch::argmax), logprobs[r] = its
/// log-softmax in float32, -log(sum(exp(x - max))). Two kernels: `blocks` partial (max, index,
/// sum) triples per row into `partial` ([rows, blocks, 3] float32), then one block per row,
/// which also writes `record` (greedy_record).
cudaError_t greedy_logprob(dtype t, const void* logits, std::int64_t rows, std::int64_t vocab, std::int64_t* tokens,
                           float* logprobs, float* partial, std::int64_t blocks, cudaStream_t stream,
                           const greedy_record& record = {});

/// The `blocks` greedy_logprob uses for a vocabulary (and its partial buffer's size).
std::int64_t greedy_logprob_blocks(std::int64_t vocab);

/// One row's last step of a greedy decoding step: the final RMSNorm of the residual stream, the
/// output matrix and greedy sampling, without writing the logits (greedy_head).
struct greedy_head_args {
  const void* x = nullptr;           ///< [k]: the residual stream after the last layer
  const void* norm_weight = nullptr; ///< [k]: the final norm's weight
  float eps = 0.0f;
  const void* weight = nullptr;      ///< [vocab, k]: the output matrix
  std::int64_t k = 0, vocab = 0;
  std::int64_t* token = nullptr;     ///< [1]: the sampled token (the next step's input)
  float* logprob = nullptr;          ///< [1]: its log-prob
  float* partial = nullptr;          ///< [blocks, 3] float32 scratch (greedy_head_blocks)
  unsigned* done = nullptr;          ///< blocks finished; 0 before and after each launch
  std::int64_t* lengths = nullptr;   ///< [1] or null: advanced by one once the logits are read
  greedy_record record;              ///< as greedy_logprob's (its `done` is not used)
};

/// The normed row xn = RMSNorm(x) * norm_weight rounded to t as add_rms_norm rounds it, each
/// logit xn W[v]^T rounded to t (as the output matrix's GEMM returns it), and greedy_logprob's
/// token and log-prob of those logits, with `record` and `lengths` written as described. Every
/// block stages xn in shared memory (k * element size <= 48 KiB, k a whole number of 16-byte
/// vectors) and its warps take two rows of W at a time; the last block to finish merges the
/// blocks' (max, first index, sum) triples. Launched under programmatic dependent launch: the
/// first weight rows are loaded before the wait for the previous kernel.
cudaError_t greedy_head(dtype t, const greedy_head_args& a, cudaStream_t stream);

/// The blocks greedy_head launches on the current device (as many as are resident at once, at
/// most one warp per two rows): the rows of its partial buffer. 0 where it cannot run (k).
std::int64_t greedy_head_blocks(dtype t, std::int64_t k, std::int64_t vocab);

/// The learner's log-probabilities of target tokens from one chunk of logits [rows, vocab]
/// (contiguous, storage type t, as `linear` returned them): with x = float(logit) * inv_temperature,
/// lse[r] = log(sum_j exp(x[r, j])) and out[r] = x[r, targets[r]] - lse[r] in float32; a row with
/// targets[r] < 0 gets out 0 (its lse is still written). One block per row, one read of the row.
cudaError_t target_logprob_forward(dtype t, const void* logits, const std::int64_t* targets, std::int64_t rows,
                                   std::int64_t vocab, float inv_temperature, float* out, float* lse,
                                   cudaStream_t stream);

/// The gradient of target_logprob_forward's out with respect to the logits, given grad [rows]
/// (float32, dL/dout) and the forward's lse: grad_logits[r, j] = to_dtype(grad[r] * inv_temperature
/// * (1[j = targets[r]] - exp(x[r, j] - lse[r]))), zero on rows with targets[r] < 0. grad_logits
/// [rows, vocab] contiguous, storage type t; it may be `logits` itself (overwritten in place).
cudaError_t target_logprob_backward(dtype t, const void* logits, const std::int64_t* targets, const float* lse,
                                    const float* grad, std::int64_t rows, std::int64_t vocab, float inv_temperature,
                                    void* grad_logits, cudaStream_t stream);

// ---- the training forward's elementwise pieces and their gradients ----------------------------
// Each forward rounds where LibTorch's ops round (see the top of this file); each backward where
// LibTorch's autograd rounds the gradients of those ops.

/// The gradient of RMSNormImpl::forward (y = weight * to_dtype(x * rsqrt(mean(x^2) + eps))) for
/// `rows` rows of `dim` contiguous elements: dx (storage type) and per-block partial sums of the
/// weight's gradient, dweight_partial [blocks, dim] float32 (the caller sums over blocks). dim at
/// most rms_norm_backward_max_dim; `blocks` between 1 and rows.
cudaError_t rms_norm_backward(dtype t, const void* x, const void* weight, const void* dy, void* dx,
                              float* dweight_partial, std::int64_t rows, std::int64_t dim, float eps, std::int64_t blocks,
                              cudaStream_t stream);
constexpr std::int64_t rms_norm_backward_max_dim = 12288;

/// RoPE of x [tokens, heads, head_dim] (contiguous) with cos and sin [tokens, head_dim] (storage
/// type, as CausalLMImpl::rope makes them): out = x * cos + rotate_half(x) * sin, each product and
/// the sum rounded. With `backward`, x is the output's gradient and out the input's:
/// rotate_half^T(dy * sin) + dy * cos, rounded as autograd rounds it.
cudaError_t rope_rotate(dtype t, const void* x, const void* cos, const void* sin, void* out, std::int64_t tokens,
                        std::int64_t heads, std::int64_t head_dim, bool backward, cudaStream_t stream);

/// out = to_dtype(to_dtype(silu(gate)) * up) for gate and up of n elements each (contiguous).
cudaError_t silu_mul_pair(dtype t, const void* gate, const void* up, void* out, std::int64_t n, cudaStream_t stream);

/// The gradients of silu_mul_pair given dy: dup = to_dtype(dy * to_dtype(silu(gate))), dgate =
/// to_dtype(to_dtype(dy * up) * silu'(gate)) (silu' in float32, as torch's silu_backward).
cudaError_t silu_mul_pair_backward(dtype t, const void* gate, const void* up, const void* dy, void* dgate, void* dup,
                                   std::int64_t n, cudaStream_t stream);

} // namespace crucible::policy::kernels
