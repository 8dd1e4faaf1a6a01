// policy/model.cpp: the decoder's arithmetic, mirroring transformers' Llama/Qwen2 code op for op
// (float32 RMSNorm and RoPE tables, SDPA attention), and its HF checkpoint I/O.
#include "policy/model.hpp"

#include "core/file_io.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <set>

#include <ATen/CPUGeneratorImpl.h>

#ifdef CRUCIBLE_HAVE_CUDA
#  include "policy/fused.hpp"
#endif

namespace crucible::policy {

namespace fs = std::filesystem;

namespace {

std::string shape_text(c10::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  auto half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// q, k [B, heads, T, D]; cos, sin [B, T, D].
std::pair<torch::Tensor, torch::Tensor> apply_rope(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& cos, const torch::Tensor& sin) {
  auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  return {q * c + rotate_half(q) * s, k * c + rotate_half(k) * s};
}

torch::Tensor project(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b = {}) {
  return b.defined() ? at::linear(x, w, b) : at::linear(x, w);
}

// `parts` as one tensor along dim 0 when they lie back to back, in this order, in one storage
// (contiguous, one dtype and device, equal trailing sizes); undefined otherwise, or when any is
// undefined. A view: no copy, no kernel.
torch::Tensor joined_rows(const std::vector<torch::Tensor>& parts) {
  if (parts.empty() || !parts.front().defined() || (parts.front().dim() != 1 && parts.front().dim() != 2))
    return {};
  const auto& first = parts.front();
  std::int64_t rows = 0;
  const char* next = static_cast<const char*>(first.data_ptr());
  for (const auto& p : parts) {
    if (!p.defined() || !p.is_contiguous() || p.dim() != first.dim() || p.scalar_type() != first.scalar_type()
        || p.device() != first.device() || !p.storage().is_alias_of(first.storage())
        || (p.dim() == 2 && p.size(1) != first.size(1)) || static_cast<const char*>(p.data_ptr()) != next)
      return {};
    next += p.nbytes();
    rows += p.size(0);
  }
  if (first.dim() == 1)
    return first.as_strided({rows}, {1}, first.storage_offset());
  return first.as_strided({rows, first.size(1)}, {first.size(1), 1}, first.storage_offset());
}

// Makes the parameters `parts` views of one new tensor, back to back in this order, values kept,
// unless they already are or none is defined (absent biases).
void join_rows(std::initializer_list<torch::Tensor*> parts) {
  std::vector<torch::Tensor> values;
  for (auto* p : parts)
    if (p->defined())
      values.push_back(p->detach());
  if (values.empty())
    return;
  TORCH_CHECK(values.size() == parts.size(), "join_rows: some of the projections have a bias, some do not");
  if (joined_rows(values).defined())
    return;
  torch::NoGradGuard no_grad;
  auto all = torch::cat(values, 0);
  std::int64_t offset = 0;
  for (auto* p : parts) {
    const auto n = p->size(0);
    p->set_data(all.narrow(0, offset, n)); // the parameter keeps its identity (optimisers, names)
    offset += n;
  }
}

// Scaled dot-product attention of q [B, H, T, D] over k, v [B, KVH, S, D]. Without a mask it is
// causal (T == S), where SDPA's flash kernels take grouped-query attention natively. With a mask
// [B, 1, T, S] the query heads are folded onto their KV head ([B, KVH, G*T, D]): the masked
// kernels would otherwise copy the keys and values once per query head (math fallback), which
// for a decoding step means copying the whole cache.
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const torch::Tensor& mask) {
  const auto heads = q.size(1), kv_heads = k.size(1);
  if (!mask.defined())
    return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true, std::nullopt,
                                            /*enable_gqa=*/heads != kv_heads);
  if (heads == kv_heads)
    return at::scaled_dot_product_attention(q, k, v, mask);
  const auto b = q.size(0), t = q.size(2), d = q.size(3), group = heads / kv_heads;
  // Head h = kv * group + g (repeat_kv's order); row g * T + t of the fold sees mask row t.
  auto folded = q.reshape({b, kv_heads, group * t, d});
  auto out = at::scaled_dot_product_attention(folded, k, v, mask.repeat({1, 1, group, 1}));
  return out.reshape({b, heads, t, d}); // cuDNN on CUDA may return non-standard strides
}

// transformers' inverse frequencies for the static RoPE types, computed the way it does (float32
// torch ops on the CPU) so that the tables agree bit for bit where the operations allow.
std::pair<torch::Tensor, double> static_inv_freq(const model_config& c) {
  const auto& r = c.rope;
  const std::int64_t dim = c.head_dim;
  auto exponents = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(dim);
  auto inv = 1.0 / torch::pow(r.theta, exponents);
  switch (r.type) {
    case rope_type::standard:
    case rope_type::dynamic: // starts as standard; inv_freq() rescales per forward
      return {inv, 1.0};
    case rope_type::linear:
      return {inv / r.factor, 1.0};
    case rope_type::llama3: {
      const double old_len = static_cast<double>(r.original_max_position_embeddings);
      const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
      auto wavelen = 2 * std::numbers::pi / inv;
      auto llama = torch::where(wavelen > low_wavelen, inv / r.factor, inv);
      auto smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      auto smoothed = (1 - smooth) * llama / r.factor + smooth * llama;
      auto medium = (wavelen < high_wavelen).logical_not() * (wavelen > low_wavelen).logical_not();
      return {torch::where(medium, smoothed, llama), 1.0};
    }
    case rope_type::yarn: {
      auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
      double attention = 0.0;
      if (r.attention_factor)
        attention = *r.attention_factor;
      else if (r.mscale && r.mscale_all_dim && *r.mscale != 0.0 && *r.mscale_all_dim != 0.0)
        attention = get_mscale(r.factor, *r.mscale) / get_mscale(r.factor, *r.mscale_all_dim);
      else
        attention = get_mscale(r.factor, 1.0);
      const double omp = static_cast<double>(r.original_max_position_embeddings);
      auto correction_dim = [&](double rotations) {
        return (dim * std::log(omp / (rotations * 2 * std::numbers::pi))) / (2 * std::log(r.theta));
      };
      double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
      if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high)
        high += 0.001; // as transformers: avoid a zero-width ramp
      auto pos_freqs = torch::pow(r.theta, torch::arange(0, dim, 2).to(torch::kFloat) / static_cast<double>(dim));
      auto extrapolation = 1.0 / pos_freqs;
      auto interpolation = 1.0 / (r.factor * pos_freqs);
      auto ramp = ((torch::arange(dim / 2, torch::kFloat) - low) / (high - low)).clamp(0, 1);
      auto extrapolation_factor = 1 - ramp;
      return {interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor, attention};
    }
  }
  return {inv, 1.0};
}

torch::Tensor tensor_from_view(const tensor_view& v, torch::ScalarType dtype) {
  std::vector<std::int64_t> shape(v.shape.begin(), v.shape.end());
  const auto align = static_cast<std::uintptr_t>(dtype_size(v.dtype));
  if (reinterpret_cast<std::uintptr_t>(v.bytes.data()) % align == 0)
    return torch::from_blob(const_cast<std::byte*>(v.bytes.data()), shape, torch::TensorOptions().dtype(dtype));
  // The format does not promise aligned data; copy rather than hand kernels a misaligned pointer.
  auto t = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  std::memcpy(t.data_ptr(), v.bytes.data(), v.bytes.size());
  return t;
}

constexpr std::pair<st_dtype, torch::ScalarType> dtype_pairs[] = {
  {st_dtype::f64, torch::kDouble}, {st_dtype::f32, torch::kFloat},  {st_dtype::f16, torch::kHalf},
  {st_dtype::bf16, torch::kBFloat16}, {st_dtype::i64, torch::kLong}, {st_dtype::i32, torch::kInt},
  {st_dtype::i16, torch::kShort},  {st_dtype::i8, torch::kChar},     {st_dtype::u8, torch::kByte},
  {st_dtype::boolean, torch::kBool},
};

torch::ScalarType torch_type_of(st_dtype d) {
  for (const auto& [s, t] : dtype_pairs)
    if (s == d)
      return t;
  return torch::kFloat;
}

std::optional<st_dtype> st_dtype_of(torch::ScalarType t) {
  for (const auto& [s, tt] : dtype_pairs)
    if (tt == t)
      return s;
  return std::nullopt;
}

std::optional<torch::ScalarType> torch_float_type(st_dtype d) {
  auto t = torch_type_of(d);
  return torch::isFloatingType(t) ? std::optional{t} : std::nullopt;
}

// CPU, contiguous copies of `tensors` and safetensors views of them (alive while `host` is).
result<std::vector<tensor_view>> host_views(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                            std::optional<torch::ScalarType> dtype, std::vector<torch::Tensor>& host) {
  std::vector<tensor_view> views;
  host.reserve(host.size() + tensors.size());
  for (const auto& [name, t] : tensors) {
    host.push_back(t.detach().to(torch::kCPU, dtype.value_or(t.scalar_type())).contiguous());
    const auto& h = host.back();
    auto st = st_dtype_of(h.scalar_type());
    if (!st)
      return fail(errc::unsupported, "tensor ", name, ": dtype ", c10::toString(h.scalar_type()),
                  " has no safetensors equivalent here");
    views.push_back(tensor_view{name, *st, std::vector<std::int64_t>(h.sizes().begin(), h.sizes().end()),
                                std::span<const std::byte>(static_cast<const std::byte*>(h.data_ptr()), h.nbytes())});
  }
  return views;
}

bool is_lora_name(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

// log p(target) per row with logits recomputed chunk by chunk in the backward pass. With `fused`
// on CUDA, each chunk's log-softmax and its gradient are one kernel each over the logits in their
// own dtype (policy/kernels.cu), the gradient is written over the recomputed logits, and the
// weight gradient is a GEMM of the weights' dtype accumulating in float32; otherwise LibTorch ops
// on a float32 copy of the logits (the CPU path, and the reference the kernels are tested against).
struct target_log_probs_fn : torch::autograd::Function<target_log_probs_fn> {
  static torch::Tensor chunk_logits(const torch::Tensor& h, const torch::Tensor& w, double temperature) {
    auto logits = at::linear(h, w).to(torch::kFloat);
    return temperature == 1.0 ? logits : logits / temperature;
  }

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets, double temperature,
                               std::int64_t chunk, bool fused) {
    const auto n = hidden.size(0);
    auto opts = hidden.options().dtype(torch::kFloat);
    auto out = torch::empty({n}, opts);
    auto lse = torch::empty({n}, opts);
    auto safe = targets.clamp_min(0);
    for (std::int64_t s = 0; s < n; s += chunk) {
      const auto m = std::min(chunk, n - s);
#ifdef CRUCIBLE_HAVE_CUDA
      if (fused) {
        auto [o, l] = fused::target_logprobs(at::linear(hidden.narrow(0, s, m), weight), targets.narrow(0, s, m),
                                             temperature);
        out.narrow(0, s, m).copy_(o);
        lse.narrow(0, s, m).copy_(l);
        continue;
      }
#endif
      auto logits = chunk_logits(hidden.narrow(0, s, m), weight, temperature);
      auto l = torch::logsumexp(logits, -1);
      auto picked = logits.gather(1, safe.narrow(0, s, m).unsqueeze(1)).squeeze(1);
      out.narrow(0, s, m).copy_(picked - l);
      lse.narrow(0, s, m).copy_(l);
    }
    if (!fused)
      out.masked_fill_(targets < 0, 0.0);
    ctx->save_for_backward({hidden, weight, targets, lse});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["fused"] = fused;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& hidden = saved[0];
    const auto& weight = saved[1];
    const auto& targets = saved[2];
    const auto& lse = saved[3];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const std::int64_t chunk = ctx->saved_data["chunk"].toInt();
    const bool fused = ctx->saved_data["fused"].toBool();
    auto g = grads[0].to(torch::kFloat).masked_fill(targets < 0, 0.0).contiguous();
    auto safe = targets.clamp_min(0);
    const bool want_h = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    torch::Tensor grad_h, grad_w;
    if (want_h)
      grad_h = torch::empty_like(hidden);
    if (want_w)
      grad_w = torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat));
    const auto n = hidden.size(0);
    for (std::int64_t s = 0; s < n && (want_h || want_w); s += chunk) {
      const auto m = std::min(chunk, n - s);
      auto h = hidden.narrow(0, s, m);
#ifdef CRUCIBLE_HAVE_CUDA
      if (fused) {
        auto logits = at::linear(h, weight);
        auto gl = fused::target_logprobs_backward(logits, targets.narrow(0, s, m), lse.narrow(0, s, m),
                                                  g.narrow(0, s, m), temperature);
        if (want_h)
          grad_h.narrow(0, s, m).copy_(torch::mm(gl, weight));
        if (want_w) {
          if (gl.scalar_type() == torch::kFloat)
            grad_w.addmm_(gl.t(), h);
          else // bfloat16/float16 operands, float32 sums: the matrix units at full rate
            at::addmm_out(grad_w, grad_w, gl.t(), h, torch::kFloat);
        }
        continue;
      }
#endif
      auto gs = g.narrow(0, s, m).unsqueeze(1);
      // d(logit_t/T - lse)/d logit_j = (1[j = t] - p_j) / T
      auto p = torch::exp(chunk_logits(h, weight, temperature) - lse.narrow(0, s, m).unsqueeze(1));
      auto gl = (-p * gs).scatter_add_(1, safe.narrow(0, s, m).unsqueeze(1), gs);
      if (temperature != 1.0)
        gl = gl / temperature;
      if (want_h)
        grad_h.narrow(0, s, m).copy_(torch::matmul(gl.to(weight.scalar_type()), weight));
      if (want_w)
        grad_w.add_(torch::matmul(gl.t(), h.to(torch::kFloat)));
    }
    return {grad_h, want_w ? grad_w.to(weight.scalar_type()) : torch::Tensor{}, torch::Tensor{}, torch::Tensor{},
            torch::Tensor{}, torch::Tensor{}};
  }
};

#ifdef CRUCIBLE_HAVE_CUDA
// RMSNorm over the last dimension: add_rms_norm's kernel forward, rms_norm_backward's backward.
struct rms_norm_fn : torch::autograd::Function<rms_norm_fn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    auto rows = x.reshape({-1, x.size(-1)}).contiguous();
    auto y = fused::add_rms_norm(torch::Tensor{}, rows, weight, eps);
    ctx->save_for_backward({rows, weight});
    ctx->saved_data["eps"] = eps;
    return y.view(x.sizes());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto dy = grads[0].reshape({-1, saved[0].size(1)}).contiguous();
    auto [dx, dw] = fused::rms_norm_backward(saved[0], saved[1], dy, ctx->saved_data["eps"].toDouble());
    // A frozen weight (LoRA) gets no gradient.
    return {dx.view(grads[0].sizes()), ctx->needs_input_grad(1) ? dw : torch::Tensor{}, torch::Tensor{}};
  }
};

// RoPE of x [tokens, heads, head_dim] with cos, sin [tokens, head_dim]; the tables get no gradient.
struct rope_fn : torch::autograd::Function<rope_fn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return fused::rope_rotate(x, cos, sin, /*backward=*/false);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    return {fused::rope_rotate(grads[0].contiguous(), saved[0], saved[1], /*backward=*/true), torch::Tensor{},
            torch::Tensor{}};
  }
};

// silu(gate) * up; saves its two inputs (LibTorch's ops save silu(gate) as well).
struct silu_mul_fn : torch::autograd::Function<silu_mul_fn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up) {
    auto g = gate.contiguous(), u = up.contiguous();
    ctx->save_for_backward({g, u});
    return fused::silu_mul_pair(g, u);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto [dg, du] = fused::silu_mul_pair_backward(saved[0], saved[1], grads[0].contiguous());
    return {dg, du};
  }
};
#endif

} // namespace

bool fused_training_flag::use_fused(const torch::Tensor& x) const {
#ifdef CRUCIBLE_HAVE_CUDA
  return fused_training && x.is_cuda() && torch::GradMode::is_enabled() && fused::supported_dtype(x.scalar_type());
#else
  (void) x;
  return false;
#endif
}

// ---- modules ----------------------------------------------------------------------------------

RMSNormImpl::RMSNormImpl(std::int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
#ifdef CRUCIBLE_HAVE_CUDA
  if (use_fused(x) && x.scalar_type() == weight.scalar_type() && fused::rms_norm_backward_supported(x.size(-1)))
    return rms_norm_fn::apply(x, weight, eps_);
#endif
  auto h = x.to(torch::kFloat);
  auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps_);
  return weight * h.to(x.scalar_type());
}

ProjectionImpl::ProjectionImpl(std::int64_t in, std::int64_t out, bool with_bias) {
  weight = register_parameter("weight", torch::empty({out, in}));
  if (with_bias)
    bias = register_parameter("bias", torch::zeros({out}));
}

torch::Tensor ProjectionImpl::forward(const torch::Tensor& x) {
  auto y = project(x, weight, bias);
  if (lora_a_.defined())
    y = y + project(project(x, lora_a_), lora_b_) * lora_scale_;
  return y;
}

void ProjectionImpl::add_lora(std::int64_t rank, double scale, at::Generator& gen) {
  const auto in = weight.size(1), out = weight.size(0);
  // PEFT's default: A kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)); B zero, so
  // the adapted model starts equal to the base.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  auto a = torch::empty({rank, in}).uniform_(-bound, bound, gen).to(weight.options());
  auto holder_a = register_module("lora_A", std::make_shared<torch::nn::Module>());
  auto holder_b = register_module("lora_B", std::make_shared<torch::nn::Module>());
  lora_a_ = holder_a->register_parameter("weight", a);
  lora_b_ = holder_b->register_parameter("weight", torch::zeros({out, rank}, weight.options()));
  lora_scale_ = scale;
}

torch::Tensor ProjectionImpl::merged_weight() const {
  torch::NoGradGuard no_grad;
  if (!lora_a_.defined())
    return weight;
  auto delta = torch::matmul(lora_b_.to(torch::kFloat), lora_a_.to(torch::kFloat)) * lora_scale_;
  return (weight.to(torch::kFloat) + delta).to(weight.scalar_type());
}

void ProjectionImpl::merge_lora() {
  if (!lora_a_.defined())
    return;
  {
    torch::NoGradGuard no_grad;
    weight.copy_(merged_weight());
  }
  unregister_module("lora_A");
  unregister_module("lora_B");
  lora_a_ = lora_b_ = torch::Tensor{};
  lora_scale_ = 0.0;
}

AttentionImpl::AttentionImpl(const model_config& c)
    : heads_(c.num_heads), kv_heads_(c.num_kv_heads), head_dim_(c.head_dim) {
  q_proj = register_module("q_proj", Projection(c.hidden_size, heads_ * head_dim_, c.qkv_bias));
  k_proj = register_module("k_proj", Projection(c.hidden_size, kv_heads_ * head_dim_, c.qkv_bias));
  v_proj = register_module("v_proj", Projection(c.hidden_size, kv_heads_ * head_dim_, c.qkv_bias));
  o_proj = register_module("o_proj", Projection(heads_ * head_dim_, c.hidden_size, c.o_bias));
  join_projections();
}

void AttentionImpl::join_projections() {
  join_rows({&q_proj->weight, &k_proj->weight, &v_proj->weight});
  join_rows({&q_proj->bias, &k_proj->bias, &v_proj->bias});
}

// Module::to gives every parameter its own new tensor when it moves (and keeps it when it does
// not): join the projections again afterwards.
void AttentionImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  join_projections();
}

void AttentionImpl::to(torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(dtype, non_blocking);
  join_projections();
}

void AttentionImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  join_projections();
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                     const torch::Tensor& mask) {
  torch::Tensor none;
  return forward_cached(x, cos, sin, mask, none, none, none);
}

torch::Tensor AttentionImpl::forward_cached(const torch::Tensor& x, const torch::Tensor& cos,
                                            const torch::Tensor& sin, const torch::Tensor& mask,
                                            torch::Tensor& k_cache, torch::Tensor& v_cache,
                                            const torch::Tensor& slots) {
  const auto b = x.size(0), t = x.size(1);
#ifdef CRUCIBLE_HAVE_CUDA
  if (!k_cache.defined() && use_fused(x) && cos.scalar_type() == x.scalar_type()) {
    // The training forward: RoPE as one kernel each way over the projections' own layout.
    auto c = cos.expand({b, t, head_dim_}).contiguous().view({b * t, head_dim_});
    auto s = sin.expand({b, t, head_dim_}).contiguous().view({b * t, head_dim_});
    auto rotated = [&](const torch::Tensor& y, std::int64_t heads) {
      return rope_fn::apply(y.reshape({b * t, heads, head_dim_}).contiguous(), c, s)
        .view({b, t, heads, head_dim_})
        .transpose(1, 2);
    };
    auto q = rotated(q_proj(x), heads_), k = rotated(k_proj(x), kv_heads_);
    auto v = v_proj(x).reshape({b, t, kv_heads_, head_dim_}).transpose(1, 2);
    return o_proj(attend(q, k, v, mask).transpose(1, 2).reshape({b, t, heads_ * head_dim_}));
  }
#endif
  // reshape, not view: under graph capture some of these arrive with strides that view refuses
  // ("view size is not compatible", seen on an H200); reshape copies only then.
  auto q = q_proj(x).reshape({b, t, heads_, head_dim_}).transpose(1, 2);
  auto k = k_proj(x).reshape({b, t, kv_heads_, head_dim_}).transpose(1, 2);
  auto v = v_proj(x).reshape({b, t, kv_heads_, head_dim_}).transpose(1, 2);
  std::tie(q, k) = apply_rope(q, k, cos, sin);
  if (k_cache.defined() && mask.defined()) {
    auto index = slots.reshape({b, 1, t, 1}).expand({b, kv_heads_, t, head_dim_});
    k_cache.scatter_(2, index, k);
    v_cache.scatter_(2, index, v);
    k = k_cache;
    v = v_cache;
  } else if (k_cache.defined()) { // prefill of an empty cache: causal over this step alone
    k_cache.narrow(2, 0, t).copy_(k);
    v_cache.narrow(2, 0, t).copy_(v);
  }
  return o_proj(attend(q, k, v, mask).transpose(1, 2).reshape({b, t, heads_ * head_dim_}));
}

MLPImpl::MLPImpl(const model_config& c) {
  gate_proj = register_module("gate_proj", Projection(c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj", Projection(c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module("down_proj", Projection(c.intermediate_size, c.hidden_size, c.mlp_bias));
  join_projections();
}

void MLPImpl::join_projections() {
  join_rows({&gate_proj->weight, &up_proj->weight});
  join_rows({&gate_proj->bias, &up_proj->bias});
}

void MLPImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  join_projections();
}

void MLPImpl::to(torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(dtype, non_blocking);
  join_projections();
}

void MLPImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  join_projections();
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
#ifdef CRUCIBLE_HAVE_CUDA
  if (use_fused(x))
    return down_proj(silu_mul_fn::apply(gate_proj(x), up_proj(x)));
#endif
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

DecoderLayerImpl::DecoderLayerImpl(const model_config& c) {
  self_attn = register_module("self_attn", Attention(c));
  mlp = register_module("mlp", MLP(c));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                        const torch::Tensor& mask) {
  auto h = x + self_attn->forward(input_layernorm(x), cos, sin, mask);
  return h + mlp(post_attention_layernorm(h));
}

torch::Tensor DecoderLayerImpl::forward_cached(const torch::Tensor& x, const torch::Tensor& cos,
                                               const torch::Tensor& sin, const torch::Tensor& mask,
                                               torch::Tensor& k_cache, torch::Tensor& v_cache,
                                               const torch::Tensor& slots) {
  auto h = x + self_attn->forward_cached(input_layernorm(x), cos, sin, mask, k_cache, v_cache, slots);
  return h + mlp(post_attention_layernorm(h));
}

TokenEmbeddingImpl::TokenEmbeddingImpl(std::int64_t vocab, std::int64_t dim) {
  weight = register_parameter("weight", torch::empty({vocab, dim}));
}

torch::Tensor TokenEmbeddingImpl::forward(const torch::Tensor& ids) { return at::embedding(weight, ids); }

DecoderImpl::DecoderImpl(const model_config& c) {
  embed_tokens = register_module("embed_tokens", TokenEmbedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    blocks.push_back(DecoderLayer(c));
    layers->push_back(blocks.back());
  }
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

// ---- the causal LM ----------------------------------------------------------------------------

kv_cache kv_cache::view(std::int64_t n_rows, std::int64_t n_slots) const {
  kv_cache v;
  for (std::size_t l = 0; l < keys.size(); ++l) {
    v.keys.push_back(keys[l].narrow(0, 0, n_rows).narrow(2, 0, n_slots));
    v.values.push_back(values[l].narrow(0, 0, n_rows).narrow(2, 0, n_slots));
  }
  v.lengths = lengths.narrow(0, 0, n_rows);
  return v;
}

void kv_cache::compact(const torch::Tensor& index, std::int64_t used_slots) {
  torch::NoGradGuard no_grad;
  const auto n = index.size(0);
  auto idx = index.to(lengths.device());
  for (auto* part : {&keys, &values})
    for (auto& t : *part) {
      auto used = t.narrow(2, 0, used_slots);
      auto moved = used.index_select(0, idx); // a copy first: source and destination rows overlap
      used.narrow(0, 0, n).copy_(moved);
    }
  auto moved = lengths.index_select(0, idx);
  lengths.narrow(0, 0, n).copy_(moved);
}

CausalLMImpl::CausalLMImpl(model_config config) : config_(std::move(config)) {
  model = register_module("model", Decoder(config_));
  if (!config_.tie_word_embeddings)
    lm_head = register_module("lm_head", Projection(config_.hidden_size, config_.vocab_size, false));
}

void CausalLMImpl::init_weights(std::uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& item : named_parameters(/*recurse=*/true)) {
    const auto& name = item.key();
    auto& p = item.value();
    if (is_lora_name(name))
      continue;
    const bool is_norm = name.size() >= 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_norm)
      p.fill_(1.0);
    else if (is_bias)
      p.zero_();
    else // drawn on the CPU so a seed gives the same model on every device
      p.copy_(torch::empty(p.sizes(), torch::kFloat).normal_(0.0, 0.02, gen));
  }
}

torch::Tensor CausalLMImpl::inv_freq(const torch::Tensor& positions, const torch::Tensor& seq_len) {
  if (!inv_freq_.defined() || inv_freq_.device() != positions.device()) {
    auto [inv, scaling] = static_inv_freq(config_);
    inv_freq_ = inv.to(positions.device());
    attention_scaling_ = scaling;
  }
  if (config_.rope.type != rope_type::dynamic)
    return inv_freq_;
  // Dynamic NTK with transformers' formula, but per row: transformers takes the longest position
  // of the whole batch, which makes a sequence's logits depend on its batch-mates (and a
  // learner's log-probs differ from the sampler's). Per row, each sequence gets what it gets
  // alone. Computed on the device: no host synchronisation, so decoding stays graph-capturable.
  // Up to max_position_embeddings this is the standard table.
  const auto& r = config_.rope;
  const double dim = static_cast<double>(config_.head_dim);
  const auto max_pos = static_cast<double>(config_.max_position_embeddings);
  auto len = seq_len.to(torch::kFloat).clamp_min(max_pos).unsqueeze(1); // [B, 1]
  auto base = r.theta * torch::pow(r.factor * len / max_pos - (r.factor - 1), dim / (dim - 2));
  auto exponents =
      torch::arange(0, config_.head_dim, 2, positions.options().dtype(torch::kLong)).to(torch::kFloat) / dim;
  return 1.0 / torch::pow(base, exponents);
}

std::pair<torch::Tensor, torch::Tensor> CausalLMImpl::rope(const torch::Tensor& positions, const torch::Tensor& seq_len,
                                                           torch::ScalarType dtype) {
  auto inv = inv_freq(positions, seq_len);
  if (inv.dim() == 2)
    inv = inv.unsqueeze(1); // [B, 1, D/2] against positions [B, T, 1]
  auto freqs = positions.unsqueeze(-1).to(torch::kFloat) * inv;
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = emb.cos() * attention_scaling_, sin = emb.sin() * attention_scaling_;
  return {cos.to(dtype), sin.to(dtype)};
}

void CausalLMImpl::set_fused_training(bool on) {
  fused_training_ = on;
  for (auto& m : modules(/*include_self=*/false))
    if (auto* f = dynamic_cast<fused_training_flag*>(m.get()))
      f->fused_training = on;
}

torch::Tensor CausalLMImpl::output_weight() {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

torch::Tensor CausalLMImpl::logits_from_hidden(const torch::Tensor& hidden) {
  return lm_head ? lm_head(hidden) : at::linear(hidden, model->embed_tokens->weight);
}

torch::Tensor CausalLMImpl::hidden_states(const token_batch& batch) {
  const auto& ids = batch.input_ids;
  TORCH_CHECK(ids.dim() == 2, "token_batch.input_ids must be [batch, time], got ", ids.sizes());
  const auto b = ids.size(0), t = ids.size(1);
  const auto dev = ids.device();
  auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(dev);
  torch::Tensor valid = batch.attention_mask.defined() ? batch.attention_mask.to(torch::kBool) : torch::Tensor{};
  torch::Tensor right_padding_valid;
  const torch::Tensor& seq = batch.sequence_ids;

  // Right padding needs no mask: under causal attention real tokens never see the padding that
  // follows them, and positions are plain. Dropping the mask keeps the flash kernel (memory
  // linear in T) for the learner's usual batches; padding rows compute values nobody reads.
  if (valid.defined() && !seq.defined() && !batch.position_ids.defined() && t > 1 &&
      !(valid.narrow(1, 1, t - 1) & valid.narrow(1, 0, t - 1).logical_not()).any().item<bool>()) {
    right_padding_valid = valid;
    valid = torch::Tensor{};
  }
  torch::Tensor positions = batch.position_ids;
  if (!positions.defined()) {
    if (!valid.defined() && !seq.defined()) {
      positions = torch::arange(t, long_opts).unsqueeze(0).expand({b, t});
    } else {
      // Count real tokens, restarting at each packed sequence: position = count - 1.
      auto v = valid.defined() ? valid.to(torch::kLong) : torch::ones({b, t}, long_opts);
      auto count = v.cumsum(1);
      if (seq.defined()) {
        auto starts = torch::ones({b, t}, long_opts.dtype(torch::kBool));
        if (t > 1)
          starts.narrow(1, 1, t - 1).copy_(seq.narrow(1, 1, t - 1) != seq.narrow(1, 0, t - 1));
        auto before = count - v; // real tokens before this one; non-decreasing along the row
        auto base = std::get<0>(torch::where(starts, before, torch::zeros_like(before)).cummax(1));
        count = count - base;
      }
      positions = (count - 1).clamp_min(0);
    }
  }

  torch::Tensor mask;
  if (valid.defined() || seq.defined()) {
    auto idx = torch::arange(t, long_opts);
    auto allowed = (idx.unsqueeze(0) <= idx.unsqueeze(1)).unsqueeze(0); // [1, T(query), T(key)]
    if (valid.defined())
      allowed = allowed & valid.unsqueeze(1);
    if (seq.defined())
      allowed = allowed & (seq.unsqueeze(2) == seq.unsqueeze(1));
    // Every query may see itself: a padding row with nothing to attend to would turn into NaN.
    allowed = allowed | torch::eye(t, long_opts.dtype(torch::kBool)).unsqueeze(0);
    mask = allowed.unsqueeze(1);
  }

  torch::Tensor seq_len; // each row's longest real position + 1 (dynamic RoPE only)
  if (config_.rope.type == rope_type::dynamic) {
    const auto& real = valid.defined() ? valid : right_padding_valid;
    seq_len = std::get<0>((real.defined() ? positions.masked_fill(real.logical_not(), 0) : positions).max(1)) + 1;
  }
  auto x = model->embed_tokens(ids);
  auto [cos, sin] = rope(positions, seq_len, x.scalar_type());
  for (auto& layer : model->blocks)
    x = layer->forward(x, cos, sin, mask);
  return model->norm(x);
}

torch::Tensor CausalLMImpl::forward(const token_batch& batch) { return logits_from_hidden(hidden_states(batch)); }

torch::Tensor CausalLMImpl::token_log_probs(const token_batch& batch, const torch::Tensor& targets, double temperature,
                                            std::int64_t chunk_tokens) {
  TORCH_CHECK(temperature > 0, "token_log_probs: temperature must be positive");
  TORCH_CHECK(targets.sizes() == batch.input_ids.sizes(), "token_log_probs: targets ", targets.sizes(),
              " do not match input_ids ", batch.input_ids.sizes());
  auto h = hidden_states(batch);
  auto flat = h.reshape({-1, h.size(-1)});
  auto out = chunked_target_log_probs(flat, output_weight(), targets.reshape({-1}).to(torch::kLong), temperature,
                                      chunk_tokens, fused_training_);
  return out.view(targets.sizes());
}

torch::Tensor chunked_target_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                       const torch::Tensor& targets, double temperature, std::int64_t chunk,
                                       bool fused) {
  TORCH_CHECK(chunk > 0, "chunked_target_log_probs: chunk must be positive");
  fused = fused && hidden.is_cuda() && weight.is_cuda();
#ifdef CRUCIBLE_HAVE_CUDA
  fused = fused && fused::supported_dtype(weight.scalar_type()) && hidden.scalar_type() == weight.scalar_type();
#else
  fused = false;
#endif
  const auto t = targets.contiguous();
  // Only rows with a target need the output projection (a GRPO batch's prompt rows have none):
  // the others are left out of both GEMMs and the log-softmax. Finding them costs one device sync.
  auto keep = (t >= 0).nonzero().squeeze(1);
  if (keep.size(0) == t.size(0))
    return target_log_probs_fn::apply(hidden, weight, t, temperature, chunk, fused);
  auto picked = target_log_probs_fn::apply(hidden.index_select(0, keep), weight, t.index_select(0, keep),
                                           temperature, chunk, fused);
  return torch::zeros({t.size(0)}, picked.options()).index_copy(0, keep, picked);
}

kv_cache CausalLMImpl::make_cache(std::int64_t rows, std::int64_t slots) {
  const auto& w = model->embed_tokens->weight;
  kv_cache c;
  // Zeros, not empty: masked slots still meet the attention weights (0 * NaN would be NaN).
  for (std::int64_t l = 0; l < config_.num_layers; ++l) {
    c.keys.push_back(torch::zeros({rows, config_.num_kv_heads, slots, config_.head_dim}, w.options()));
    c.values.push_back(torch::zeros({rows, config_.num_kv_heads, slots, config_.head_dim}, w.options()));
  }
  c.lengths = torch::zeros({rows}, w.options().dtype(torch::kLong));
  return c;
}

namespace {

// One layer's projections as the fused step runs them (views of the parameters).
struct fused_layer {
  torch::Tensor qkv_weight, qkv_bias, gate_up_weight, gate_up_bias;
  bool aligned = false; // every matrix and norm weight at a 16-byte address (the small-batch kernels' loads)
};

// The joined projections of every layer, or nothing when the fused step cannot run `m`.
std::optional<std::vector<fused_layer>> fused_layers(const CausalLMImpl& m) {
#ifdef CRUCIBLE_HAVE_CUDA
  const auto& c = m.config();
  const auto& embed = m.model->embed_tokens->weight;
  if (!embed.is_cuda() || !fused::supported_dtype(embed.scalar_type())
      || !fused::supported_attention(c.num_heads, c.num_kv_heads, c.head_dim) || m.has_lora())
    return std::nullopt;
  // The kernels and GEMMs take one dtype and device throughout.
  auto alike = [&](const torch::Tensor& t) {
    return !t.defined() || (t.scalar_type() == embed.scalar_type() && t.device() == embed.device());
  };
  if (!alike(m.model->norm->weight) || (m.lm_head && !alike(m.lm_head->weight)))
    return std::nullopt;
  std::vector<fused_layer> out;
  out.reserve(m.model->blocks.size());
  for (const auto& layer : m.model->blocks) {
    const auto& attn = *layer->self_attn;
    const auto& mlp = *layer->mlp;
    fused_layer f;
    f.qkv_weight = joined_rows({attn.q_proj->weight, attn.k_proj->weight, attn.v_proj->weight});
    f.gate_up_weight = joined_rows({mlp.gate_proj->weight, mlp.up_proj->weight});
    if (!f.qkv_weight.defined() || !f.gate_up_weight.defined())
      return std::nullopt;
    if (attn.q_proj->bias.defined()) {
      f.qkv_bias = joined_rows({attn.q_proj->bias, attn.k_proj->bias, attn.v_proj->bias});
      if (!f.qkv_bias.defined())
        return std::nullopt;
    }
    if (mlp.gate_proj->bias.defined()) {
      f.gate_up_bias = joined_rows({mlp.gate_proj->bias, mlp.up_proj->bias});
      if (!f.gate_up_bias.defined())
        return std::nullopt;
    }
    const torch::Tensor* used[] = {&f.qkv_weight, &f.qkv_bias, &f.gate_up_weight, &f.gate_up_bias,
                                   &attn.o_proj->weight, &attn.o_proj->bias, &mlp.down_proj->weight,
                                   &mlp.down_proj->bias, &layer->input_layernorm->weight,
                                   &layer->post_attention_layernorm->weight};
    for (const auto* t : used)
      if (!alike(*t))
        return std::nullopt;
    f.aligned = true;
    const torch::Tensor* loaded[] = {&f.qkv_weight, &f.gate_up_weight, &attn.o_proj->weight, &mlp.down_proj->weight,
                                     &layer->input_layernorm->weight, &layer->post_attention_layernorm->weight};
    for (const auto* t : loaded)
      f.aligned = f.aligned && reinterpret_cast<std::uintptr_t>(t->data_ptr()) % 16 == 0;
    out.push_back(std::move(f));
  }
  return out;
#else
  (void) m;
  return std::nullopt;
#endif
}

} // namespace

bool CausalLMImpl::fused_decode_ready() const { return fused_layers(*this).has_value(); }

torch::Tensor CausalLMImpl::forward_step(const torch::Tensor& input_ids, kv_cache& cache,
                                         const torch::Tensor& new_tokens, bool fused, bool small_batch) {
  if (fused && input_ids.dim() == 2 && input_ids.size(1) == 1 && !new_tokens.defined() && input_ids.is_cuda())
    if (auto logits = fused_step(input_ids, cache, small_batch); logits.defined())
      return logits;
  return step(input_ids, cache, new_tokens, /*empty=*/false);
}

// The LibTorch decoding step of one token per row (step() with T = 1), kernel for kernel:
//   h = x + delta; n = norm(h)          -> fused::add_rms_norm (the first layer's has no delta)
//   q, k, v = q_proj(n), k_proj(n), ...  -> one GEMM over the joined weights [q; k; v]
//   + bias; RoPE(q, k); cache.scatter_   -> fused::rope_write_kv (the bias added there: one kernel fewer)
//   SDPA(q, cache, mask)                 -> fused::decode_attention (split-K or wide, GQA)
//   silu(gate(n)) * up(n)                -> one GEMM over [gate; up], fused::silu_mul
// The o and down projections and the output matrix stay LibTorch GEMMs. At most 4 rows
// (`small_batch`), each projection is one kernel with its neighbours (fused::small_batch_supported):
//   norm, q/k/v + bias, RoPE, cache write -> fused::norm_qkv_rope
//   SDPA, o_proj(attn), h = h + that       -> fused::attention_project_add (the residual updated in
//                                            place; at one row the attention's splits merged by the o
//                                            projection as it stages them, else decode_attention, project_add)
//   norm, gate/up, silu(gate) * up        -> fused::norm_gate_up_silu
//   down_proj(act), h = h + that          -> fused::project_add
// so a layer is five kernels, with the attention's combine where it splits (not at batch 1). At
// one row, with kernels::set_decode_layers on, all the layers are one persistent kernel instead
// (fused::decode_layers, the same stages with the same rounding points; off by default, slower).
void CausalLMImpl::forward_step_greedy(const torch::Tensor& input_ids, kv_cache& cache, const greedy_sink& sink,
                                       bool fused, bool small_batch) {
#ifdef CRUCIBLE_HAVE_CUDA
  torch::NoGradGuard no_grad;
  torch::Tensor logits;
  if (fused && input_ids.dim() == 2 && input_ids.size(1) == 1 && input_ids.is_cuda()) {
    bool sampled = false;
    logits = fused_step(input_ids, cache, small_batch, &sink, &sampled);
    if (sampled)
      return;
  }
  if (!logits.defined())
    logits = step(input_ids, cache, {}, /*empty=*/false);
  fused::greedy_record(logits.contiguous(), sink.next, sink.history, sink.counters);
#else
  (void) input_ids, (void) cache, (void) sink, (void) fused, (void) small_batch;
  throw std::logic_error("forward_step_greedy: this build has no CUDA");
#endif
}

torch::Tensor CausalLMImpl::fused_step(const torch::Tensor& input_ids, kv_cache& cache, bool small_batch,
                                       const greedy_sink* sink, bool* sampled) {
#ifdef CRUCIBLE_HAVE_CUDA
  auto layers = fused_layers(*this);
  if (!layers)
    return {};
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.size(1) == 1 && input_ids.size(0) == cache.rows(),
              "forward_step (fused): input_ids ", input_ids.sizes(), " are not one token per row of a cache of ",
              cache.rows(), " rows");
  torch::NoGradGuard no_grad;
  const auto& c = config_;
  const auto r = input_ids.size(0);
  torch::Tensor seq_len; // dynamic RoPE only: each row's length once this token is in
  if (c.rope.type == rope_type::dynamic)
    seq_len = cache.lengths + 1;
  auto inv = inv_freq(cache.lengths.unsqueeze(1), seq_len).contiguous(); // [D/2], or [R, D/2] (dynamic)
  auto residual = model->embed_tokens(input_ids).reshape({r, c.hidden_size}).contiguous();
  torch::Tensor delta; // what the next norm adds to the residual stream first
  small_batch = small_batch
                && fused::small_batch_supported(residual.scalar_type(), r, std::max(c.hidden_size, c.intermediate_size))
                && std::all_of(layers->begin(), layers->end(), [](const fused_layer& f) { return f.aligned; });
  // One row: every layer in one persistent kernel where it runs and is switched on (fused::decode_layers).
  fused::decode_shape shape;
  shape.hidden = c.hidden_size, shape.inter = c.intermediate_size, shape.heads = c.num_heads;
  shape.kv_heads = c.num_kv_heads, shape.head_dim = c.head_dim, shape.eps = c.rms_norm_eps;
  shape.attention_scaling = attention_scaling_;
  const bool one_kernel =
    small_batch && r == 1
    && fused::decode_layers_ready(residual.scalar_type(), static_cast<std::int64_t>(model->blocks.size()), shape);
  if (one_kernel) {
    std::vector<fused::decode_layer> all;
    all.reserve(model->blocks.size());
    for (std::size_t l = 0; l < model->blocks.size(); ++l) {
      const auto& layer = model->blocks[l];
      const auto& w = (*layers)[l];
      all.push_back({w.qkv_weight, w.qkv_bias, layer->self_attn->o_proj->weight, layer->self_attn->o_proj->bias,
                     w.gate_up_weight, w.gate_up_bias, layer->mlp->down_proj->weight, layer->mlp->down_proj->bias,
                     layer->input_layernorm->weight, layer->post_attention_layernorm->weight, cache.keys[l],
                     cache.values[l]});
    }
    fused::decode_layers(residual, all, shape, inv, cache.lengths);
  }
  for (std::size_t l = 0; l < model->blocks.size() && !one_kernel; ++l) {
    auto& layer = model->blocks[l];
    const auto& w = (*layers)[l];
    if (small_batch) {
      // Early reads: each kernel reads before its wait what no kernel that may still run writes
      // (the lengths, inv_freq, the cache below the new slot; the residual two kernels on only
      // where each kernel launches the next after its wait: kernels::small_gemm_args).
      auto q = fused::norm_qkv_rope(residual, layer->input_layernorm->weight, c.rms_norm_eps, w.qkv_weight, w.qkv_bias,
                                    inv, attention_scaling_, cache.lengths, cache.keys[l], cache.values[l],
                                    c.num_heads, c.num_kv_heads, c.head_dim, /*early_reads=*/true);
      fused::attention_project_add(q, cache.keys[l], cache.values[l], cache.lengths, layer->self_attn->o_proj->weight,
                                   layer->self_attn->o_proj->bias, residual, /*early_reads=*/true);
      auto act = fused::norm_gate_up_silu(residual, layer->post_attention_layernorm->weight, c.rms_norm_eps,
                                          w.gate_up_weight, w.gate_up_bias);
      fused::project_add(act, layer->mlp->down_proj->weight, layer->mlp->down_proj->bias, residual,
                         /*early_reads=*/true);
      continue;
    }
    auto h = fused::add_rms_norm(delta, residual, layer->input_layernorm->weight, c.rms_norm_eps);
    auto q = fused::rope_write_kv(project(h, w.qkv_weight), w.qkv_bias, inv, attention_scaling_, cache.lengths,
                                  cache.keys[l], cache.values[l], c.num_heads, c.num_kv_heads, c.head_dim);
    auto attn = fused::decode_attention(q, cache.keys[l], cache.values[l], cache.lengths, 0, /*early_reads=*/true);
    delta = project(attn, layer->self_attn->o_proj->weight, layer->self_attn->o_proj->bias);
    h = fused::add_rms_norm(delta, residual, layer->post_attention_layernorm->weight, c.rms_norm_eps);
    auto gate_up = project(h, w.gate_up_weight, w.gate_up_bias);
    delta = project(fused::silu_mul(gate_up), layer->mlp->down_proj->weight, layer->mlp->down_proj->bias);
  }
  if (sink != nullptr && small_batch && r == 1) {
    auto weight = output_weight();
    const bool aligned = reinterpret_cast<std::uintptr_t>(weight.data_ptr()) % 16 == 0
                         && reinterpret_cast<std::uintptr_t>(model->norm->weight.data_ptr()) % 16 == 0;
    if (aligned && weight.is_contiguous() && fused::greedy_head_ready(residual.scalar_type(), c.hidden_size, c.vocab_size)) {
      fused::greedy_head(residual, model->norm->weight, c.rms_norm_eps, weight, cache.lengths, sink->next,
                         sink->history, sink->counters);
      if (sampled != nullptr)
        *sampled = true;
      return {};
    }
  }
  auto last = fused::add_rms_norm(delta, residual, model->norm->weight, c.rms_norm_eps);
  cache.lengths.add_(1);
  return logits_from_hidden(last);
#else
  (void) input_ids, (void) cache, (void) small_batch, (void) sink, (void) sampled;
  return {};
#endif
}

torch::Tensor CausalLMImpl::prefill(const torch::Tensor& input_ids, kv_cache& cache, const torch::Tensor& new_tokens) {
  return step(input_ids, cache, new_tokens, /*empty=*/true);
}

torch::Tensor CausalLMImpl::step(const torch::Tensor& input_ids, kv_cache& cache, const torch::Tensor& new_tokens,
                                 bool empty) {
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.size(0) == cache.rows(), "forward_step: input_ids ",
              input_ids.sizes(), " do not match a cache of ", cache.rows(), " rows");
  const auto r = input_ids.size(0), t = input_ids.size(1), s = cache.slots();
  if (input_ids.device().is_cpu()) { // free on the CPU; on CUDA they would synchronise (and break capture)
    TORCH_CHECK((cache.lengths + t).le(s).all().item<bool>(), "forward_step: ", t,
                " new tokens overflow a row of the cache (", s, " slots)");
    TORCH_CHECK(!empty || cache.lengths.eq(0).all().item<bool>(), "prefill: the cache is not empty");
  }
  auto positions = cache.lengths.unsqueeze(1) + torch::arange(t, cache.lengths.options()); // [R, T]
  // A prefill of right-padded prompts into an empty cache is plain causal attention (no mask);
  // later steps attend over the cache: slot j is visible to a token at position p iff j <= p.
  torch::Tensor mask;
  if (!empty)
    mask = torch::arange(s, cache.lengths.options()).view({1, 1, 1, s}) <= positions.view({r, 1, t, 1});
  // Each row's length once this step's real tokens are in (dynamic RoPE only).
  torch::Tensor seq_len;
  if (config_.rope.type == rope_type::dynamic)
    seq_len = cache.lengths + (new_tokens.defined() ? new_tokens.to(torch::kLong) : torch::full_like(cache.lengths, t));
  auto x = model->embed_tokens(input_ids);
  auto [cos, sin] = rope(positions, seq_len, x.scalar_type());
  for (std::size_t l = 0; l < model->blocks.size(); ++l)
    x = model->blocks[l]->forward_cached(x, cos, sin, mask, cache.keys[l], cache.values[l], positions);
  x = model->norm(x);
  torch::Tensor last;
  if (new_tokens.defined()) {
    auto index = (new_tokens.to(torch::kLong) - 1).view({r, 1, 1}).expand({r, 1, x.size(2)});
    last = x.gather(1, index).squeeze(1);
    cache.lengths.add_(new_tokens.to(torch::kLong));
  } else {
    last = x.select(1, t - 1);
    cache.lengths.add_(t);
  }
  return logits_from_hidden(last);
}

result<void> CausalLMImpl::add_lora(const lora_options& options) {
  static const std::set<std::string> known{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  if (has_lora())
    return fail(errc::invalid_arg, "LoRA adapters were already added");
  if (options.rank <= 0)
    return fail(errc::config, "lora.rank: must be positive, got ", std::to_string(options.rank));
  if (options.targets.empty())
    return fail(errc::config, "lora.targets: empty");
  for (const auto& target : options.targets)
    if (known.count(target) == 0)
      return fail(errc::config, "lora.targets: '", target,
                  "' is not a projection (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  const double scale = options.rslora ? options.alpha / std::sqrt(static_cast<double>(options.rank))
                                      : options.alpha / static_cast<double>(options.rank);
  for (auto& p : parameters())
    p.set_requires_grad(false);
  auto gen = at::detail::createCPUGenerator(options.seed);
  torch::NoGradGuard no_grad; // the adapters' initial values are not part of any graph
  for (auto& layer : model->blocks) {
    auto& attn = layer->self_attn;
    auto& mlp = layer->mlp;
    const std::pair<const char*, Projection*> projections[] = {
      {"q_proj", &attn->q_proj},     {"k_proj", &attn->k_proj}, {"v_proj", &attn->v_proj},
      {"o_proj", &attn->o_proj},     {"gate_proj", &mlp->gate_proj}, {"up_proj", &mlp->up_proj},
      {"down_proj", &mlp->down_proj},
    };
    for (const auto& [name, proj] : projections)
      if (std::find(options.targets.begin(), options.targets.end(), name) != options.targets.end())
        (*proj)->add_lora(options.rank, scale, gen);
  }
  for (auto& item : named_parameters(true))
    if (is_lora_name(item.key()))
      item.value().set_requires_grad(true);
  return {};
}

void CausalLMImpl::merge_lora() {
  for (auto& m : modules(/*include_self=*/false))
    if (auto* proj = m->as<ProjectionImpl>())
      proj->merge_lora();
}

bool CausalLMImpl::has_lora() const {
  for (const auto& m : modules(false))
    if (const auto* proj = m->as<ProjectionImpl>(); proj && proj->has_lora())
      return true;
  return false;
}

std::vector<torch::Tensor> CausalLMImpl::trainable_parameters() {
  std::vector<torch::Tensor> out;
  for (auto& p : parameters())
    if (p.requires_grad())
      out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> CausalLMImpl::export_tensors() {
  std::map<std::string, torch::Tensor> merged;
  for (auto& item : named_modules("", /*include_self=*/false))
    if (auto* proj = item.value()->as<ProjectionImpl>(); proj && proj->has_lora())
      merged[item.key() + ".weight"] = proj->merged_weight();
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& item : named_parameters(true)) {
    if (is_lora_name(item.key()))
      continue;
    auto it = merged.find(item.key());
    out.emplace_back(item.key(), it != merged.end() ? it->second : item.value().detach());
  }
  return out;
}

// ---- checkpoints ------------------------------------------------------------------------------

result<torch::ScalarType> parse_torch_dtype(std::string_view name) {
  if (name == "bfloat16")
    return torch::kBFloat16;
  if (name == "float32")
    return torch::kFloat;
  if (name == "float16")
    return torch::kHalf;
  return fail(errc::config, "dtype '", name, "' is not supported (bfloat16, float32, float16)");
}

const char* torch_dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kBFloat16: return "bfloat16";
    case torch::kHalf: return "float16";
    case torch::kDouble: return "float64";
    default: return "float32";
  }
}

result<void> load_weights(CausalLMImpl& model, const safetensors_checkpoint& checkpoint, bool check_finite) {
  const std::string dir = checkpoint.dir().string();
  struct assignment {
    torch::Tensor param;
    const tensor_view* view;
    torch::ScalarType dtype;
  };
  std::vector<assignment> plan;
  std::set<std::string> used;
  // Check everything before copying anything, so a bad checkpoint leaves the model as it was.
  for (auto& item : model.named_parameters(true)) {
    const auto& name = item.key();
    if (is_lora_name(name))
      continue;
    const tensor_view* v = checkpoint.find(name);
    if (v == nullptr)
      return fail(errc::not_found, dir, ": missing tensor ", name, " (config.json implies it)");
    auto& p = item.value();
    if (!std::equal(v->shape.begin(), v->shape.end(), p.sizes().begin(), p.sizes().end()))
      return fail(errc::corrupt, dir, ": tensor ", name, " has shape ", shape_text(v->shape),
                  " but config.json implies ", shape_text(p.sizes()));
    auto dtype = torch_float_type(v->dtype);
    if (!dtype)
      return fail(errc::corrupt, dir, ": tensor ", name, " has dtype ", to_string(v->dtype),
                  ", not a floating-point type");
    if (check_finite && !torch::isfinite(tensor_from_view(*v, *dtype)).all().item<bool>())
      return fail(errc::corrupt, dir, ": tensor ", name, " holds NaN or infinite values");
    plan.push_back({p, v, *dtype});
    used.insert(name);
  }
  for (const auto& name : checkpoint.names()) {
    if (used.count(name) != 0)
      continue;
    // Tied models may still carry a copy of the output matrix; old checkpoints their RoPE tables.
    if (name == "lm_head.weight" && model.config().tie_word_embeddings)
      continue;
    if (name.size() > 20 && name.compare(name.size() - 20, 20, ".rotary_emb.inv_freq") == 0)
      continue;
    return fail(errc::corrupt, dir, ": unexpected tensor ", name, " (does config.json describe these weights?)");
  }
  torch::NoGradGuard no_grad;
  for (auto& a : plan)
    a.param.copy_(tensor_from_view(*a.view, a.dtype));
  return {};
}

result<CausalLM> load_model(const fs::path& dir, const load_options& options) {
  auto config = read_model_config(dir);
  if (!config)
    return config.error();
  auto checkpoint = safetensors_checkpoint::open(dir);
  if (!checkpoint)
    return checkpoint.error();
  const auto dtype = options.dtype.value_or(options.device.is_cuda() ? torch::kBFloat16 : torch::kFloat);
  CausalLM model(*config);
  model->to(options.device, dtype);
  if (auto r = load_weights(*model, *checkpoint, options.check_finite); !r)
    return r.error();
  return model;
}

torch::Tensor to_tensor(const tensor_view& view) { return tensor_from_view(view, torch_type_of(view.dtype)).clone(); }

result<void> save_tensors(const fs::path& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::vector<torch::Tensor> host;
  auto views = host_views(tensors, std::nullopt, host);
  if (!views)
    return views.error();
  return write_safetensors(path, *views);
}


result<void> save_model(CausalLMImpl& model, const fs::path& dir, const save_options& options) {
  if (!torch::isFloatingType(options.dtype) || !st_dtype_of(options.dtype))
    return fail(errc::invalid_arg, "save_model: dtype ", c10::toString(options.dtype), " is not a float type");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return fail(errc::io, "cannot create ", dir.string(), ": ", ec.message());
  std::vector<torch::Tensor> host;
  auto views = host_views(model.export_tensors(), options.dtype, host);
  if (!views)
    return views.error();
  if (auto r = write_checkpoint_weights(dir, *views, options.shards); !r)
    return r.error();
  if (!options.tokenizer_from.empty()) {
    if (!fs::exists(options.tokenizer_from / "tokenizer.json", ec))
      return fail(errc::not_found, options.tokenizer_from.string(), ": no tokenizer.json to copy beside the weights");
    if (auto r = copy_model_side_files(options.tokenizer_from, dir); !r)
      return r.error();
  }
  return write_file_atomic(dir / "config.json", to_config_json(model.config(), torch_dtype_name(options.dtype)));
}

result<model_config> init_model(const init_model_options& options) {
  auto config = preset_config(options.preset, options.family, options.vocab_size);
  if (!config)
    return config.error();
  config->bos_token_id = options.bos_token_id;
  config->eos_token_ids = options.eos_token_ids;
  config->pad_token_id = options.pad_token_id;
  if (auto v = config->validate(); !v)
    return v.error();
  auto dtype = parse_torch_dtype(options.dtype);
  if (!dtype)
    return dtype.error();
  CausalLM model(*config);
  model->init_weights(options.seed);
  save_options save;
  save.dtype = *dtype;
  if (auto r = save_model(*model, options.dir, save); !r)
    return r.error();
  return config;
}

} // namespace crucible::policy
