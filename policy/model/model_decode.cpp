// policy/model/model_decode.cpp: the causal LM's decoding step, the tokens of a batch of rows and
// their KV cache in, the next tokens' logits (or greedy tokens) out; the fused CUDA step
// (policy/kernels/fused.hpp) where the model can take it, LibTorch's ops otherwise, and the
// prefill.
#include "policy/model/model.hpp"
#include "policy/model/model_detail.hpp"

#ifdef CRUCIBLE_HAVE_CUDA
#  include "policy/kernels/fused.hpp"
#endif

namespace crucible::policy {

using namespace model_detail;

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
// so a layer is five kernels, with the attention's combine where it splits (not at batch 1). Each
// kernel runs the variants of decode_options_ (kernels::decode_options).
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
  const auto& o = decode_options_;
  for (std::size_t l = 0; l < model->blocks.size(); ++l) {
    auto& layer = model->blocks[l];
    const auto& w = (*layers)[l];
    if (small_batch) {
      // Early reads: each kernel reads before its wait what no kernel that may still run writes
      // (the lengths, inv_freq, the cache below the new slot; the residual two kernels on only
      // where each kernel launches the next after its wait: kernels::small_gemm_args).
      auto q = fused::norm_qkv_rope(residual, layer->input_layernorm->weight, c.rms_norm_eps, w.qkv_weight, w.qkv_bias,
                                    inv, attention_scaling_, cache.lengths, cache.keys[l], cache.values[l],
                                    c.num_heads, c.num_kv_heads, c.head_dim, /*early_reads=*/true, o);
      fused::attention_project_add(q, cache.keys[l], cache.values[l], cache.lengths, layer->self_attn->o_proj->weight,
                                   layer->self_attn->o_proj->bias, residual, /*early_reads=*/true, o);
      auto act = fused::norm_gate_up_silu(residual, layer->post_attention_layernorm->weight, c.rms_norm_eps,
                                          w.gate_up_weight, w.gate_up_bias, o);
      fused::project_add(act, layer->mlp->down_proj->weight, layer->mlp->down_proj->bias, residual,
                         /*early_reads=*/true, o);
      continue;
    }
    auto h = fused::add_rms_norm(delta, residual, layer->input_layernorm->weight, c.rms_norm_eps);
    auto q = fused::rope_write_kv(project(h, w.qkv_weight), w.qkv_bias, inv, attention_scaling_, cache.lengths,
                                  cache.keys[l], cache.values[l], c.num_heads, c.num_kv_heads, c.head_dim);
    auto attn = fused::decode_attention(q, cache.keys[l], cache.values[l], cache.lengths, 0, /*early_reads=*/true, o);
    delta = project(attn, layer->self_attn->o_proj->weight, layer->self_attn->o_proj->bias);
    h = fused::add_rms_norm(delta, residual, layer->post_attention_layernorm->weight, c.rms_norm_eps);
    auto gate_up = project(h, w.gate_up_weight, w.gate_up_bias);
    delta = project(fused::silu_mul(gate_up), layer->mlp->down_proj->weight, layer->mlp->down_proj->bias);
  }
  if (sink != nullptr && small_batch && r == 1) {
    auto weight = output_weight();
    const bool aligned = reinterpret_cast<std::uintptr_t>(weight.data_ptr()) % 16 == 0
                         && reinterpret_cast<std::uintptr_t>(model->norm->weight.data_ptr()) % 16 == 0;
    if (o.greedy_head && aligned && weight.is_contiguous() && fused::greedy_head_ready(residual.scalar_type(), c.hidden_size, c.vocab_size)) {
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

} // namespace crucible::policy
