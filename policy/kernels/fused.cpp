// policy/kernels/fused.cpp: tensors from policy/model/model.cpp's fused decoding step and training
// forward in, checked and handed to the raw kernels of policy/kernels/kernels.cu on the current
// stream; new output tensors out.
#include "policy/kernels/fused.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "core/error.hpp"
#include "policy/kernels/kernels.hpp"

namespace crucible::policy::fused {

namespace {

kernels::dtype kernel_dtype_of(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return kernels::dtype::f32;
    case torch::kHalf: return kernels::dtype::f16;
    case torch::kBFloat16: return kernels::dtype::bf16;
    default: TORCH_CHECK(false, "fused kernels: dtype ", t, " is not float32, float16 or bfloat16");
  }
}

kernels::dtype kernel_dtype(const torch::Tensor& t) { return kernel_dtype_of(t.scalar_type()); }

// A launch's status, checked with the caller's site (check_launch below).
void check_launch_at(cudaError_t e, const char* what, const std::string& site) {
  TORCH_CHECK(e == cudaSuccess, "fused kernel ", what, " at ", site, ": ", cudaGetErrorName(e), " (",
              cudaGetErrorString(e), ")");
}
#define check_launch(e, what) check_launch_at((e), (what), CRUCIBLE_SITE())

void check_cuda(const torch::Tensor& t, const torch::Tensor& like, const char* what) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), "fused kernels: ", what, " must be on ", like.device(),
              ", got ", t.device());
}

// A [rows, kv_heads, slots, head_dim] cache with a contiguous last dimension.
void check_cache(const torch::Tensor& c, const torch::Tensor& like, std::int64_t rows, std::int64_t kv_heads,
                 std::int64_t head_dim, const char* what) {
  check_cuda(c, like, what);
  TORCH_CHECK(c.dim() == 4 && c.size(0) == rows && c.size(1) == kv_heads && c.size(3) == head_dim && c.stride(3) == 1,
              "fused kernels: ", what, " must be [", rows, ", ", kv_heads, ", slots, ", head_dim,
              "] with a contiguous last dimension, got ", c.sizes(), " strides ", c.strides());
  TORCH_CHECK(c.scalar_type() == like.scalar_type(), "fused kernels: ", what, " is ", c.scalar_type(), ", not ",
              like.scalar_type());
}

// A contiguous [rows] vector of `dtype` (int64 or float32) on like's device; `what` prefixes the error.
void check_vector(const torch::Tensor& t, const torch::Tensor& like, std::int64_t rows, torch::ScalarType dtype,
                  const char* name, const char* what) {
  check_cuda(t, like, name);
  TORCH_CHECK(t.scalar_type() == dtype && t.dim() == 1 && t.size(0) == rows && t.is_contiguous(), what, ": ", name,
              " must be contiguous ", dtype == torch::kLong ? "int64" : "float32", " [", rows, "], got ",
              t.scalar_type(), " ", t.sizes());
}

void check_lengths(const torch::Tensor& lengths, const torch::Tensor& like, std::int64_t rows) {
  check_vector(lengths, like, rows, torch::kLong, "lengths", "fused kernels");
}

// The cache fields that rope_kv_args and decode_attention_args share.
template <class Args>
void set_cache(Args& a, const torch::Tensor& k_cache, const torch::Tensor& v_cache, const torch::Tensor& lengths) {
  a.k_cache = k_cache.data_ptr();
  a.v_cache = v_cache.data_ptr();
  a.row_stride = k_cache.stride(0);
  a.head_stride = k_cache.stride(1);
  a.slot_stride = k_cache.stride(2);
  a.lengths = lengths.data_ptr<std::int64_t>();
}

// Checks the RoPE + cache-write operands of `rows` rows (of `like`'s device and dtype) and fills
// every field of the kernels' arguments but qkv and qkv_bias; q_out is `q`'s storage.
kernels::rope_kv_args rope_targets(const char* what, const torch::Tensor& like, std::int64_t rows,
                                   const torch::Tensor& inv_freq, double attention_scaling,
                                   const torch::Tensor& lengths, torch::Tensor& k_cache, torch::Tensor& v_cache,
                                   std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                                   const torch::Tensor& q) {
  check_lengths(lengths, like, rows);
  check_cache(k_cache, like, rows, kv_heads, head_dim, "k_cache");
  check_cache(v_cache, like, rows, kv_heads, head_dim, "v_cache");
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && k_cache.size(2) == v_cache.size(2), what,
              ": k_cache and v_cache differ in shape or strides");
  check_cuda(inv_freq, like, "inv_freq");
  const bool per_row = inv_freq.dim() == 2;
  TORCH_CHECK(inv_freq.scalar_type() == torch::kFloat && inv_freq.is_contiguous()
                && ((inv_freq.dim() == 1 && inv_freq.size(0) == head_dim / 2)
                    || (per_row && inv_freq.size(0) == rows && inv_freq.size(1) == head_dim / 2)),
              what, ": inv_freq must be contiguous float32 [", head_dim / 2, "] or [", rows, ", ", head_dim / 2,
              "], got ", inv_freq.scalar_type(), " ", inv_freq.sizes());
  kernels::rope_kv_args a;
  a.q_out = q.data_ptr();
  set_cache(a, k_cache, v_cache, lengths);
  a.inv_freq = inv_freq.data_ptr<float>();
  a.inv_row_stride = per_row ? head_dim / 2 : 0;
  a.attention_scaling = static_cast<float>(attention_scaling);
  a.rows = rows;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim;
  a.slots = k_cache.size(2);
  return a;
}

} // namespace

bool supported_dtype(torch::ScalarType t) { return t == torch::kFloat || t == torch::kHalf || t == torch::kBFloat16; }

bool supported_attention(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
  return heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 && head_dim % 2 == 0
         && head_dim <= kernels::decode_attention_max_head_dim
         && kernels::decode_attention_shared_bytes(kernels::decode_attention_max_heads_per_block, head_dim)
              <= 48 * 1024;
}

torch::Tensor add_rms_norm(const torch::Tensor& delta, torch::Tensor& residual, const torch::Tensor& weight,
                           double eps) {
  TORCH_CHECK(residual.is_cuda() && residual.dim() == 2 && residual.is_contiguous(),
              "add_rms_norm: residual must be a contiguous CUDA [rows, dim] tensor, got ", residual.sizes());
  const auto rows = residual.size(0), dim = residual.size(1);
  check_cuda(weight, residual, "weight");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == dim && weight.is_contiguous()
                && weight.scalar_type() == residual.scalar_type(),
              "add_rms_norm: weight must be contiguous [", dim, "] of ", residual.scalar_type(), ", got ",
              weight.scalar_type(), " ", weight.sizes());
  if (delta.defined()) {
    check_cuda(delta, residual, "delta");
    TORCH_CHECK(delta.sizes() == residual.sizes() && delta.is_contiguous() && delta.scalar_type() == residual.scalar_type(),
                "add_rms_norm: delta must be contiguous ", residual.sizes(), " of ", residual.scalar_type(), ", got ",
                delta.scalar_type(), " ", delta.sizes());
  }
  c10::cuda::CUDAGuard guard(residual.device());
  auto out = torch::empty_like(residual);
  check_launch(kernels::add_rms_norm(kernel_dtype(residual), delta.defined() ? delta.data_ptr() : nullptr,
                                     residual.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, dim,
                                     static_cast<float>(eps), at::cuda::getCurrentCUDAStream()),
               "add_rms_norm");
  return out;
}

torch::Tensor rope_write_kv(const torch::Tensor& qkv, const torch::Tensor& qkv_bias, const torch::Tensor& inv_freq,
                            double attention_scaling, const torch::Tensor& lengths, torch::Tensor& k_cache,
                            torch::Tensor& v_cache,
                            std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
  TORCH_CHECK(qkv.is_cuda() && qkv.dim() == 2 && qkv.is_contiguous()
                && qkv.size(1) == (heads + 2 * kv_heads) * head_dim,
              "rope_write_kv: qkv must be a contiguous CUDA [rows, ", (heads + 2 * kv_heads) * head_dim,
              "] tensor, got ", qkv.sizes());
  TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_write_kv: head_dim must be even, got ", head_dim);
  if (qkv_bias.defined()) {
    check_cuda(qkv_bias, qkv, "qkv_bias");
    TORCH_CHECK(qkv_bias.dim() == 1 && qkv_bias.size(0) == qkv.size(1) && qkv_bias.is_contiguous()
                  && qkv_bias.scalar_type() == qkv.scalar_type(),
                "rope_write_kv: qkv_bias must be contiguous [", qkv.size(1), "] of ", qkv.scalar_type(), ", got ",
                qkv_bias.scalar_type(), " ", qkv_bias.sizes());
  }
  const auto rows = qkv.size(0);
  c10::cuda::CUDAGuard guard(qkv.device());
  auto q = torch::empty({rows, heads, head_dim}, qkv.options());
  auto a = rope_targets("rope_write_kv", qkv, rows, inv_freq, attention_scaling, lengths, k_cache, v_cache, heads,
                        kv_heads, head_dim, q);
  a.qkv = qkv.data_ptr();
  a.qkv_bias = qkv_bias.defined() ? qkv_bias.data_ptr() : nullptr;
  check_launch(kernels::rope_kv_write(kernel_dtype(qkv), a, at::cuda::getCurrentCUDAStream()), "rope_kv_write");
  return q;
}

namespace {

// q, the caches and the lengths checked (`what` names the caller) and the arguments they fill,
// with out, splits and chunk left to the caller.
kernels::decode_attention_args attention_args(const torch::Tensor& q, const torch::Tensor& k_cache,
                                              const torch::Tensor& v_cache, const torch::Tensor& lengths,
                                              bool early_reads, const char* what) {
  TORCH_CHECK(q.is_cuda() && q.dim() == 3 && q.is_contiguous(), what,
              ": q must be a contiguous CUDA [rows, heads, head_dim] tensor, got ", q.sizes());
  const auto rows = q.size(0), heads = q.size(1), head_dim = q.size(2);
  TORCH_CHECK(k_cache.dim() == 4, what, ": k_cache must be [rows, kv_heads, slots, head_dim], got ", k_cache.sizes());
  const auto kv_heads = k_cache.size(1), slots = k_cache.size(2);
  TORCH_CHECK(supported_attention(heads, kv_heads, head_dim), what, ": ", heads, " query heads over ", kv_heads,
              " KV heads of dimension ", head_dim, " are not supported");
  check_cache(k_cache, q, rows, kv_heads, head_dim, "k_cache");
  check_cache(v_cache, q, rows, kv_heads, head_dim, "v_cache");
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && v_cache.size(2) == slots, what,
              ": k_cache and v_cache differ in shape or strides");
  check_lengths(lengths, q, rows);
  TORCH_CHECK(slots >= 1, what, ": the cache has no slots");
  kernels::decode_attention_args a;
  a.q = q.data_ptr();
  set_cache(a, k_cache, v_cache, lengths);
  a.rows = rows;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim;
  a.slots = slots;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  a.early_reads = early_reads;
  return a;
}

// The wide plan for these arguments with `warps` warps a block (vec 1: the data is not 16-byte
// aligned, no wide kernel).
kernels::decode_attention_plan wide_plan(const kernels::decode_attention_args& a, const torch::Tensor& q,
                                         int warps = kernels::decode_attention_wide_warps) {
  const auto plan = kernels::plan_decode_attention(kernel_dtype(q), a);
  return kernels::plan_decode_attention_wide(static_cast<int>(q.element_size()), plan.vec > 1,
                                             static_cast<int>(a.heads / a.kv_heads), static_cast<int>(a.head_dim), warps);
}

// Float32 buffers for `splits` partial results of every (row, head), set in `a`; returned to keep them alive.
std::pair<torch::Tensor, torch::Tensor> partial_buffers(kernels::decode_attention_args& a, const torch::Tensor& q,
                                                        std::int64_t splits) {
  auto f32 = q.options().dtype(torch::kFloat);
  auto out = torch::empty({a.rows, a.heads, splits, a.head_dim}, f32);
  auto ml = torch::empty({a.rows, a.heads, splits, 2}, f32);
  a.partial_out = out.data_ptr<float>();
  a.partial_ml = ml.data_ptr<float>();
  return {out, ml};
}

} // namespace

torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& lengths, std::int64_t splits, bool early_reads,
                               const kernels::decode_options& o) {
  auto a = attention_args(q, k_cache, v_cache, lengths, early_reads, "decode_attention");
  TORCH_CHECK(splits >= attention_wide, "decode_attention: splits must be >= 0 or attention_wide (",
              attention_wide, "), got ", splits);
  c10::cuda::CUDAGuard guard(q.device());
  auto out = torch::empty({a.rows, a.heads * a.head_dim}, q.options());
  a.out = out.data_ptr();
  const auto dtype = kernel_dtype(q);
  const auto plan = kernels::plan_decode_attention(dtype, a);
  const auto sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto wide = wide_plan(a, q);
  // The wide kernel where asked for (16-byte aligned data only), or where it suits and may be chosen.
  a.wide = wide.vec > 1
           && (splits == attention_wide
               || (splits == 0 && o.wide_attention
                   && kernels::decode_attention_wide_suits(wide, a.rows, a.heads, a.slots, sms)));
  if (a.wide) {
    splits = 1;
    a.splits = 1;
    a.chunk = (a.slots + wide.granule - 1) / wide.granule * wide.granule;
  } else {
    const auto split =
      kernels::choose_decode_attention_split(plan, a.rows, a.kv_heads, a.slots, sms, std::max<std::int64_t>(splits, 0));
    splits = split.splits;
    a.splits = split.splits;
    a.chunk = split.chunk;
  }
  std::pair<torch::Tensor, torch::Tensor> partial;
  if (splits > 1)
    partial = partial_buffers(a, q, splits);
  check_launch(kernels::decode_attention(dtype, a, at::cuda::getCurrentCUDAStream(), o), "decode_attention");
  return out;
}

torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.is_cuda() && gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "silu_mul: gate_up must be a contiguous CUDA [rows, 2 * inter] tensor, got ", gate_up.sizes());
  c10::cuda::CUDAGuard guard(gate_up.device());
  const auto rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  auto out = torch::empty({rows, inter}, gate_up.options());
  check_launch(kernels::silu_mul(kernel_dtype(gate_up), gate_up.data_ptr(), out.data_ptr(), rows, inter,
                                 at::cuda::getCurrentCUDAStream()),
               "silu_mul");
  return out;
}


bool small_batch_supported(torch::ScalarType dtype, std::int64_t rows, std::int64_t dim) {
  return supported_dtype(dtype) && kernels::small_gemm_supported(kernel_dtype_of(dtype), rows, dim);
}

namespace {

// x [rows, k] and weight [n, k] contiguous CUDA tensors of one dtype on one device, bias [n] or
// undefined; the arguments they fill.
kernels::small_gemm_args small_gemm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                    const char* what) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(), what, ": input must be a contiguous CUDA [rows, k] tensor, got ",
              x.sizes());
  check_cuda(weight, x, "weight");
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == x.size(1) && weight.is_contiguous()
                && weight.scalar_type() == x.scalar_type(),
              what, ": weight must be contiguous [n, ", x.size(1), "] of ", x.scalar_type(), ", got ",
              weight.scalar_type(), " ", weight.sizes());
  if (bias.defined()) {
    check_cuda(bias, x, "bias");
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0) && bias.is_contiguous()
                  && bias.scalar_type() == x.scalar_type(),
                what, ": bias must be contiguous [", weight.size(0), "] of ", x.scalar_type(), ", got ",
                bias.scalar_type(), " ", bias.sizes());
  }
  TORCH_CHECK(small_batch_supported(x.scalar_type(), x.size(0), x.size(1)), what, ": ", x.size(0), " rows of ",
              x.size(1), " ", x.scalar_type(), " are not supported (at most 4 rows in 48 KiB, rows of whole 16 bytes)");
  kernels::small_gemm_args a;
  a.x = x.data_ptr();
  a.weight = weight.data_ptr();
  a.bias = bias.defined() ? bias.data_ptr() : nullptr;
  a.rows = x.size(0);
  a.k = x.size(1);
  a.n = weight.size(0);
  a.sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return a;
}

void set_norm(kernels::small_gemm_args& a, const torch::Tensor& x, const torch::Tensor& norm_weight, double eps,
              const char* what) {
  check_cuda(norm_weight, x, "norm_weight");
  TORCH_CHECK(norm_weight.dim() == 1 && norm_weight.size(0) == x.size(1) && norm_weight.is_contiguous()
                && norm_weight.scalar_type() == x.scalar_type(),
              what, ": norm_weight must be contiguous [", x.size(1), "] of ", x.scalar_type(), ", got ",
              norm_weight.scalar_type(), " ", norm_weight.sizes());
  a.norm_weight = norm_weight.data_ptr();
  a.eps = static_cast<float>(eps);
}

} // namespace

torch::Tensor norm_qkv_rope(const torch::Tensor& residual, const torch::Tensor& norm_weight, double eps,
                            const torch::Tensor& qkv_weight, const torch::Tensor& qkv_bias,
                            const torch::Tensor& inv_freq, double attention_scaling, const torch::Tensor& lengths,
                            torch::Tensor& k_cache, torch::Tensor& v_cache, std::int64_t heads,
                            std::int64_t kv_heads, std::int64_t head_dim, bool early_reads,
                            const kernels::decode_options& o) {
  auto a = small_gemm(residual, qkv_weight, qkv_bias, "norm_qkv_rope");
  a.early_reads = early_reads;
  set_norm(a, residual, norm_weight, eps, "norm_qkv_rope");
  TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0 && heads > 0 && kv_heads > 0
                && qkv_weight.size(0) == (heads + 2 * kv_heads) * head_dim,
              "norm_qkv_rope: qkv_weight has ", qkv_weight.size(0), " rows, not (", heads, " + 2 * ", kv_heads,
              ") * ", head_dim);
  const auto rows = residual.size(0);
  c10::cuda::CUDAGuard guard(residual.device());
  auto q = torch::empty({rows, heads, head_dim}, residual.options());
  a.rope = rope_targets("norm_qkv_rope", residual, rows, inv_freq, attention_scaling, lengths, k_cache, v_cache, heads,
                        kv_heads, head_dim, q);
  check_launch(kernels::small_gemm_rope_kv(kernel_dtype(residual), a, at::cuda::getCurrentCUDAStream(), o),
               "small_gemm_rope_kv");
  return q;
}

namespace {

// The arguments of residual += linear(x, weight, bias) with `residual` checked (`what` names the caller).
kernels::small_gemm_args project_add_args(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                          torch::Tensor& residual, bool early_reads, const char* what) {
  auto a = small_gemm(x, weight, bias, what);
  a.early_reads = early_reads;
  check_cuda(residual, x, "residual");
  TORCH_CHECK(residual.dim() == 2 && residual.size(0) == x.size(0) && residual.size(1) == weight.size(0)
                && residual.is_contiguous() && residual.scalar_type() == x.scalar_type(),
              what, ": residual must be contiguous [", x.size(0), ", ", weight.size(0), "] of ", x.scalar_type(),
              ", got ", residual.scalar_type(), " ", residual.sizes());
  TORCH_CHECK(!residual.is_same(x), what, ": residual and x must be different tensors");
  a.residual = residual.data_ptr();
  return a;
}

} // namespace

void project_add(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                 torch::Tensor& residual, bool early_reads, const kernels::decode_options& o) {
  auto a = project_add_args(x, weight, bias, residual, early_reads, "project_add");
  c10::cuda::CUDAGuard guard(x.device());
  check_launch(kernels::small_gemm_residual_add(kernel_dtype(x), a, at::cuda::getCurrentCUDAStream(), o),
               "small_gemm_residual_add");
}

void attention_project_add(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                           const torch::Tensor& lengths, const torch::Tensor& o_weight, const torch::Tensor& o_bias,
                           torch::Tensor& residual, bool early_reads, const kernels::decode_options& o) {
  auto a = attention_args(q, k_cache, v_cache, lengths, early_reads, "attention_project_add");
  const int warps =
    o.merge_warps == kernels::decode_attention_wide_warps ? o.merge_warps : kernels::decode_attention_half_wide_warps;
  const int most = std::clamp(o.merge_splits, 2, kernels::decode_attention_merge_max_splits);
  const auto sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto split = a.rows == 1 && o.attention_merge && o.wide_attention
                       ? kernels::choose_decode_attention_merge_split(wide_plan(a, q, warps), a.rows, a.heads, a.slots,
                                                                      sms, most)
                       : kernels::decode_attention_split{0, 0};
  auto x = q.view({a.rows, a.heads * a.head_dim}); // the o projection's input, as the attention writes it
  if (split.splits < 2 || !small_batch_supported(q.scalar_type(), a.rows, x.size(1))) {
    project_add(decode_attention(q, k_cache, v_cache, lengths, 0, early_reads, o), o_weight, o_bias, residual,
                early_reads, o);
    return;
  }
  // Shapes checked before anything is launched; x stands for the merged splits, which replace it.
  auto g = project_add_args(x, o_weight, o_bias, residual, early_reads, "attention_project_add");
  c10::cuda::CUDAGuard guard(q.device());
  a.wide = true;
  a.splits = split.splits;
  a.chunk = split.chunk;
  a.merge_later = true;
  a.wide_warps = warps;
  const auto partial = partial_buffers(a, q, split.splits);
  const auto dtype = kernel_dtype(q);
  check_launch(kernels::decode_attention(dtype, a, at::cuda::getCurrentCUDAStream(), o), "decode_attention");
  g.attention.out = a.partial_out;
  g.attention.ml = a.partial_ml;
  g.attention.lengths = a.lengths;
  g.attention.slots = a.slots;
  g.attention.splits = a.splits;
  g.attention.chunk = a.chunk;
  g.attention.head_dim = a.head_dim;
  check_launch(kernels::small_gemm_residual_add(dtype, g, at::cuda::getCurrentCUDAStream(), o), "small_gemm_residual_add");
}

torch::Tensor norm_gate_up_silu(const torch::Tensor& residual, const torch::Tensor& norm_weight, double eps,
                                const torch::Tensor& gate_up_weight, const torch::Tensor& gate_up_bias,
                                const kernels::decode_options& o) {
  auto a = small_gemm(residual, gate_up_weight, gate_up_bias, "norm_gate_up_silu");
  set_norm(a, residual, norm_weight, eps, "norm_gate_up_silu");
  TORCH_CHECK(gate_up_weight.size(0) % 2 == 0, "norm_gate_up_silu: gate_up_weight has an odd number of rows, ",
              gate_up_weight.size(0));
  c10::cuda::CUDAGuard guard(residual.device());
  auto out = torch::empty({residual.size(0), gate_up_weight.size(0) / 2}, residual.options());
  a.out = out.data_ptr();
  check_launch(kernels::small_gemm_silu_mul(kernel_dtype(residual), a, at::cuda::getCurrentCUDAStream(), o),
               "small_gemm_silu_mul");
  return out;
}

std::pair<torch::Tensor, torch::Tensor> greedy_logprob(const torch::Tensor& logits) {
  TORCH_CHECK(logits.is_cuda() && logits.dim() == 2 && logits.is_contiguous() && logits.size(1) > 0,
              "greedy_logprob: logits must be a contiguous CUDA [rows, vocab] tensor, got ", logits.sizes());
  c10::cuda::CUDAGuard guard(logits.device());
  const auto rows = logits.size(0), vocab = logits.size(1);
  const auto blocks = kernels::greedy_logprob_blocks(vocab);
  auto tokens = torch::empty({rows}, logits.options().dtype(torch::kLong));
  auto logprobs = torch::empty({rows}, logits.options().dtype(torch::kFloat));
  auto partial = torch::empty({rows, blocks, 3}, logits.options().dtype(torch::kFloat));
  check_launch(kernels::greedy_logprob(kernel_dtype(logits), logits.data_ptr(), rows, vocab,
                                       tokens.data_ptr<std::int64_t>(), logprobs.data_ptr<float>(),
                                       partial.data_ptr<float>(), blocks, at::cuda::getCurrentCUDAStream()),
               "greedy_logprob");
  return {tokens, logprobs};
}

namespace {

// The history ([rows, capacity, 2] float64, each row's steps contiguous) and counters (int32 [2])
// of greedy_record and greedy_head, checked, as the kernels take them.
kernels::greedy_record history_record(const char* name, std::int64_t rows, const torch::Device& device,
                                      const torch::Tensor& history, const torch::Tensor& counters) {
  TORCH_CHECK(history.device() == device && history.scalar_type() == torch::kDouble && history.dim() == 3
                && history.size(0) == rows && history.size(1) > 0 && history.size(2) == 2 && history.stride(2) == 1
                && history.stride(1) == 2 && history.stride(0) >= 2 * history.size(1),
              name, ": history must be a float64 [", rows, ", capacity, 2] tensor with each row's steps contiguous on ",
              device, ", got ", history.sizes(), " strides ", history.strides());
  TORCH_CHECK(counters.device() == device && counters.scalar_type() == torch::kInt && counters.numel() == 2
                && counters.is_contiguous(),
              name, ": counters must be a contiguous int32 [2] tensor on ", device);
  kernels::greedy_record record;
  record.history = history.data_ptr<double>();
  record.row_stride = history.stride(0);
  record.capacity = history.size(1);
  record.step = counters.data_ptr<std::int32_t>();
  record.done = reinterpret_cast<unsigned*>(counters.data_ptr<std::int32_t>() + 1);
  return record;
}

} // namespace

bool greedy_head_ready(torch::ScalarType dtype, std::int64_t k, std::int64_t vocab) {
  return supported_dtype(dtype) && kernels::greedy_head_blocks(kernel_dtype_of(dtype), k, vocab) > 0;
}

void greedy_head(const torch::Tensor& residual, const torch::Tensor& norm_weight, double eps,
                 const torch::Tensor& weight, const torch::Tensor& lengths, const torch::Tensor& next,
                 const torch::Tensor& history, const torch::Tensor& counters) {
  TORCH_CHECK(residual.is_cuda() && residual.dim() == 2 && residual.size(0) == 1 && residual.is_contiguous(),
              "greedy_head: residual must be a contiguous CUDA [1, k] tensor, got ", residual.sizes());
  const auto k = residual.size(1);
  const auto on = residual.device();
  const auto dt = residual.scalar_type();
  TORCH_CHECK(norm_weight.device() == on && norm_weight.scalar_type() == dt && norm_weight.numel() == k
                && norm_weight.is_contiguous(),
              "greedy_head: norm_weight must be a contiguous [", k, "] tensor of the residual's dtype and device");
  TORCH_CHECK(weight.device() == on && weight.scalar_type() == dt && weight.dim() == 2 && weight.size(1) == k
                && weight.is_contiguous(),
              "greedy_head: weight must be a contiguous [vocab, ", k, "] tensor of the residual's dtype and device, got ",
              weight.sizes());
  TORCH_CHECK(next.device() == on && next.scalar_type() == torch::kLong && next.numel() == 1,
              "greedy_head: next must be an int64 [1] tensor on the residual's device");
  TORCH_CHECK(!lengths.defined() || (lengths.device() == on && lengths.scalar_type() == torch::kLong && lengths.numel() == 1),
              "greedy_head: lengths must be an int64 [1] tensor on the residual's device");
  const auto record = history_record("greedy_head", 1, on, history, counters);
  c10::cuda::CUDAGuard guard(on);
  const auto blocks = kernels::greedy_head_blocks(kernel_dtype(residual), k, weight.size(0));
  TORCH_CHECK(blocks > 0, "greedy_head: a row of ", k, " ", dt, " elements is not one the kernel stages");
  auto logprob = torch::empty({1}, residual.options().dtype(torch::kFloat));
  auto partial = torch::empty({blocks, 3}, residual.options().dtype(torch::kFloat));
  kernels::greedy_head_args a;
  a.x = residual.data_ptr();
  a.norm_weight = norm_weight.data_ptr();
  a.eps = static_cast<float>(eps);
  a.weight = weight.data_ptr();
  a.k = k;
  a.vocab = weight.size(0);
  a.token = next.data_ptr<std::int64_t>();
  a.logprob = logprob.data_ptr<float>();
  a.partial = partial.data_ptr<float>();
  a.done = record.done;
  a.lengths = lengths.defined() ? lengths.data_ptr<std::int64_t>() : nullptr;
  a.record = record;
  check_launch(kernels::greedy_head(kernel_dtype(residual), a, at::cuda::getCurrentCUDAStream()), "greedy_head");
}

void greedy_record(const torch::Tensor& logits, const torch::Tensor& next, const torch::Tensor& history,
                   const torch::Tensor& counters) {
  TORCH_CHECK(logits.is_cuda() && logits.dim() == 2 && logits.is_contiguous() && logits.size(1) > 0,
              "greedy_record: logits must be a contiguous CUDA [rows, vocab] tensor, got ", logits.sizes());
  const auto rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(next.device() == logits.device() && next.scalar_type() == torch::kLong && next.dim() == 1
                && next.size(0) == rows && next.is_contiguous(),
              "greedy_record: next must be a contiguous int64 [", rows, "] tensor on the logits' device, got ",
              next.sizes(), " ", next.scalar_type());
  const auto record = history_record("greedy_record", rows, logits.device(), history, counters);
  c10::cuda::CUDAGuard guard(logits.device());
  const auto blocks = kernels::greedy_logprob_blocks(vocab);
  auto logprobs = torch::empty({rows}, logits.options().dtype(torch::kFloat));
  auto partial = torch::empty({rows, blocks, 3}, logits.options().dtype(torch::kFloat));
  check_launch(kernels::greedy_logprob(kernel_dtype(logits), logits.data_ptr(), rows, vocab, next.data_ptr<std::int64_t>(),
                                       logprobs.data_ptr<float>(), partial.data_ptr<float>(), blocks,
                                       at::cuda::getCurrentCUDAStream(), record),
               "greedy_record");
}

namespace {

// Logits [rows, vocab] and their targets [rows] as the log-softmax kernels take them.
void check_logprob_operands(const torch::Tensor& logits, const torch::Tensor& targets, const char* what) {
  TORCH_CHECK(logits.is_cuda() && logits.dim() == 2 && logits.is_contiguous() && logits.size(1) > 0, what,
              ": logits must be a contiguous CUDA [rows, vocab] tensor, got ", logits.sizes(), " on ", logits.device());
  check_vector(targets, logits, logits.size(0), torch::kLong, "targets", what);
}

float inverse_temperature(double temperature, const char* what) {
  TORCH_CHECK(temperature > 0, what, ": temperature must be positive, got ", temperature);
  return static_cast<float>(1.0 / temperature);
}

} // namespace

std::pair<torch::Tensor, torch::Tensor> target_logprobs(const torch::Tensor& logits, const torch::Tensor& targets,
                                                        double temperature) {
  check_logprob_operands(logits, targets, "target_logprobs");
  const float inv_t = inverse_temperature(temperature, "target_logprobs");
  c10::cuda::CUDAGuard guard(logits.device());
  const auto rows = logits.size(0);
  auto out = torch::empty({rows}, logits.options().dtype(torch::kFloat));
  auto lse = torch::empty({rows}, logits.options().dtype(torch::kFloat));
  check_launch(kernels::target_logprob_forward(kernel_dtype(logits), logits.data_ptr(), targets.data_ptr<std::int64_t>(),
                                               rows, logits.size(1), inv_t, out.data_ptr<float>(), lse.data_ptr<float>(),
                                               at::cuda::getCurrentCUDAStream()),
               "target_logprob_forward");
  return {out, lse};
}

torch::Tensor target_logprobs_backward(torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse,
                                       const torch::Tensor& grad, double temperature) {
  check_logprob_operands(logits, targets, "target_logprobs_backward");
  check_vector(lse, logits, logits.size(0), torch::kFloat, "lse", "target_logprobs_backward");
  check_vector(grad, logits, logits.size(0), torch::kFloat, "grad", "target_logprobs_backward");
  const float inv_t = inverse_temperature(temperature, "target_logprobs_backward");
  c10::cuda::CUDAGuard guard(logits.device());
  check_launch(kernels::target_logprob_backward(kernel_dtype(logits), logits.data_ptr(), targets.data_ptr<std::int64_t>(),
                                                lse.data_ptr<float>(), grad.data_ptr<float>(), logits.size(0),
                                                logits.size(1), inv_t, logits.data_ptr(),
                                                at::cuda::getCurrentCUDAStream()),
               "target_logprob_backward");
  return logits;
}

namespace {

// Tensors of one dtype and shape as `like`, contiguous, on its device.
void check_same(const torch::Tensor& t, const torch::Tensor& like, const char* name, const char* what) {
  check_cuda(t, like, name);
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.sizes() == like.sizes() && t.is_contiguous(), what, ": ", name,
              " must be a contiguous ", like.scalar_type(), " tensor of shape ", like.sizes(), ", got ", t.scalar_type(),
              " ", t.sizes());
}

} // namespace

bool rms_norm_backward_supported(std::int64_t dim) { return dim > 0 && dim <= kernels::rms_norm_backward_max_dim; }

std::pair<torch::Tensor, torch::Tensor> rms_norm_backward(const torch::Tensor& x, const torch::Tensor& weight,
                                                          const torch::Tensor& dy, double eps) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous() && rms_norm_backward_supported(x.size(1)),
              "rms_norm_backward: x must be a contiguous CUDA [rows, dim] tensor with dim at most ",
              kernels::rms_norm_backward_max_dim, ", got ", x.sizes());
  check_same(dy, x, "dy", "rms_norm_backward");
  check_cuda(weight, x, "weight");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.dim() == 1 && weight.size(0) == x.size(1)
                && weight.is_contiguous(),
              "rms_norm_backward: weight must be contiguous ", x.scalar_type(), " [", x.size(1), "], got ",
              weight.scalar_type(), " ", weight.sizes());
  c10::cuda::CUDAGuard guard(x.device());
  const auto rows = x.size(0), dim = x.size(1);
  auto dx = torch::empty_like(x);
  const std::int64_t blocks = std::max<std::int64_t>(1, std::min<std::int64_t>(rows, 2048));
  auto partial = torch::empty({blocks, dim}, x.options().dtype(torch::kFloat));
  check_launch(kernels::rms_norm_backward(kernel_dtype(x), x.data_ptr(), weight.data_ptr(), dy.data_ptr(), dx.data_ptr(),
                                          partial.data_ptr<float>(), rows, dim, static_cast<float>(eps), blocks,
                                          at::cuda::getCurrentCUDAStream()),
               "rms_norm_backward");
  return {dx, rows == 0 ? torch::zeros_like(weight) : partial.sum(0).to(weight.scalar_type())};
}

torch::Tensor rope_rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool backward) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 3 && x.is_contiguous() && x.size(2) % 2 == 0,
              "rope_rotate: x must be a contiguous CUDA [tokens, heads, head_dim] tensor with an even head_dim, got ",
              x.sizes());
  for (const auto* t : {&cos, &sin}) {
    check_cuda(*t, x, "cos and sin");
    TORCH_CHECK(t->scalar_type() == x.scalar_type() && t->dim() == 2 && t->size(0) == x.size(0)
                  && t->size(1) == x.size(2) && t->is_contiguous(),
                "rope_rotate: cos and sin must be contiguous ", x.scalar_type(), " [", x.size(0), ", ", x.size(2),
                "], got ", t->scalar_type(), " ", t->sizes());
  }
  c10::cuda::CUDAGuard guard(x.device());
  auto out = torch::empty_like(x);
  check_launch(kernels::rope_rotate(kernel_dtype(x), x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
                                    x.size(0), x.size(1), x.size(2), backward, at::cuda::getCurrentCUDAStream()),
               "rope_rotate");
  return out;
}

torch::Tensor silu_mul_pair(const torch::Tensor& gate, const torch::Tensor& up) {
  TORCH_CHECK(gate.is_cuda() && gate.is_contiguous(), "silu_mul_pair: gate must be a contiguous CUDA tensor");
  check_same(up, gate, "up", "silu_mul_pair");
  c10::cuda::CUDAGuard guard(gate.device());
  auto out = torch::empty_like(gate);
  check_launch(kernels::silu_mul_pair(kernel_dtype(gate), gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel(),
                                      at::cuda::getCurrentCUDAStream()),
               "silu_mul_pair");
  return out;
}

std::pair<torch::Tensor, torch::Tensor> silu_mul_pair_backward(const torch::Tensor& gate, const torch::Tensor& up,
                                                               const torch::Tensor& dy) {
  TORCH_CHECK(gate.is_cuda() && gate.is_contiguous(), "silu_mul_pair_backward: gate must be a contiguous CUDA tensor");
  check_same(up, gate, "up", "silu_mul_pair_backward");
  check_same(dy, gate, "dy", "silu_mul_pair_backward");
  c10::cuda::CUDAGuard guard(gate.device());
  auto dgate = torch::empty_like(gate), dup = torch::empty_like(up);
  check_launch(kernels::silu_mul_pair_backward(kernel_dtype(gate), gate.data_ptr(), up.data_ptr(), dy.data_ptr(),
                                               dgate.data_ptr(), dup.data_ptr(), gate.numel(),
                                               at::cuda::getCurrentCUDAStream()),
               "silu_mul_pair_backward");
  return {dgate, dup};
}

} // namespace crucible::policy::fused
