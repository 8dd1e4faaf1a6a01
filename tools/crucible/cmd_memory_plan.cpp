// `crucible memory-plan`: a model's shape and a run's settings (flags, or a run configuration)
// in, the GPU memory of one learner rank and its engine out, as Markdown: one configuration item
// by item, or the grid of docs/scaling.md (policy/memory_plan.hpp computes it).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <type_traits>

#include "core/config.hpp"
#include "policy/memory_plan.hpp"
#include "policy/model/model_config.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

int fail_with(const std::string& message, int code) {
  std::fprintf(stderr, "crucible memory-plan: %s\n", message.c_str());
  return code;
}

int usage(const std::string& message) { return fail_with(message, exit_usage); }

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');)
    if (!part.empty())
      out.push_back(part);
  return out;
}

// "80,141" as numbers; errc::invalid_arg naming the flag.
template <class T>
result<std::vector<T>> number_list(const parsed_args& args, const std::string& flag, const std::string& fallback) {
  std::vector<T> out;
  for (const auto& part : split(args.get(flag, fallback))) {
    char* end = nullptr;
    const double v = std::strtod(part.c_str(), &end);
    if (end == part.c_str() || *end != '\0' || !(v > 0) || (std::is_integral_v<T> && v != static_cast<T>(v)))
      return fail(errc::invalid_arg, flag, ": expected ", std::is_integral_v<T> ? "positive integers" : "positive numbers",
                  " separated by commas, got '", args.get(flag), "'");
    out.push_back(static_cast<T>(v));
  }
  if (out.empty())
    return fail(errc::invalid_arg, flag, ": empty list");
  return out;
}

// A model by plan name (1.5b, 7b, 14b, 32b, the long names) or a directory with config.json.
result<policy::model_config> model_named(const std::string& name) {
  std::error_code ec;
  if (std::filesystem::is_directory(name, ec) || std::filesystem::is_regular_file(name, ec))
    return policy::read_model_config(name);
  return policy::memory_plan_model(name);
}

// Flags over the defaults (or the configuration's values). Lists are for --grid.
int apply_flags(const parsed_args& args, policy::memory_plan_options& o, bool grid) {
  auto rank = int_option(args, "--lora-rank", o.lora_rank, 1, 1 << 20);
  auto prompt = int_option(args, "--prompt-tokens", o.prompt_tokens, 1, 1 << 24);
  auto completion = int_option(args, "--completion-tokens", o.completion_tokens, 1, 1 << 24);
  auto micro = int_option(args, "--micro-batch-tokens", o.micro_batch_tokens, 1, std::int64_t{1} << 40);
  auto group = int_option(args, "--group-size", o.group_size, 1, 1 << 20);
  auto rows = int_option(args, "--engine-rows", o.engine_rows, 1, 1 << 20);
  auto slots = int_option(args, "--engine-slots", o.engine_slots, 0, 1 << 24);
  auto runtime = real_option(args, "--runtime-gb", o.runtime_gb, 0, 1e6);
  auto evaluation = real_option(args, "--evaluation-gb", o.evaluator_evaluation_gb, 0, 1e6);
  if (const auto* bad = first_error(rank, prompt, completion, micro, group, rows, slots, runtime, evaluation))
    return usage(bad->message);
  o.evaluator_evaluation_gb = *evaluation;
  o.lora_rank = *rank, o.prompt_tokens = *prompt, o.completion_tokens = *completion, o.micro_batch_tokens = *micro;
  o.group_size = *group, o.engine_rows = *rows, o.engine_slots = *slots, o.runtime_gb = *runtime;
  if (args.has("--lora"))
    o.lora = true;
  if (args.has("--lora-targets"))
    o.lora_targets = split(args.get("--lora-targets"));
  if (args.has("--zero1"))
    o.zero1 = true;
  if (args.has("--kl-reference"))
    o.kl_reference = true;
  if (args.has("--engine-own-copy"))
    o.engine_shares_base = false;
  if (args.has("--activation-checkpointing")) {
    const auto v = args.get("--activation-checkpointing");
    if (v != "on" && v != "off")
      return usage("--activation-checkpointing: expected on or off, got '" + v + "'");
    o.activation_checkpointing = v == "on";
  }
  if (!grid) {
    auto gpus = int_option(args, "--gpus", o.gpus, 1, 1 << 16);
    auto capacity = real_option(args, "--gpu-gb", o.gpu_gb, 1e-9, 1e9);
    if (const auto* bad = first_error(gpus, capacity))
      return usage(bad->message + (args.get("--gpus").find(',') != std::string::npos ? " (lists need --grid)" : ""));
    o.gpus = static_cast<int>(*gpus), o.gpu_gb = *capacity;
  }
  return exit_ok;
}

int run_memory_plan(const parsed_args& args) {
  const bool grid = args.has("--grid") || (!args.has("--model") && !args.has("--config"));
  if (args.has("--grid") && (args.has("--model") || args.has("--config")))
    return usage("--grid plans the models of --models; it takes neither --model nor --config");
  if (args.has("--model") && args.has("--config"))
    return usage("give --model or --config, not both");
  if (args.has("--set") && !args.has("--config"))
    return usage("--set overrides keys of --config CONFIG");
  if (grid && args.has("--zero1"))
    return usage("--grid shows every GPU count without and with ZeRO-1; --zero1 is for one configuration");

  policy::memory_plan_options o;
  if (args.has("--config")) {
    auto cfg = load_config(args.get("--config"), args.all("--set"));
    if (!cfg)
      return usage(cfg.error().message);
    auto from = policy::memory_plan_options_of(*cfg);
    if (!from)
      return usage("--config " + args.get("--config") + ": " + from.error().message);
    o = std::move(*from);
  } else if (args.has("--model")) {
    auto m = model_named(args.get("--model"));
    if (!m)
      return usage("--model: " + m.error().message);
    o.model = *m;
    o.label = args.get("--model");
  }
  if (int rc = apply_flags(args, o, grid); rc != exit_ok)
    return rc;

  if (grid) {
    auto gpus = number_list<int>(args, "--gpus", "1,2,4,8");
    auto capacities = number_list<double>(args, "--gpu-gb", "80,141");
    if (const auto* bad = first_error(gpus, capacities))
      return usage(bad->message);
    const auto models = split(args.get("--models", "1.5b,7b,14b,32b"));
    auto table = policy::memory_grid_markdown(o, models, *gpus, *capacities);
    if (!table)
      return usage(table.error().message);
    std::printf("GB (10^9 bytes) per GPU: one learner rank and one engine on each GPU. Prompt %lld + completion "
                "%lld tokens, micro-batches of %lld tokens, activation checkpointing %s, %s learner, engine "
                "%lld rows (groups of %lld) in %s; LoRA rank %lld on %s.\n\n%s",
                static_cast<long long>(o.prompt_tokens), static_cast<long long>(o.completion_tokens),
                static_cast<long long>(o.micro_batch_tokens), o.activation_checkpointing ? "on" : "off",
                o.learner_bytes == 2 ? "bfloat16 (float32 masters)" : "float32", static_cast<long long>(o.engine_rows),
                static_cast<long long>(o.group_size), o.engine_bytes == 2 ? "bfloat16" : "float32",
                static_cast<long long>(o.lora_rank), args.get("--lora-targets", "q_proj,k_proj,v_proj,o_proj").c_str(),
                table->c_str());
    return exit_ok;
  }
  auto plan = policy::plan_memory(o);
  if (!plan)
    return usage(plan.error().message);
  std::fputs(policy::memory_plan_markdown(*plan).c_str(), stdout);
  return exit_ok;
}

} // namespace

command memory_plan_command() {
  return {{"memory-plan", "[--grid | --model NAME|DIR | --config CONFIG] [options]",
           "GPU memory per learner rank and engine: one configuration, or the grid",
           "Computes the bytes one GPU holds when it runs a learner rank (data parallel over --gpus) and an\n"
           "engine beside it, as policy/memory_plan.hpp accounts them: weights, float32 masters, AdamW\n"
           "moments, gradients and buckets (ZeRO-1 shards them), LoRA adapters, the update's peak\n"
           "(activations, chunked log-probs, gradients, optimizer step), the engine's weights (shared\n"
           "under LoRA but for the merged adapted projections), KV cache and working set, and a CUDA\n"
           "allowance; then whether it fits. Computed, not measured. Prints Markdown.\n"
           "Without --model or --config (or with --grid): the table of docs/scaling.md, every model of\n"
           "--models in full fine-tuning and LoRA on each GPU count, without and with ZeRO-1.\n"
           "Models: 1.5b, 7b, 14b, 32b (Qwen2.5-Coder-*-Instruct's published shapes) or a model directory.\n"
           "Defaults: prompt 4096 + completion 2048 tokens, micro-batches of 8192 tokens, checkpointing\n"
           "on, bfloat16 learner and engine, engine of 8 rows (one group of 8), LoRA rank 16 on q/k/v/o.\n"
           "With --config the run configuration's model, learner (learner.devices: the GPU count),\n"
           "prompt.max_tokens, rollout.max_new_tokens, rollout.group_size and engine batching replace the\n"
           "defaults; flags given override both.\n"
           "  crucible memory-plan\n"
           "  crucible memory-plan --model 7b --lora --gpus 1 --gpu-gb 141\n"
           "  crucible memory-plan --config configs/gpu-1x.yaml --gpu-gb 80",
           {},
           {{"--grid", "", "the grid (the default without --model and --config)"},
            {"--models", "LIST", "grid: models, comma-separated (default 1.5b,7b,14b,32b)"},
            {"--model", "NAME|DIR", "one configuration of this model: 1.5b, 7b, 14b, 32b or a model directory"},
            {"--config", "CONFIG", "one configuration from a run configuration file"},
            {"--set", "KEY=VALUE", "override a key of CONFIG, e.g. --set learner.lora=true", true},
            {"--gpus", "N", "learner ranks, one per GPU (default 1; grid: a list, default 1,2,4,8)"},
            {"--gpu-gb", "GB", "memory of one GPU in 10^9 bytes (default 80; grid: a list, default 80,141)"},
            {"--zero1", "", "shard masters and moments over the GPUs (learner.zero1; more than one GPU)"},
            {"--lora", "", "train LoRA adapters (learner.lora)"},
            {"--lora-rank", "N", "LoRA rank (default 16)"},
            {"--lora-targets", "LIST", "adapted projections (default q_proj,k_proj,v_proj,o_proj)"},
            {"--activation-checkpointing", "on|off", "keep only each layer's input for the backward (default on)"},
            {"--prompt-tokens", "N", "prompt tokens (default 4096)"},
            {"--completion-tokens", "N", "completion tokens (default 2048)"},
            {"--micro-batch-tokens", "N", "learner micro-batch, padded tokens (default 8192)"},
            {"--group-size", "N", "completions per prompt, one prefill each (default 8)"},
            {"--engine-rows", "N", "completions the engine samples at once (default 8)"},
            {"--engine-slots", "N", "KV cache slots per row (default prompt + completion)"},
            {"--engine-own-copy", "", "under LoRA the engine keeps a whole copy of the weights"},
            {"--kl-reference", "", "a frozen KL reference model beside the policy"},
            {"--runtime-gb", "GB", "CUDA context and workspace allowance (default 1.5)"},
            {"--evaluation-gb", "GB",
             "with --config whose evaluator.devices holds model.device: each evaluation's allowance there (default 8)"}}},
          run_memory_plan};
}

} // namespace crucible::cli
