// policy/kernels/fused.hpp: ATen front ends of the fused kernels (policy/kernels/kernels.cu), each
// a drop-in for a chain of LibTorch ops of policy/model/model.cpp on CUDA tensors. Shapes, dtypes
// and devices are checked (TORCH_CHECK, as the model's own checks); kernels run on the current CUDA
// stream, never synchronise and allocate only their outputs, so they can be captured in CUDA
// graphs. Nothing here records autograd history (the learner's log-softmax pair is used by an
// autograd function in policy/model/model.cpp). CUDA builds only.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "policy/kernels/decode_options.hpp"

namespace crucible::policy::fused {

/// Whether the kernels take tensors of this dtype (float32, float16, bfloat16).
bool supported_dtype(torch::ScalarType t);

/// Whether decode_attention takes `heads` query heads over `kv_heads` KV heads of `head_dim`.
bool supported_attention(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim);

/// residual = residual + delta (when delta is defined, in place, rounded to the dtype), then
/// RMSNorm(residual) with `weight` and `eps`: what `h = x + delta; norm(h)` computes in
/// policy/model/model.cpp. residual and delta [rows, dim] contiguous, weight [dim], one dtype;
/// returns a new [rows, dim] tensor.
torch::Tensor add_rms_norm(const torch::Tensor& delta, torch::Tensor& residual, const torch::Tensor& weight, double eps);

/// For qkv [rows, (heads + 2 kv_heads) * head_dim] (the fused q/k/v projection of one new token
/// per row) plus `qkv_bias` when defined ([(heads + 2 kv_heads) * head_dim], the sum rounded to
/// the dtype): rotates q and k at position lengths[r] with `inv_freq` (float32 [head_dim / 2], or
/// [rows, head_dim / 2] for dynamic RoPE) and `attention_scaling`, writes the rotated key and the
/// value to slot lengths[r] of k_cache and v_cache ([rows, kv_heads, slots, head_dim], last dim
/// contiguous, equal strides; views of a larger cache are fine) and returns q rotated, [rows,
/// heads, head_dim]. A row whose length is not below `slots` writes nothing to the cache.
torch::Tensor rope_write_kv(const torch::Tensor& qkv, const torch::Tensor& qkv_bias, const torch::Tensor& inv_freq,
                            double attention_scaling, const torch::Tensor& lengths, torch::Tensor& k_cache,
                            torch::Tensor& v_cache,
                            std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim);

/// `splits` of decode_attention asking for the wide kernel: one block of 16 warps per (row, query
/// head) over all of the row's slots, no combine kernel (16-byte aligned data only; otherwise as 0).
inline constexpr std::int64_t attention_wide = -1;

/// Attention of q [rows, heads, head_dim] (one token per row) over slots [0, min(lengths[r] + 1,
/// slots)) of k_cache and v_cache (as in rope_write_kv), grouped-query, scale 1 / sqrt(head_dim):
/// the masked SDPA of a decoding step. Returns [rows, heads * head_dim]. `splits` pieces of the
/// slot range run as separate blocks and are combined by a second kernel; 1 makes one kernel;
/// attention_wide takes the wide kernel; 0 chooses: the wide kernel where its blocks fill at
/// most half the SMs over a short cache (kernels::decode_attention_wide_suits; a decoding step at
/// batch 1), else splits from the device's SM count (kernels::choose_decode_attention_split:
/// about eight blocks per SM over full rows). A fixed shape gives a fixed choice (CUDA graphs); the
/// lengths are read on the device. Any strides with a contiguous last dimension work; q and
/// caches at 16-byte boundaries with strides of whole 16 bytes take the vectorised kernels.
/// `early_reads`: the kernel launched just before this call writes neither `lengths` nor any
/// slot below a row's length (true of the decoding step, whose previous kernel writes q and the
/// new token's slot), so those slots are loaded before waiting for it
/// (kernels::decode_attention_args::early_reads). `o`: the decoding variants (wide_attention for
/// the choice; early_reads, early_launch and timeline for the launch).
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& lengths, std::int64_t splits = 0, bool early_reads = false,
                               const kernels::decode_options& o = {});

/// silu(gate) * up for gate_up [rows, 2 inter] (gate columns first): torch::silu(gate) * up with
/// the same roundings. Returns [rows, inter].
torch::Tensor silu_mul(const torch::Tensor& gate_up);

/// Whether the few-row projections below take `rows` rows of inputs up to `dim` wide in `dtype`
/// (kernels::small_gemm_supported: at most 4 rows).
bool small_batch_supported(torch::ScalarType dtype, std::int64_t rows, std::int64_t dim);

/// The input RMSNorm of `residual` [rows, hidden] (weight `norm_weight`, `eps`), the joined q/k/v
/// projection `qkv_weight` [(heads + 2 kv_heads) * head_dim, hidden] plus `qkv_bias` (when
/// defined, added before the one rounding), then what rope_write_kv does with the result, in one
/// kernel. Returns q rotated, [rows, heads, head_dim]; `residual` is only read. `early_reads`:
/// the kernel launched just before writes neither `lengths` nor `inv_freq`, so they are read
/// before waiting for it.
torch::Tensor norm_qkv_rope(const torch::Tensor& residual, const torch::Tensor& norm_weight, double eps,
                            const torch::Tensor& qkv_weight, const torch::Tensor& qkv_bias,
                            const torch::Tensor& inv_freq, double attention_scaling, const torch::Tensor& lengths,
                            torch::Tensor& k_cache, torch::Tensor& v_cache, std::int64_t heads,
                            std::int64_t kv_heads, std::int64_t head_dim, bool early_reads = false,
                            const kernels::decode_options& o = {});

/// residual += linear(x, weight, bias), each rounded to the dtype as `residual + linear(...)`
/// rounds: x [rows, k], weight [n, k], residual [rows, n], in place, one kernel. `early_reads`:
/// the kernel launched just before does not write `residual`, so it is read before waiting for it.
void project_add(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                 torch::Tensor& residual, bool early_reads = false, const kernels::decode_options& o = {});

/// What decode_attention(q, k_cache, v_cache, lengths, 0, early_reads) and then project_add(that,
/// o_weight, o_bias, residual, early_reads) do, in two kernels at one row where it suits
/// (o.attention_merge and o.wide_attention on, choose_decode_attention_merge_split, at most
/// o.merge_splits splits of o.merge_warps warps a block): the attention in
/// wide blocks over a few splits of the slots, whose partial results the o projection merges as it
/// stages its input (the sums in another order than the one wide block a head: within rounding
/// of it). Elsewhere exactly those two calls.
void attention_project_add(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                           const torch::Tensor& lengths, const torch::Tensor& o_weight, const torch::Tensor& o_bias,
                           torch::Tensor& residual, bool early_reads = false,
                           const kernels::decode_options& o = {});

/// silu(gate) * up of the post-attention RMSNorm of `residual` through the joined gate and up
/// projection `gate_up_weight` [2 inter, hidden] (+ `gate_up_bias`), one kernel. Returns [rows, inter].
torch::Tensor norm_gate_up_silu(const torch::Tensor& residual, const torch::Tensor& norm_weight, double eps,
                                const torch::Tensor& gate_up_weight, const torch::Tensor& gate_up_bias,
                                const kernels::decode_options& o = {});

/// Greedy sampling of logits [rows, vocab] (contiguous, float32, float16 or bfloat16): the first
/// index of each row's maximum (int64 [rows], as torch::argmax) and its log-softmax (float32
/// [rows], as torch::log_softmax(logits.float()) there), in two kernels instead of a float copy,
/// an argmax and a log-softmax over the whole row.
std::pair<torch::Tensor, torch::Tensor> greedy_logprob(const torch::Tensor& logits);

/// greedy_logprob for decoding steps replayed in a CUDA graph: the tokens go to `next` (int64
/// [rows], contiguous: the next step's input) and, with their log-probs, to history[r, s] ([rows,
/// capacity, 2] float64, each row's steps contiguous) at s = counters[0] (int32 [2] on the device:
/// the step, then a count the kernel keeps at 0 between calls); then counters[0] advances by one.
/// A step at or past the capacity is not recorded. The caller zeroes counters[0] to start over.
void greedy_record(const torch::Tensor& logits, const torch::Tensor& next, const torch::Tensor& history,
                   const torch::Tensor& counters);

/// Whether greedy_head runs for these weights: a supported dtype and a row of `k` that one block
/// stages (kernels::greedy_head_blocks). Whether it is wanted is the caller's
/// (decode_options::greedy_head).
bool greedy_head_ready(torch::ScalarType dtype, std::int64_t k, std::int64_t vocab);

/// The end of a one-row greedy decoding step in one kernel (kernels::greedy_head): the final
/// RMSNorm of `residual` ([1, k]) with norm_weight [k] and eps, the output matrix `weight` [vocab,
/// k] (logits rounded to the dtype, not written) and greedy sampling, the token to next (int64
/// [1]) and with its log-prob to history as greedy_record writes them (history [1, capacity, 2]
/// float64 and counters int32 [2] as there); lengths (int64 [1]) then advances by one.
void greedy_head(const torch::Tensor& residual, const torch::Tensor& norm_weight, double eps,
                 const torch::Tensor& weight, const torch::Tensor& lengths, const torch::Tensor& next,
                 const torch::Tensor& history, const torch::Tensor& counters);

/// The learner's target log-probabilities of one chunk of logits [rows, vocab] (contiguous CUDA,
/// float32, float16 or bfloat16, as `linear` returned them) and targets [rows] (int64): with
/// x = logits.float() / temperature, {x[r, targets[r]] - logsumexp(x[r]), logsumexp(x[r])}, both
/// float32 [rows], the first 0 where targets < 0. One read of the logits instead of a float copy,
/// a log-sum-exp and a gather.
std::pair<torch::Tensor, torch::Tensor> target_logprobs(const torch::Tensor& logits, const torch::Tensor& targets,
                                                        double temperature);

/// The gradient of target_logprobs' first result with respect to the logits, given `grad` (float32
/// [rows]) and its `lse`: (1[j = target] - softmax(x)_j) * grad / temperature, rounded to the
/// logits' dtype and written over `logits` (returned), zero on rows whose target is < 0.
torch::Tensor target_logprobs_backward(torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse,
                                       const torch::Tensor& grad, double temperature);

// ---- the training forward's elementwise pieces (autograd functions in policy/model/model.cpp) ----------

/// The gradient of RMSNorm (RMSNormImpl::forward, or add_rms_norm without delta) of x [rows, dim]
/// with `weight` [dim] and `eps`, given dy [rows, dim] (all contiguous, one dtype; dim at most
/// kernels::rms_norm_backward_max_dim): {dx [rows, dim], dweight [dim]} in that dtype, the
/// weight's gradient summed in float32.
std::pair<torch::Tensor, torch::Tensor> rms_norm_backward(const torch::Tensor& x, const torch::Tensor& weight,
                                                          const torch::Tensor& dy, double eps);

/// Whether rms_norm_backward takes rows of `dim` elements.
bool rms_norm_backward_supported(std::int64_t dim);

/// RoPE of x [tokens, heads, head_dim] with cos and sin [tokens, head_dim] (contiguous, one dtype),
/// as apply_rope computes it; with `backward`, x is the gradient of the output and the result the
/// gradient of the input. A new [tokens, heads, head_dim] tensor.
torch::Tensor rope_rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool backward);

/// torch::silu(gate) * up for gate and up of one shape (contiguous, one dtype), one kernel.
torch::Tensor silu_mul_pair(const torch::Tensor& gate, const torch::Tensor& up);

/// The gradients {dgate, dup} of silu_mul_pair(gate, up) given dy (as autograd rounds them).
std::pair<torch::Tensor, torch::Tensor> silu_mul_pair_backward(const torch::Tensor& gate, const torch::Tensor& up,
                                                               const torch::Tensor& dy);

} // namespace crucible::policy::fused
