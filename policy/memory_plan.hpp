// policy/memory_plan.hpp: the GPU memory a run needs, computed from the model's shape and the
// learner's and engine's settings: bytes per GPU, item by item, against the card's capacity. The
// items follow what policy/'s training/learner.cpp, training/optimizer.cpp,
// distributed/data_parallel.cpp, model/model.cpp and model/engine.cpp allocate; activations are
// an estimate (the formula is in memory_plan.cpp). No torch types: the plan is arithmetic
// (`crucible memory-plan`, docs/scaling.md "Memory plan").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "policy/model/model_config.hpp"

namespace crucible {
struct config; // core/config.hpp
}

namespace crucible::policy {

/// One GPU of a run: a learner rank (data parallel over `gpus`) and an engine beside it, both
/// resident at once (asynchronous RL samples while the learner trains). Plain value; the
/// defaults are the Memory plan's assumptions in docs/scaling.md.
struct memory_plan_options {
  model_config model;                  ///< the architecture (model_config::validate() must pass)
  std::string label;                   ///< how tables name the model ("7b", a directory)
  int learner_bytes = 2;               ///< learner.dtype: 2 (bfloat16, float32 masters) or 4 (float32)
  int engine_bytes = 2;                ///< model.engine_dtype: 2 (bfloat16, float16) or 4 (float32)
  bool lora = false;                   ///< learner.lora: adapters train, the base is frozen
  std::int64_t lora_rank = 16;         ///< learner.lora_rank
  std::vector<std::string> lora_targets{"q_proj", "k_proj", "v_proj", "o_proj"}; ///< learner.lora_targets
  bool kl_reference = false;           ///< learner.kl_coef > 0: a frozen reference model in learner_bytes
  int gpus = 1;                        ///< data-parallel learner ranks, one per GPU
  bool zero1 = false;                  ///< learner.zero1 (only with gpus > 1)
  bool activation_checkpointing = true; ///< learner.activation_checkpointing: only each layer's input kept
  std::int64_t prompt_tokens = 4096;   ///< prompt.max_tokens
  std::int64_t completion_tokens = 2048; ///< rollout.max_new_tokens
  std::int64_t micro_batch_tokens = 8192; ///< learner.micro_batch_tokens (padded rows x longest row)
  std::int64_t group_size = 8;         ///< rollout.group_size: completions per prompt (one prefill each)
  std::int64_t engine_rows = 8;        ///< completions one engine call samples at once (KV cache rows)
  std::int64_t engine_slots = 0;       ///< KV cache slots per row; 0: prompt_tokens + completion_tokens
  /// Under LoRA the engine reads the learner's frozen base and keeps its own (merged) copies of
  /// the adapted projections only; false: the engine holds a whole copy of the weights.
  bool engine_shares_base = true;
  /// model.handoff memory: each version is staged on the device before the engine installs it,
  /// a copy of what changes (every weight under full fine-tuning, the merged adapted projections
  /// under LoRA) in the engine's dtype; false (disk): no staging.
  bool handoff_staging = true;
  /// An engine on this GPU, beside the learner (engine.devices empty or listing model.device);
  /// false: the engine's items are listed for its own GPU and not summed here.
  bool engine_here = true;
  /// Engines on GPUs of their own (engine.devices other than model.device): each holds its
  /// weights (nothing shared), handoff staging, KV cache and working set (engine_gpu).
  int engine_gpus = 0;
  /// evaluator.devices lists an engine's own GPU: the workers there (as evaluator_evaluations and
  /// evaluator_warm_workers are for this GPU), counted in engine_gpu (the fullest engine GPU).
  int engine_gpu_evaluations = 0;
  int engine_gpu_warm_workers = 0;
  std::int64_t max_prefill_tokens = 16384; ///< engine_options::max_prefill_tokens
  std::int64_t log_prob_chunk = 1024;  ///< CausalLMImpl::token_log_probs' chunk_tokens
  double bucket_mb = 25.0;             ///< learner.bucket_mb (MiB of float32 gradient per bucket)
  double runtime_gb = 1.5;             ///< CUDA context, cuBLAS/cuDNN workspaces, CUDA graph pools
  double nccl_gb = 0.5;                ///< NCCL's buffers and channels per GPU, when gpus > 1
  double gpu_gb = 80.0;                ///< capacity of one GPU in GB (10^9 bytes)
  /// An evaluator on this GPU (evaluator.devices lists the policy's GPU): its evaluations in
  /// flight (evaluator.concurrency; 0: no evaluator here) and its idle warm workers
  /// (evaluator.warm_workers). Each worker holds a CUDA context (evaluator_context_gb); each
  /// evaluation also holds its task's tensors and its timing's buffers (evaluator_evaluation_gb,
  /// task-dependent: the default is the GPU suite's, measured on an H200).
  int evaluator_evaluations = 0;
  int evaluator_warm_workers = 0;
  double evaluator_context_gb = 0.6;
  double evaluator_evaluation_gb = 8.0;
};

/// Which part of the budget an item belongs to.
enum class memory_part : std::uint8_t {
  learner_state, ///< held for the whole run: weights, masters, moments, gradients, buckets
  learner_peak,  ///< held during an update only: the largest of its phases (see memory_plan.cpp)
  engine,        ///< the engine's weights, KV cache and its largest working set
  runtime,       ///< CUDA context, workspaces, NCCL
  evaluator,     ///< an evaluator's workers on the policy's GPU
};

/// One line of a plan. `bytes` counts toward the total unless `counted` is false (the phases of
/// the update of which only the largest counts).
struct memory_item {
  memory_part part = memory_part::learner_state;
  std::string name;    ///< "AdamW moments (float32, 2 per parameter)"
  double bytes = 0.0;
  std::string formula; ///< how `bytes` was computed, in the plan's symbols
  bool counted = true;
};

/// The bytes one GPU needs. Plain value.
struct memory_plan {
  memory_plan_options options;
  std::int64_t parameters = 0;         ///< of the model (model_config::parameter_count)
  std::int64_t trainable = 0;          ///< parameters the optimiser updates (the adapters under LoRA)
  std::int64_t micro_batch_rows = 0;   ///< sequences per micro-batch
  std::int64_t micro_batch_tokens = 0; ///< padded tokens per micro-batch (rows x sequence inputs)
  std::vector<memory_item> items;
  double learner_state = 0.0;          ///< sum of the counted items of each part
  double learner_peak = 0.0;
  double engine = 0.0;
  double runtime = 0.0;
  double evaluator = 0.0;
  double total = 0.0;
  double capacity = 0.0;               ///< gpu_gb x 10^9
  bool fits = false;                   ///< total <= capacity
  /// engine_gpus > 0: what an engine's own GPU holds (its weights, staging, KV cache and working
  /// set, the runtime allowance, and an evaluator's workers where one is listed there).
  double engine_gpu = 0.0;
};

/// The options of a run configuration: the model (model.dir's config.json, or the preset
/// model.init makes), learner, prompt, rollout and engine values, one GPU per learner.devices
/// entry, and the evaluator's workers where evaluator.devices lists the policy's GPU
/// (model.device). errc::config naming what cannot be read.
result<memory_plan_options> memory_plan_options_of(const config& cfg);

/// Plans one GPU. errc::config naming the option at fault (a non-positive size, ZeRO-1 on one
/// GPU, an unknown LoRA target, a byte width other than 2 or 4, an invalid model).
result<memory_plan> plan_memory(const memory_plan_options& options);

/// The shapes the plan knows by name: "1.5b", "7b" (the published presets
/// qwen2.5-coder-1.5b-instruct and -7b-instruct of preset_config) and "14b", "32b"
/// (Qwen2.5-Coder-14B-Instruct and -32B-Instruct, whose config.json values are copied here for
/// planning only: init-model does not make them). The long names are accepted too.
/// errc::config naming the known names otherwise.
result<model_config> memory_plan_model(std::string_view name);
/// The short names memory_plan_model knows, smallest first.
std::span<const std::string_view> memory_plan_model_names();

/// One plan as a Markdown table, item by item, with the total and the verdict.
std::string memory_plan_markdown(const memory_plan& plan);

/// A grid of plans as one Markdown table: a row per model, mode (full or LoRA) and GPU count,
/// with the learner's state, its update's peak, the engine, the total per GPU and the verdict per
/// capacity, without and with ZeRO-1 (ZeRO-1 only for more than one GPU). `base` gives every
/// setting but the model, mode, GPU count, ZeRO-1 and capacity.
result<std::string> memory_grid_markdown(const memory_plan_options& base, std::span<const std::string> models,
                                         std::span<const int> gpus, std::span<const double> capacities_gb);

} // namespace crucible::policy
