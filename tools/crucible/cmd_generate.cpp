// `crucible generate`: a model directory and a prompt in, sampled completions out (text, or JSON
// with token ids and per-token log-probs), through the same engine the rollout actors use.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "core/json.hpp"
#include "policy/model/engine.hpp"
#include "text/tokenizer.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

namespace fs = std::filesystem;

int report(const crucible::error& e, int code) {
  std::fprintf(stderr, "crucible generate: %s\n", e.message.c_str());
  return code;
}

int usage(const std::string& message) { return report(crucible::error{errc::invalid_arg, message}, exit_usage); }

// Bad files and settings are the user's to fix (2); I/O and devices failing are not (1).
int exit_code_of(const crucible::error& e) {
  return e.code == errc::io || e.code == errc::device ? exit_failure : exit_usage;
}

int run_generate(const parsed_args& args) {
  for (const char* required : {"--model", "--prompt"})
    if (!args.has(required))
      return usage(std::string{"missing "} + required + "; see 'crucible generate --help'");
  auto device = device_option(args, "--device", "cpu");
  auto max_new = int_option(args, "--max-new-tokens", 128, 1, 1 << 20);
  auto temperature = real_option(args, "--temperature", 1.0, 0.0, 1e4);
  auto top_p = real_option(args, "--top-p", 1.0, 0.0, 1.0);
  auto top_k = int_option(args, "--top-k", 0, 0, INT64_MAX);
  auto samples = int_option(args, "--samples", 1, 1, 1 << 16);
  auto seed = int_option(args, "--seed", 0, 0, INT64_MAX);
  if (const auto* bad = first_error(device, max_new, temperature, top_p, top_k, samples, seed))
    return report(*bad, exit_usage);
  if (*top_p == 0.0)
    return usage("--top-p: expected a number above 0 and at most 1, got '" + args.get("--top-p") + "'");
  const auto dtype = args.get("--dtype");
  if (!dtype.empty() && dtype != "bfloat16" && dtype != "float16" && dtype != "float32")
    return usage("--dtype: expected bfloat16, float16 or float32, got '" + dtype + "'");
  const auto stops = args.all("--stop");
  if (std::find(stops.begin(), stops.end(), std::string{}) != stops.end())
    return usage("--stop: empty stop string");
  const fs::path model_dir = args.get("--model");
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec))
    return usage("--model " + model_dir.string() + ": no such directory");

  auto tok = policy::tokenizer::load(args.get("--tokenizer", model_dir.string()));
  if (!tok)
    return report(crucible::error{tok.error().code, "--tokenizer: " + tok.error().message}, exit_code_of(tok.error()));
  policy::engine_options eo;
  eo.device = *device;
  eo.dtype = dtype;
  eo.cuda_graphs = !args.has("--no-graphs");
  auto engine = policy::engine::load(model_dir, eo);
  if (!engine)
    return report(crucible::error{engine.error().code, "--model: " + engine.error().message},
                  exit_code_of(engine.error()));

  const auto prompt = tok->encode(args.get("--prompt"));
  if (prompt.empty())
    return usage("--prompt: the text encodes to no tokens");
  policy::sampling_options so;
  so.temperature = *temperature;
  so.top_p = *top_p;
  so.top_k = *top_k;
  so.max_new_tokens = *max_new;
  so.samples_per_prompt = *samples;
  so.seed = static_cast<std::uint64_t>(*seed);
  so.stop = stops;
  // The tokenizer's eos and the model's (config.json), as transformers' generate stops on the latter.
  const auto vocab = (*engine)->config().vocab_size;
  std::vector<std::int64_t> eos = (*engine)->config().eos_token_ids;
  if (auto id = tok->eos_id())
    eos.push_back(*id);
  for (auto id : eos)
    if (id >= 0 && id < vocab && std::find(so.eos_ids.begin(), so.eos_ids.end(), id) == so.eos_ids.end())
      so.eos_ids.push_back(static_cast<std::int32_t>(id));
  policy::detokenize_fn detokenize = [&](std::span<const std::int32_t> ids) { return tok->decode(ids); };

  std::vector<std::vector<std::int32_t>> prompts{prompt};
  std::optional<result<std::vector<policy::completion>>> generated;
  try {
    generated.emplace((*engine)->generate(prompts, so, detokenize));
  } catch (const std::exception& e) { // LibTorch failures (out of memory, a device error)
    return report(crucible::error{errc::device, e.what()}, exit_failure);
  }
  auto& out = *generated;
  if (!out)
    return report(out.error(), exit_code_of(out.error()));

  if (args.has("--json")) {
    json_writer w;
    w.begin_object().key("prompt_token_ids").begin_array();
    for (auto id : prompt)
      w.value(static_cast<std::int64_t>(id));
    w.end_array().key("completions").begin_array();
    for (const auto& c : *out) {
      w.begin_object().field("text", policy::completion_text(c, detokenize)).key("token_ids").begin_array();
      for (auto id : c.tokens)
        w.value(static_cast<std::int64_t>(id));
      w.end_array().key("logprobs").begin_array();
      for (auto lp : c.logprobs)
        w.value(static_cast<double>(lp));
      w.end_array().field("finish_reason", policy::to_string(c.finish));
      if (c.finish == policy::finish_reason::stop)
        w.field("stop", c.stop_string);
      w.end_object();
    }
    w.end_array().end_object();
    std::printf("%s\n", w.str().c_str());
    return exit_ok;
  }
  for (const auto& c : *out) {
    if (out->size() > 1)
      std::printf("--- sample %zu (%zu tokens, %s)\n", c.sample_index + 1, c.tokens.size(), policy::to_string(c.finish));
    std::printf("%s\n", policy::completion_text(c, detokenize).c_str());
  }
  return exit_ok;
}

} // namespace

command generate_command() {
  return {{"generate", "--model DIR --prompt TEXT [options]", "Sample completions of a prompt from a model",
           "Loads the model directory (config.json, safetensors weights, tokenizer.json) on --device\n"
           "and samples with the engine the rollout actors use: KV cache, CUDA graphs on GPUs.\n"
           "Generation ends at the tokenizer's or the model's eos token, at a --stop string (the text\n"
           "is cut before it), or after --max-new-tokens. Temperature 0 is greedy decoding.\n"
           "--json prints {\"prompt_token_ids\": [...], \"completions\": [{\"text\", \"token_ids\", \"logprobs\",\n"
           "\"finish_reason\"}]}, each log-prob under the temperature-scaled distribution.\n"
           "  crucible generate --model models/tiny --prompt 'def relu(x):' --temperature 0 --json",
           {},
           {{"--model", "DIR", "Hugging Face model directory (Llama or Qwen2 family)"},
            {"--prompt", "TEXT", "the prompt, encoded as is (with the tokenizer's template tokens, if any)"},
            {"--max-new-tokens", "N", "most tokens generated per completion (default 128)"},
            {"--temperature", "T", "softmax temperature; 0: greedy (default 1)"},
            {"--top-p", "P", "nucleus sampling threshold in (0, 1] (default 1: off)"},
            {"--top-k", "K", "keep the K most likely tokens (default 0: off)"},
            {"--samples", "N", "completions of the prompt (default 1)"},
            {"--seed", "S", "sampler seed (default 0)"},
            {"--stop", "STR", "stop once the text contains STR", true},
            {"--device", "DEVICE", "cpu (default) or cuda:N"},
            {"--dtype", "TYPE", "bfloat16, float16 or float32 (default: bfloat16 on CUDA, float32 on CPU)"},
            {"--tokenizer", "DIR", "tokenizer directory (default: the model directory)"},
            {"--no-graphs", "", "decode without CUDA graphs"},
            {"--json", "", "print JSON with token ids and log-probs"}}},
          run_generate};
}

} // namespace crucible::cli
