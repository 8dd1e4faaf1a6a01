// `crucible init-model`: a tokenizer directory in, a randomly initialised Hugging Face model
// directory (config.json, weights, the tokenizer's files) out, for tests, benchmarks and the
// quickstart.
#include <cstdio>
#include <filesystem>

#include "core/json.hpp"
#include "policy/model/model_config.hpp"
#include "policy/model/safetensors.hpp"
#include "text/tokenizer.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

namespace fs = std::filesystem;

int fail_with(const crucible::error& e, int code) {
  std::fprintf(stderr, "crucible init-model: %s\n", e.message.c_str());
  return code;
}

int usage(const std::string& message) { return fail_with(crucible::error{errc::invalid_arg, message}, exit_usage); }

bool non_empty_dir(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && !fs::is_empty(dir, ec);
}

int run_init_model(const parsed_args& args) {
  for (const char* required : {"--tokenizer", "--out"})
    if (!args.has(required))
      return usage(std::string{"missing "} + required + "; see 'crucible init-model --help'");
  auto family = policy::parse_model_family(args.get("--family", "qwen2"));
  if (!family)
    return usage("--family: " + family.error().message);
  const auto preset = args.get("--preset", "tiny");
  auto shape = policy::preset_config(preset, *family, 1);
  if (!shape)
    return usage("--preset: " + shape.error().message);
  const auto* published = policy::find_published_model(preset);
  const auto dtype = args.get("--dtype", "bfloat16");
  if (dtype != "bfloat16" && dtype != "float16" && dtype != "float32")
    return usage("--dtype: expected bfloat16, float16 or float32, got '" + dtype + "'");
  auto seed = int_option(args, "--seed", 0, 0, INT64_MAX);
  auto vocab = int_option(args, "--vocab-size", 0, 1, std::int64_t{1} << 31);
  if (const auto* bad = first_error(seed, vocab))
    return fail_with(*bad, exit_usage);
  if (published != nullptr && args.has("--vocab-size") && *vocab != shape->vocab_size)
    return usage("--vocab-size " + std::to_string(*vocab) + ": preset " + preset + " has the published vocabulary of " +
                 std::to_string(shape->vocab_size) + " rows");
  policy::shard_options shards;
  if (args.has("--max-shard-size")) {
    auto size = policy::parse_shard_size(args.get("--max-shard-size"));
    if (!size)
      return usage("--max-shard-size: " + size.error().message);
    shards.max_shard_bytes = *size;
  }
  const fs::path out = args.get("--out");
  if (non_empty_dir(out) && !args.has("--force"))
    return usage("--out " + out.string() + ": the directory is not empty (--force overwrites the model files in it)");
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    return usage("--out " + out.string() + ": exists and is not a directory");

  auto tok = policy::tokenizer::load(args.get("--tokenizer"));
  if (!tok)
    return fail_with(crucible::error{tok.error().code, "--tokenizer: " + tok.error().message},
                     tok.error().code == errc::io ? exit_failure : exit_usage);
  const auto tok_vocab = static_cast<std::int64_t>(tok->vocab_size());
  if (args.has("--vocab-size") && *vocab < tok_vocab)
    return usage("--vocab-size " + std::to_string(*vocab) + ": smaller than the tokenizer's " + std::to_string(tok_vocab) +
                 " tokens");

  policy::init_model_options options;
  options.dir = out;
  options.preset = preset;
  options.family = *family;
  options.vocab_size = args.has("--vocab-size") && published == nullptr ? *vocab : tok_vocab;
  options.seed = static_cast<std::uint64_t>(*seed);
  options.dtype = dtype;
  options.bos_token_id = tok->bos_id();
  if (auto eos = tok->eos_id())
    options.eos_token_ids = {*eos};
  options.pad_token_id = tok->pad_id();
  options.tokenizer = args.get("--tokenizer");
  options.shards = shards;
  auto config = policy::init_model(options);
  if (!config) {
    const auto code = config.error().code;
    return fail_with(config.error(), code == errc::io ? exit_failure : exit_usage);
  }
  auto weights = policy::safetensors_checkpoint::open(out);
  if (!weights)
    return fail_with(weights.error(), exit_failure);
  const auto files = weights->files().size();

  if (args.has("--json")) {
    json_writer w;
    w.begin_object()
      .field("out", out.string())
      .field("family", policy::to_string(config->family))
      .field("preset", preset)
      .field("dtype", dtype)
      .field("parameters", config->parameter_count())
      .field("vocab_size", config->vocab_size)
      .field("hidden_size", config->hidden_size)
      .field("layers", config->num_layers)
      .field("tie_word_embeddings", config->tie_word_embeddings)
      .field("weight_files", static_cast<std::uint64_t>(files))
      .field("seed", *seed)
      .end_object();
    std::printf("%s\n", w.str().c_str());
    return exit_ok;
  }
  std::printf("wrote %s: %s preset %s, %.2fM parameters (vocabulary %lld, hidden %lld, %lld layers), %s in %zu "
              "weight file%s, seed %lld\n",
              out.c_str(), policy::to_string(config->family), preset.c_str(),
              static_cast<double>(config->parameter_count()) / 1e6, static_cast<long long>(config->vocab_size),
              static_cast<long long>(config->hidden_size), static_cast<long long>(config->num_layers), dtype.c_str(),
              files, files == 1 ? "" : "s", static_cast<long long>(*seed));
  return exit_ok;
}

} // namespace

command init_model_command() {
  return {{"init-model", "--tokenizer DIR --out DIR [options]", "Write a randomly initialised model (Hugging Face format)",
           "Writes config.json and the safetensors weights of a fresh Llama or Qwen2 model, weights\n"
           "drawn from N(0, 0.02) with the given seed, plus the tokenizer's files, so that the directory\n"
           "is self-contained: crucible generate, the engine and transformers' from_pretrained load it.\n"
           "The vocabulary size and the bos/eos/pad ids come from the tokenizer. Presets:\n"
           "  tiny   hidden 128, 4 layers, 4 heads (2 KV)           ~0.8M + 128 x vocab parameters\n"
           "  small  hidden 512, 8 layers, 8 heads (2 KV)           ~23M + 512 x vocab\n"
           "  0.5b   Qwen2.5-0.5B's shapes: hidden 896, 24 layers   ~360M + 896 x vocab\n"
           "  qwen2.5-coder-1.5b-instruct  Qwen2.5-Coder-1.5B-Instruct's config: 1.54B parameters\n"
           "  qwen2.5-coder-7b-instruct    Qwen2.5-Coder-7B-Instruct's config: 7.62B (untied)\n"
           "The two published presets keep the published vocabulary (151936, 152064: the tokenizer\n"
           "must fit in it and have <|endoftext|>, <|im_start|>, <|im_end|>), and write Qwen2.5's chat\n"
           "template into tokenizer_config.json and the ids into generation_config.json. Weights over\n"
           "--max-shard-size go into model-0000K-of-0000N.safetensors with model.safetensors.index.json.\n"
           "  crucible init-model --preset tiny --tokenizer tok/ --out models/tiny",
           {},
           {{"--tokenizer", "DIR", "tokenizer directory (tokenizer.json) or tokenizer.json file"},
            {"--out", "DIR", "model directory to write (created; must be empty unless --force)"},
            {"--family", "NAME", "qwen2 (default) or llama (crucible's presets only)"},
            {"--preset", "NAME",
             "tiny (default), small, 0.5b, qwen2.5-coder-1.5b-instruct or qwen2.5-coder-7b-instruct"},
            {"--dtype", "TYPE", "weights' dtype on disk: bfloat16 (default), float16 or float32"},
            {"--seed", "S", "seed of the random weights (default 0)"},
            {"--vocab-size", "N", "embedding rows, at least the tokenizer's size (default: the tokenizer's; "
                                  "Qwen2.5 pads to 151936; the published presets keep theirs)"},
            {"--max-shard-size", "SIZE", "largest weights file before sharding, as transformers' max_shard_size: "
                                         "bytes or 500MB, 5GB, 2GiB (default 5GB)"},
            {"--force", "", "write into a non-empty directory, replacing the model and tokenizer files"},
            {"--json", "", "print a JSON summary"}}},
          run_init_model};
}

} // namespace crucible::cli
