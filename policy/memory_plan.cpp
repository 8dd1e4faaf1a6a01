// policy/memory_plan.cpp: a model's shape and a run's settings in, the bytes one GPU holds out,
// item by item, each computed the way the code that allocates it does.
#include "policy/memory_plan.hpp"

#include "core/config.hpp"
#include "core/device.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

namespace crucible::policy {

namespace {

// Published config.json values of the two larger Qwen2.5-Coder instruct models, for the plan
// only (init-model makes the 1.5B and 7B presets of model_config.cpp). Sources, read when this
// was written:
// - the model cards of Qwen/Qwen2.5-Coder-14B-Instruct ("Number of Layers: 48, Number of
//   Attention Heads (GQA): 40 for Q and 8 for KV", 14.7B parameters, 13.1B non-embedding) and
//   Qwen/Qwen2.5-Coder-32B-Instruct (64 layers, 40 Q and 8 KV heads, "32.5B", "31.0B
//   non-embedding"), as mirrored in github.com/ZHUI/paddlenlp_model_readme
//   (Qwen/Qwen2.5-Coder-{14,32}B-Instruct/index.md);
// - torchtune's builders qwen2_5_14b_instruct and qwen2_5_32b_instruct
//   (torchtune/models/qwen2_5/_model_builders.py): vocab_size 152064, embed_dim 5120,
//   intermediate_dim 13824 (14B) and 27648 (32B), 48 and 64 layers, 40 heads, 8 KV heads,
//   max_seq_len 32768, norm_eps 1e-6, rope_base 1e6, untied output projection (Qwen2.5's
//   builders tie embeddings only up to 3B); the Coder models have the same shapes (their cards'
//   counts above).
// With these values parameter_count() gives 14.77B and 32.76B; the 32B card's 32.5B is rounded
// down from the same shapes (the 14B card's 14.7B matches).
struct plan_shape {
  std::string_view name, preset;
  std::int64_t hidden, intermediate, layers, heads, kv_heads;
};

constexpr plan_shape larger_shapes[] = {
  {"14b", "qwen2.5-coder-14b-instruct", 5120, 13824, 48, 40, 8},
  {"32b", "qwen2.5-coder-32b-instruct", 5120, 27648, 64, 40, 8},
};

constexpr std::array<std::string_view, 4> short_names{"1.5b", "7b", "14b", "32b"};

model_config larger_model(const plan_shape& s) {
  model_config c;
  c.family = model_family::qwen2;
  c.vocab_size = 152064;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_layers = s.layers;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.hidden / s.heads;
  c.max_position_embeddings = 32768;
  c.rms_norm_eps = 1e-6;
  c.rope.theta = 1000000.0;
  c.tie_word_embeddings = false;
  c.qkv_bias = true;
  return c;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string gb(double bytes) { return fmt("%.2f", bytes / 1e9); }
std::string gb1(double bytes) { return fmt("%.1f", bytes / 1e9); }
std::string count(double v) {
  if (v >= 1e9)
    return fmt("%.2fB", v / 1e9);
  if (v >= 1e6)
    return fmt("%.1fM", v / 1e6);
  return fmt("%.0f", v);
}

// A projection's input and output widths, and whether it has a bias.
struct projection_shape {
  std::int64_t in, out;
  bool bias;
};

result<projection_shape> projection(const model_config& c, const std::string& name) {
  const auto q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  if (name == "q_proj")
    return projection_shape{c.hidden_size, q, c.qkv_bias};
  if (name == "k_proj" || name == "v_proj")
    return projection_shape{c.hidden_size, kv, c.qkv_bias};
  if (name == "o_proj")
    return projection_shape{q, c.hidden_size, c.o_bias};
  if (name == "gate_proj" || name == "up_proj")
    return projection_shape{c.hidden_size, c.intermediate_size, c.mlp_bias};
  if (name == "down_proj")
    return projection_shape{c.intermediate_size, c.hidden_size, c.mlp_bias};
  return fail(errc::config, "lora_targets: '", name,
              "' is not a projection (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
}

const char* part_name(memory_part p) {
  switch (p) {
    case memory_part::learner_state: return "learner state";
    case memory_part::learner_peak: return "learner update";
    case memory_part::engine: return "engine";
    case memory_part::runtime: return "runtime";
    case memory_part::evaluator: return "evaluator";
  }
  return "?";
}

} // namespace

std::span<const std::string_view> memory_plan_model_names() { return short_names; }

result<model_config> memory_plan_model(std::string_view name) {
  if (name == "1.5b")
    name = "qwen2.5-coder-1.5b-instruct";
  else if (name == "7b")
    name = "qwen2.5-coder-7b-instruct";
  for (const auto& s : larger_shapes)
    if (name == s.name || name == s.preset)
      return larger_model(s);
  if (find_published_model(name) != nullptr)
    return preset_config(name, model_family::qwen2, 1);
  return fail(errc::config, "model '", name,
              "' is not known to the memory plan (1.5b, 7b, 14b, 32b, or qwen2.5-coder-{1.5b,7b,14b,32b}-instruct)");
}

// The bytes one GPU holds, per part:
//
// Learner state (the whole run). Symbols: P parameters, Pt trainable parameters (P, or the
// adapters' under LoRA), b the learner's bytes per element (2 for bfloat16), N GPUs, S = N under
// ZeRO-1 and 1 otherwise.
//   weights            P x b                 (policy->to(dtype); LoRA adapters: Pa x b)
//   float32 masters    4 Pt / S              (adamw's master copies when b = 2; ZeRO-1's shards)
//   AdamW moments      8 Pt / S              (exp_avg, exp_avg_sq in float32)
//   float32 gradients  4 Pt                  (adamw's accumulated gradients: float32 parameters'
//                                            .grad; with N > 1 data_parallel's flat buckets, of
//                                            which the optimiser's gradients are views, reduced
//                                            in place; under ZeRO-1 the reduce-scatter leaves
//                                            this rank's shard in its chunk of each bucket: no
//                                            further copy, and the buckets stay whole)
//
// Learner update: the largest of three phases, each on top of the state.
//   backward start: the activations saved by the forward of one micro-batch (T tokens), plus the
//     larger of the output projection's backward (it runs first) and one layer's backward.
//   backward end: on one GPU the bf16 gradients of every trainable weight (autograd's .grad,
//     until adamw::accumulate_gradients adds them into the float32 gradients after the backward,
//     in place and without a float32 temporary); with N > 1 data_parallel's hooks add each into
//     its bucket as autograd completes it, so only the largest one's bf16 gradient is held.
//   optimizer step: adamw_update's two float32 temporaries (sqrt(v) and its quotient) of the
//     largest tensor, or under ZeRO-1 of the largest shard plus two buckets of the all-gather in
//     flight.
//
// Activations per token per layer (bytes), as the training forward on CUDA saves them (fused
// RMSNorm, RoPE and SiLU-mul autograd functions of model.cpp, SDPA's flash kernel):
//   a = b (4 h + 3 q + 2 kv + 3 I) + 4 H + 2 b d  [+ b r per LoRA target]
// with h hidden, q = H d query width, kv = KVH d key/value width, I intermediate, H heads, d head
// dim: the layer input (RMSNorm), the normed input (q/k/v projections), rotated q, k and v and
// the attention output (SDPA), o_proj's input (a copy of the output), the residual after
// attention (RMSNorm), the normed residual (gate/up), gate and up (SiLU-mul), down's input; 4 H
// is SDPA's float32 log-sum-exp, 2 b d the RoPE tables each layer expands; a LoRA adapter keeps
// its rank-r intermediate. Frozen projections (LoRA) are counted as if they kept their input:
// an upper bound. Saved per micro-batch: T (L a + b h) without checkpointing (+ b h: the final
// norm's input); with checkpointing T (L b h + b h): each layer's input only, and one layer's
// activations are recomputed during its backward. One layer's backward works on about `a` per
// token without checkpointing and 2 a with it (the recomputed activations and their gradients).
//
// Log-probs (chunked over the vocabulary, model.cpp's target_log_probs_fn): the completion rows'
// final hidden states (C tokens) are copied and saved (C h b), their gradient is as large, each
// chunk's logits (c V b, c = min(chunk, C)) are made in the forward and again in the backward,
// where the gradient is written over them; the output weight's gradient is summed in float32
// (4 V h) and cast to the weight's dtype (2 V h) when it trains.
//
// Engine: its own weights (P x e, e its bytes; under LoRA with the base shared, only merged copies
// of the adapted projections), with model.handoff memory the staging copy of what changes a
// version (P x e, or the merged adapted projections under LoRA), the KV cache (rows x slots x L x 2 x kv x e), and the larger of
// prefill (a scratch cache of the prompt tokens of one prefill forward, one layer's copy of it to
// the group's rows, and the forward's transient of about (4 h + 4 I) e per token: the residual,
// its norm, gate, up, SiLU(gate) and their product live together) and decoding (float32 logits,
// probabilities and their sort: 3 x rows x V x 4).
result<memory_plan> plan_memory(const memory_plan_options& o) {
  const auto& m = o.model;
  if (auto v = m.validate(); !v)
    return fail(errc::config, "model: ", v.error().message);
  auto positive = [](const char* key, double v) -> result<void> {
    if (!(v > 0))
      return fail(errc::config, key, ": must be positive, got ", std::to_string(v));
    return {};
  };
  const std::pair<const char*, double> sizes[] = {
    {"gpus", o.gpus},
    {"prompt_tokens", static_cast<double>(o.prompt_tokens)},
    {"completion_tokens", static_cast<double>(o.completion_tokens)},
    {"micro_batch_tokens", static_cast<double>(o.micro_batch_tokens)},
    {"group_size", static_cast<double>(o.group_size)},
    {"engine_rows", static_cast<double>(o.engine_rows)},
    {"max_prefill_tokens", static_cast<double>(o.max_prefill_tokens)},
    {"log_prob_chunk", static_cast<double>(o.log_prob_chunk)},
    {"bucket_mb", o.bucket_mb},
    {"gpu_gb", o.gpu_gb},
  };
  for (const auto& [key, v] : sizes)
    if (auto r = positive(key, v); !r)
      return r.error();
  if (o.engine_slots < 0)
    return fail(errc::config, "engine_slots: must be positive (or 0: prompt + completion), got ",
                std::to_string(o.engine_slots));
  if (o.runtime_gb < 0 || o.nccl_gb < 0)
    return fail(errc::config, "runtime_gb, nccl_gb: must not be negative");
  if (o.evaluator_evaluations < 0 || o.evaluator_warm_workers < 0 || o.evaluator_context_gb < 0
      || o.evaluator_evaluation_gb < 0 || o.engine_gpu_evaluations < 0 || o.engine_gpu_warm_workers < 0)
    return fail(errc::config, "evaluator_evaluations, evaluator_warm_workers, evaluator_context_gb, "
                              "evaluator_evaluation_gb, engine_gpu_evaluations, engine_gpu_warm_workers: must not be "
                              "negative");
  for (auto [key, v] : {std::pair{"learner_bytes", o.learner_bytes}, std::pair{"engine_bytes", o.engine_bytes}})
    if (v != 2 && v != 4)
      return fail(errc::config, key, ": 2 (bfloat16, float16) or 4 (float32), got ", std::to_string(v));
  if (o.zero1 && o.gpus < 2)
    return fail(errc::config, "zero1: shards the optimiser over data-parallel learners and needs more than one GPU");
  std::vector<projection_shape> targets;
  if (o.lora) {
    if (o.lora_rank <= 0)
      return fail(errc::config, "lora_rank: must be positive, got ", std::to_string(o.lora_rank));
    if (o.lora_targets.empty())
      return fail(errc::config, "lora_targets: empty");
    for (const auto& t : o.lora_targets) {
      auto p = projection(m, t);
      if (!p)
        return p.error();
      targets.push_back(*p);
    }
  }

  const double b = o.learner_bytes, e = o.engine_bytes;
  const double h = static_cast<double>(m.hidden_size), I = static_cast<double>(m.intermediate_size);
  const double L = static_cast<double>(m.num_layers), V = static_cast<double>(m.vocab_size);
  const double H = static_cast<double>(m.num_heads), d = static_cast<double>(m.head_dim);
  const double q = H * d, kv = static_cast<double>(m.num_kv_heads) * d;
  const double N = o.gpus;
  const double S = o.zero1 ? N : 1.0;
  const double r = static_cast<double>(o.lora_rank);

  memory_plan plan;
  plan.options = o;
  plan.parameters = m.parameter_count();
  const double P = static_cast<double>(plan.parameters);
  double adapters = 0.0, largest_adapter = 0.0, adapted_weights = 0.0;
  for (const auto& t : targets) {
    adapters += L * r * static_cast<double>(t.in + t.out);
    largest_adapter = std::max(largest_adapter, r * static_cast<double>(std::max(t.in, t.out)));
    adapted_weights += L * static_cast<double>(t.in * t.out + (t.bias ? t.out : 0));
  }
  const double Pt = o.lora ? adapters : P;
  plan.trainable = static_cast<std::int64_t>(Pt);
  // The largest trainable tensor: the embedding (or output) matrix, or an adapter matrix.
  const double largest = o.lora ? largest_adapter : std::max({V * h, I * h, q * h});
  const bool output_trains = !o.lora;

  const std::int64_t sequence = o.prompt_tokens + o.completion_tokens - 1; // the learner's inputs
  const std::int64_t rows = std::max<std::int64_t>(1, o.micro_batch_tokens / sequence);
  plan.micro_batch_rows = rows;
  plan.micro_batch_tokens = rows * sequence;
  const double T = static_cast<double>(plan.micro_batch_tokens);
  const double C = static_cast<double>(rows * o.completion_tokens);

  auto add = [&](memory_part part, std::string name, double bytes, std::string formula, bool counted = true) {
    plan.items.push_back({part, std::move(name), bytes, std::move(formula), counted});
  };
  const std::string bs = o.learner_bytes == 2 ? "2" : "4";

  // ---- learner state --------------------------------------------------------------------------
  add(memory_part::learner_state, std::string{"weights ("} + (o.learner_bytes == 2 ? "bfloat16" : "float32") + ")",
      P * b, "P x " + bs + ", P = " + count(P));
  if (o.lora)
    add(memory_part::learner_state, "LoRA adapters (rank " + std::to_string(o.lora_rank) + ")", Pt * b,
        "Pa x " + bs + ", Pa = L r (in + out) over the targets = " + count(Pt));
  const std::string St = o.zero1 ? " / " + std::to_string(o.gpus) : "";
  if (o.learner_bytes == 2 || o.zero1)
    add(memory_part::learner_state, o.zero1 ? "float32 master weights (ZeRO-1 shard)" : "float32 master weights",
        4 * Pt / S, "4 Pt" + St);
  add(memory_part::learner_state, o.zero1 ? "AdamW moments (ZeRO-1 shard)" : "AdamW moments", 8 * Pt / S,
      "2 x 4 Pt" + St);
  if (o.gpus > 1)
    add(memory_part::learner_state, "float32 gradients (accumulated in the data-parallel buckets)", 4 * Pt,
        o.zero1 ? "4 Pt (reduce-scattered in place: the shard is a chunk of each bucket)" : "4 Pt (reduced in place)");
  else
    add(memory_part::learner_state, "float32 gradients (accumulated over micro-batches)", 4 * Pt, "4 Pt");
  if (o.kl_reference)
    add(memory_part::learner_state, "KL reference model", P * b, "P x " + bs);

  // ---- learner update -------------------------------------------------------------------------
  double a = b * (4 * h + 3 * q + 2 * kv + 3 * I) + 4 * H + 2 * b * d;
  if (o.lora)
    a += b * r * static_cast<double>(targets.size());
  const double saved = o.activation_checkpointing ? T * (L * b * h + b * h) : T * (L * a + b * h);
  const double working = (o.activation_checkpointing ? 2.0 : 1.0) * T * a;
  const double chunk = std::min(static_cast<double>(o.log_prob_chunk), C);
  const double lp_hidden = 2 * C * h * b;
  const double lp_chunk = chunk * V * b + chunk * h * b;
  const double lp_weight = output_trains ? 4 * V * h + (o.learner_bytes == 2 ? 2 * V * h : 0.0) : 0.0;
  const double lp = lp_hidden + lp_chunk + lp_weight;
  const double start = saved + std::max(lp, working);
  const double end = o.learner_bytes != 2 ? 0.0 : o.gpus > 1 ? 2 * largest : 2 * Pt;
  double step = 8 * largest;
  std::string step_formula = "8 x the largest trainable tensor (" + count(largest) + ")";
  if (o.zero1) {
    const double bucket = std::max(largest, std::floor(o.bucket_mb * 1048576.0 / 4.0));
    step = 8 * std::ceil(bucket / N) + 2 * b * (bucket + bucket / N);
    step_formula = "8 x the largest shard + 2 buckets of the all-gather in flight (largest bucket " + count(bucket) + ")";
  }
  const std::string rows_text = std::to_string(rows) + " x " + std::to_string(sequence);
  add(memory_part::learner_peak,
      o.activation_checkpointing ? "saved activations (checkpointing: each layer's input)" : "saved activations",
      saved,
      o.activation_checkpointing ? "T (L b h + b h), T = " + rows_text + " tokens"
                                 : "T (L a + b h), a = " + fmt("%.0f", a) + " B per token per layer, T = " + rows_text,
      false);
  add(memory_part::learner_peak, "one layer's backward", working,
      std::string{o.activation_checkpointing ? "2 T a" : "T a"} + ", a = " + fmt("%.0f", a) + " B", false);
  add(memory_part::learner_peak, "log-probs: completion hidden states and their gradient", lp_hidden,
      "2 C h b, C = " + std::to_string(rows * o.completion_tokens) + " completion tokens", false);
  add(memory_part::learner_peak, "log-probs: one chunk of logits", lp_chunk,
      "c (V + h) b, c = " + fmt("%.0f", chunk), false);
  if (output_trains)
    add(memory_part::learner_peak, "log-probs: output weight's gradient", lp_weight,
        o.learner_bytes == 2 ? "4 V h (float32 sum) + 2 V h (cast)" : "4 V h", false);
  add(memory_part::learner_peak, "phase: backward start", start, "saved + max(log-probs, one layer's backward)", false);
  if (o.learner_bytes == 2)
    add(memory_part::learner_peak, "phase: backward end (bf16 gradients)", end,
        o.gpus > 1 ? "2 x the largest trainable tensor (each added into its bucket as it completes)" : "2 Pt", false);
  add(memory_part::learner_peak, "phase: optimizer step", step, step_formula, false);
  const double peak = std::max({start, end, step});
  const char* which = peak == start ? "backward start" : peak == end ? "backward end" : "optimizer step";
  add(memory_part::learner_peak, "update peak", peak, std::string{"the largest phase: "} + which);

  // ---- engine ---------------------------------------------------------------------------------
  // On a GPU of its own (engine.devices) an engine shares nothing; without an engine here its
  // items are listed for that GPU and not summed.
  const bool here = o.engine_here;
  const std::string there = here ? "" : " on the engine's GPU";
  const bool shared = here && o.lora && o.engine_shares_base && o.engine_bytes == o.learner_bytes;
  // What an engine on a GPU of its own holds, whether or not one is here too.
  double apart = P * e;
  if (shared)
    add(memory_part::engine, "engine weights (merged adapted projections; base shared)", adapted_weights * e,
        "L x (in x out + bias) of the targets x " + fmt("%.0f", e));
  else
    add(memory_part::engine, "engine weights" + there, P * e, "P x " + fmt("%.0f", e), here);
  if (o.handoff_staging) {
    if (o.lora)
      add(memory_part::engine, "handoff staging (merged adapted projections)" + there, adapted_weights * e,
          "what changes a version, in the engine's dtype (model.handoff: memory)", here);
    else
      add(memory_part::engine, "handoff staging (every weight)" + there, P * e,
          "what changes a version, in the engine's dtype (model.handoff: memory)", here);
    apart += plan.items.back().bytes;
  }
  const std::int64_t slots = o.engine_slots > 0 ? o.engine_slots : o.prompt_tokens + o.completion_tokens;
  const double R = static_cast<double>(o.engine_rows);
  const double kv_token = L * 2 * kv * e; // bytes of one token's keys and values, all layers
  add(memory_part::engine, "KV cache" + there, R * static_cast<double>(slots) * kv_token,
      "rows x slots x L x 2 x kv x e = " + std::to_string(o.engine_rows) + " x " + std::to_string(slots) + " x " +
        fmt("%.0f", kv_token) + " B",
      here);
  apart += plan.items.back().bytes;
  const std::int64_t prompts = (o.engine_rows + o.group_size - 1) / o.group_size;
  const std::int64_t per_prefill =
    std::clamp<std::int64_t>(o.max_prefill_tokens / o.prompt_tokens, 1, std::max<std::int64_t>(prompts, 1));
  const double prefill_tokens = static_cast<double>(per_prefill * o.prompt_tokens);
  const double prefill_rows = static_cast<double>(std::min(per_prefill * o.group_size, o.engine_rows));
  const double prefill = prefill_tokens * kv_token + prefill_rows * static_cast<double>(o.prompt_tokens) * kv * e +
                         prefill_tokens * (4 * h + 4 * I) * e;
  const double decode = 3 * R * V * 4;
  add(memory_part::engine,
      (prefill >= decode ? "engine working set (prefill)" : "engine working set (decoding)") + there,
      std::max(prefill, decode),
      prefill >= decode ? "scratch cache + one layer's copy + " + fmt("%.0f", prefill_tokens) + " x (4 h + 4 I) x e"
                        : "3 x rows x V x 4",
      here);
  apart += plan.items.back().bytes;

  // ---- runtime --------------------------------------------------------------------------------
  add(memory_part::runtime, "CUDA context, cuBLAS/cuDNN workspaces, graph pools", o.runtime_gb * 1e9, "allowance");
  if (o.gpus > 1)
    add(memory_part::runtime, "NCCL buffers", o.nccl_gb * 1e9, "allowance");

  // ---- an evaluator on this GPU ---------------------------------------------------------------
  // Every worker (idle warm ones and those evaluating) holds a CUDA context; an evaluation also
  // holds its task's inputs and outputs and its timing's buffers (both workers' inputs and outputs
  // of a sample, the evaluator's copies of them: docs/evaluator.md), so the figure per evaluation
  // is an allowance.
  if (o.evaluator_evaluations > 0) {
    const int workers = o.evaluator_evaluations + o.evaluator_warm_workers;
    add(memory_part::evaluator, "workers' CUDA contexts (" + std::to_string(workers) + ")",
        workers * o.evaluator_context_gb * 1e9,
        "(concurrency + warm workers) x " + fmt("%g", o.evaluator_context_gb) + " GB");
    add(memory_part::evaluator,
        "evaluations in flight (" + std::to_string(o.evaluator_evaluations) + "): tensors and timing buffers",
        o.evaluator_evaluations * o.evaluator_evaluation_gb * 1e9,
        "concurrency x " + fmt("%g", o.evaluator_evaluation_gb) + " GB allowance");
  }

  for (const auto& item : plan.items) {
    if (!item.counted)
      continue;
    switch (item.part) {
      case memory_part::learner_state: plan.learner_state += item.bytes; break;
      case memory_part::learner_peak: plan.learner_peak += item.bytes; break;
      case memory_part::engine: plan.engine += item.bytes; break;
      case memory_part::runtime: plan.runtime += item.bytes; break;
      case memory_part::evaluator: plan.evaluator += item.bytes; break;
    }
  }
  plan.total = plan.learner_state + plan.learner_peak + plan.engine + plan.runtime + plan.evaluator;
  if (o.engine_gpus > 0) {
    plan.engine_gpu = apart + o.runtime_gb * 1e9;
    if (o.engine_gpu_evaluations > 0) {
      const int workers = o.engine_gpu_evaluations + o.engine_gpu_warm_workers;
      add(memory_part::evaluator, "an evaluator on an engine's GPU (" + std::to_string(workers) + " workers)",
          workers * o.evaluator_context_gb * 1e9 + o.engine_gpu_evaluations * o.evaluator_evaluation_gb * 1e9,
          "(concurrency + warm workers) x " + fmt("%g", o.evaluator_context_gb) + " GB + concurrency x " +
            fmt("%g", o.evaluator_evaluation_gb) + " GB",
          false);
      plan.engine_gpu += plan.items.back().bytes;
    }
  }
  plan.capacity = o.gpu_gb * 1e9;
  plan.fits = plan.total <= plan.capacity;
  return plan;
}

std::string memory_plan_markdown(const memory_plan& p) {
  const auto& o = p.options;
  std::string out;
  out += "**" + (o.label.empty() ? std::string{"model"} : o.label) + "**, " +
         (o.lora ? "LoRA rank " + std::to_string(o.lora_rank) : std::string{"full fine-tuning"}) + ", " +
         std::to_string(o.gpus) + " GPU" + (o.gpus == 1 ? "" : "s") + (o.zero1 ? " with ZeRO-1" : "") + " of " +
         fmt("%g", o.gpu_gb) + " GB; prompt " + std::to_string(o.prompt_tokens) + " + completion " +
         std::to_string(o.completion_tokens) + " tokens, micro-batches of " + std::to_string(p.micro_batch_rows) +
         " sequence" + (p.micro_batch_rows == 1 ? "" : "s") + " (" + std::to_string(p.micro_batch_tokens) +
         " tokens), activation checkpointing " + (o.activation_checkpointing ? "on" : "off") + ", engine " +
         std::to_string(o.engine_rows) + " rows; " + count(static_cast<double>(p.parameters)) + " parameters, " +
         count(static_cast<double>(p.trainable)) + " trained\n\n";
  out += "| part | item | GB | how |\n|---|---|---:|---|\n";
  for (const auto& item : p.items) {
    const std::string name = item.counted ? item.name : "*" + item.name + "* (not summed)";
    out += std::string{"| "} + part_name(item.part) + " | " + name + " | " + gb(item.bytes) + " | " + item.formula + " |\n";
  }
  out += "| **total** | per GPU | **" + gb(p.total) + "** | learner state " + gb(p.learner_state) + " + update " +
         gb(p.learner_peak) + " + engine " + gb(p.engine) + " + runtime " + gb(p.runtime) +
         (p.evaluator > 0 ? " + evaluator " + gb(p.evaluator) : std::string{}) + " |\n\n";
  out += std::string{p.fits ? "Fits" : "Does not fit"} + " in " + fmt("%g", o.gpu_gb) + " GB (" +
         (p.fits ? gb(p.capacity - p.total) + " GB free" : gb(p.total - p.capacity) + " GB over") + ").\n";
  if (o.engine_gpus > 0)
    out += std::string{o.engine_gpus == 1 ? "The engine's GPU" : "Each engine's GPU"} + " (engine.devices, " +
           std::to_string(o.engine_gpus) + " apart from the learner's): " + gb(p.engine_gpu) +
           " GB (its weights, staging, KV cache and working set, and the runtime allowance" +
           (o.engine_gpu_evaluations > 0 ? "; with an evaluator's workers where evaluator.devices lists it" : "") +
           ").\n";
  return out;
}

result<std::string> memory_grid_markdown(const memory_plan_options& base, std::span<const std::string> models,
                                         std::span<const int> gpus, std::span<const double> capacities_gb) {
  std::string out = "| model | mode | GPUs | trained | learner state | update peak | engine | per GPU |";
  std::string rule = "|---|---|---:|---:|---:|---:|---:|---:|";
  for (double c : capacities_gb) {
    out += " " + fmt("%g", c) + " GB |";
    rule += ":-:|";
  }
  out += " ZeRO-1: learner state | ZeRO-1: per GPU |";
  rule += "---:|---:|";
  for (double c : capacities_gb) {
    out += " ZeRO-1: " + fmt("%g", c) + " GB |";
    rule += ":-:|";
  }
  out += "\n" + rule + "\n";
  for (const auto& name : models) {
    auto shape = memory_plan_model(name);
    if (!shape)
      return shape.error();
    for (bool lora : {false, true}) {
      for (int g : gpus) {
        memory_plan_options o = base;
        o.model = *shape;
        o.label = name;
        o.lora = lora;
        o.gpus = g;
        o.zero1 = false;
        auto plain = plan_memory(o);
        if (!plain)
          return plain.error();
        out += "| " + name + " | " + (lora ? "LoRA" : "full") + " | " + std::to_string(g) + " | " +
               count(static_cast<double>(plain->trainable)) + " | " + gb1(plain->learner_state) + " | " +
               gb1(plain->learner_peak) + " | " + gb1(plain->engine) + " | " + gb1(plain->total) + " |";
        for (double c : capacities_gb)
          out += plain->total <= c * 1e9 ? " yes |" : " no |";
        if (g > 1) {
          o.zero1 = true;
          auto sharded = plan_memory(o);
          if (!sharded)
            return sharded.error();
          out += " " + gb1(sharded->learner_state) + " | " + gb1(sharded->total) + " |";
          for (double c : capacities_gb)
            out += sharded->total <= c * 1e9 ? " yes |" : " no |";
        } else {
          out += " — | — |";
          for (std::size_t k = 0; k < capacities_gb.size(); ++k)
            out += " — |";
        }
        out += "\n";
      }
    }
  }
  return out;
}

result<memory_plan_options> memory_plan_options_of(const config& cfg) {
  memory_plan_options o;
  if (!cfg.model.dir.empty()) {
    auto m = read_model_config(cfg.model.dir);
    if (!m)
      return m.error();
    o.model = *m;
    o.label = cfg.model.dir;
  } else {
    auto family = parse_model_family(cfg.model.family);
    if (!family)
      return family.error();
    auto m = preset_config(cfg.model.init, *family, cfg.model.tokenizer_vocab);
    if (!m)
      return m.error();
    o.model = *m;
    o.label = cfg.model.init;
  }
  const auto& l = cfg.learner;
  o.learner_bytes = l.dtype == "bfloat16" ? 2 : 4;
  o.engine_bytes = cfg.model.engine_dtype == "float32" ? 4 : 2;
  o.lora = l.lora;
  o.lora_rank = l.lora_rank;
  o.lora_targets = l.lora_targets;
  o.kl_reference = l.kl_coef > 0;
  o.zero1 = l.zero1;
  // learner.devices: one learner rank a GPU.
  if (!l.devices.empty())
    o.gpus = static_cast<int>(l.devices.size());
  o.micro_batch_tokens = l.micro_batch_tokens;
  o.activation_checkpointing = l.activation_checkpointing;
  // model.handoff memory: under LoRA the engine reads the learner's frozen base; disk: its own copy.
  o.engine_shares_base = cfg.model.handoff == "memory";
  o.handoff_staging = cfg.model.handoff == "memory";
  const auto engines = engine_devices(cfg);
  const auto apart = engine_devices_apart(cfg);
  o.engine_here = std::find(engines.begin(), engines.end(), cfg.model.device) != engines.end();
  o.engine_gpus = static_cast<int>(apart.size());
  o.bucket_mb = l.bucket_mb;
  o.prompt_tokens = cfg.prompt.max_tokens;
  o.completion_tokens = cfg.rollout.max_new_tokens;
  o.group_size = cfg.rollout.group_size;
  // The largest call the engine makes: as many waiting requests as it batches, up to its cap.
  o.engine_rows = std::min(cfg.engine.max_batch_samples, cfg.engine.max_batch_prompts * cfg.rollout.group_size);
  // An evaluator on the policy's GPU.
  const int policy_gpu = cuda_index(cfg.model.device);
  for (const auto& d : cfg.evaluator.devices) {
    if (policy_gpu >= 0 && cuda_index(d) == policy_gpu) {
      o.evaluator_evaluations = static_cast<int>(cfg.evaluator.concurrency);
      o.evaluator_warm_workers = static_cast<int>(cfg.evaluator.warm_workers);
    }
    if (std::find(apart.begin(), apart.end(), d) != apart.end()) {
      o.engine_gpu_evaluations = static_cast<int>(cfg.evaluator.concurrency);
      o.engine_gpu_warm_workers = static_cast<int>(cfg.evaluator.warm_workers);
    }
  }
  return o;
}

} // namespace crucible::policy
