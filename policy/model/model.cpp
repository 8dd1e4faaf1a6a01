// policy/model/model.cpp: the decoder's arithmetic, mirroring transformers' Llama/Qwen2 code op for
// op (float32 RMSNorm and RoPE tables, SDPA attention): its modules, the training forward with its
// autograd functions, and LoRA. The decoding step is in model_decode.cpp, the HF checkpoint I/O in
// model_checkpoint.cpp.
#include "policy/model/model.hpp"
#include "policy/model/model_detail.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <set>

#include <ATen/CPUGeneratorImpl.h>

#ifdef CRUCIBLE_HAVE_CUDA
#  include "policy/kernels/fused.hpp"
#endif

namespace crucible::policy {

using namespace model_detail;

namespace {

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

// log p(target) per row with logits recomputed chunk by chunk in the backward pass. With `fused` on
// CUDA, each chunk's log-softmax and its gradient are one kernel each over the logits in their own
// dtype (policy/kernels/kernels.cu), the gradient is written over the recomputed logits, and the
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

// `parts` as one tensor along dim 0 when they lie back to back, in this order, in one storage
// (contiguous, one dtype and device, equal trailing sizes); undefined otherwise, or when any is
// undefined. A view: no copy, no kernel.
torch::Tensor model_detail::joined_rows(const std::vector<torch::Tensor>& parts) {
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
  // Checkpointing only where a backward pass may follow: under NoGradGuard (the old and the
  // reference log-probs) there are no activations to save.
  const bool checkpoint = activation_checkpointing_ && torch::GradMode::is_enabled();
  for (auto& layer : model->blocks)
    x = checkpoint ? checkpointed_layer(layer.ptr(), x, cos, sin, mask) : layer->forward(x, cos, sin, mask);
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

} // namespace crucible::policy
