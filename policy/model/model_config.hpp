// policy/model/model_config.hpp: the `config.json` of Llama and Qwen2 models, read and written in
// Hugging Face's format, plus named presets for fresh models. No torch types.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "policy/model/safetensors.hpp"

namespace crucible::policy {

/// The model families crucible implements (config.json's "model_type").
enum class model_family : std::uint8_t { llama, qwen2 };

/// "llama", "qwen2".
const char* to_string(model_family f) noexcept;
/// Parses "llama" or "qwen2"; errc::unsupported naming the value otherwise.
result<model_family> parse_model_family(std::string_view name);

/// RoPE frequency variants ("rope_type"), computed exactly as transformers does.
enum class rope_type : std::uint8_t {
  standard, ///< "default": inv_freq = theta^(-2i/d)
  linear,   ///< positions divided by `factor`
  dynamic,  ///< NTK-aware: theta grows with the sequence once it passes max_position_embeddings
  llama3,   ///< Llama 3.1: low frequencies divided by `factor`, a smooth band between
  yarn,     ///< YaRN: ramp between interpolation and extrapolation, cos/sin scaled by mscale
};

/// "default", "linear", "dynamic", "llama3", "yarn".
const char* to_string(rope_type t) noexcept;

/// RoPE parameters (config.json's "rope_parameters", or the older "rope_theta" and
/// "rope_scaling"). Fields not used by `type` are ignored.
struct rope_options {
  rope_type type = rope_type::standard;
  double theta = 10000.0;
  double factor = 1.0;                          ///< linear, dynamic, llama3, yarn
  double low_freq_factor = 1.0;                 ///< llama3
  double high_freq_factor = 4.0;                ///< llama3
  std::int64_t original_max_position_embeddings = 0; ///< llama3, yarn; 0: max_position_embeddings
  std::optional<double> attention_factor;       ///< yarn; default from factor (and mscale)
  double beta_fast = 32.0;                      ///< yarn
  double beta_slow = 1.0;                       ///< yarn
  std::optional<double> mscale;                 ///< yarn
  std::optional<double> mscale_all_dim;         ///< yarn
  bool truncate = true;                         ///< yarn: round the correction range
};

/// The architecture of a decoder-only Llama/Qwen2 model. Plain value; check with validate().
struct model_config {
  model_family family = model_family::qwen2;
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_layers = 0;          ///< "num_hidden_layers"
  std::int64_t num_heads = 0;           ///< "num_attention_heads"
  std::int64_t num_kv_heads = 0;        ///< "num_key_value_heads" (grouped-query attention)
  std::int64_t head_dim = 0;            ///< "head_dim"; hidden_size / num_heads when absent
  std::int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  rope_options rope;
  bool tie_word_embeddings = false;     ///< lm_head shares embed_tokens' weight
  bool qkv_bias = false;                ///< q/k/v projections have a bias (always in Qwen2)
  bool o_bias = false;                  ///< o_proj has a bias (Llama's attention_bias)
  bool mlp_bias = false;                ///< Llama's mlp_bias
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids; ///< "eos_token_id": one id or a list
  std::optional<std::int64_t> pad_token_id;
  std::string dtype;                    ///< "dtype"/"torch_dtype" as stored, e.g. "bfloat16" ("" if absent)

  /// Checks sizes and their relations (heads divide, head_dim even, rope fields). errc::config
  /// naming the key.
  result<void> validate() const;
  /// Parameters in the model (embeddings counted once when tied).
  std::int64_t parameter_count() const;
};

/// Parses a config.json document. `origin` names it in errors ("DIR/config.json: key: ...").
/// Missing sizes, wrong types, an unknown model_type or rope_type, and features crucible does
/// not implement (sliding window, partial rotary, activations other than silu) are errors
/// that name the key.
result<model_config> parse_model_config(std::string_view json, std::string_view origin = "config.json");

/// Reads `path`, a config.json or a model directory holding one.
result<model_config> read_model_config(const std::filesystem::path& path);

/// The config.json transformers writes for this model: "rope_parameters" (transformers 5)
/// together with "rope_theta" and "rope_scaling" (transformers 4), "architectures", sizes,
/// token ids, and "dtype"/"torch_dtype" set to `dtype` ("bfloat16", "float32", "float16").
std::string to_config_json(const model_config& config, std::string_view dtype);

/// Named architectures for fresh models. crucible's own, for a given vocabulary size:
///   "tiny"  hidden 128, 4 layers, 4 heads (2 KV), intermediate 384: ~0.8M + vocab*128 parameters
///   "small" hidden 512, 8 layers, 8 heads (2 KV), intermediate 1408: ~23M + vocab*512
///   "0.5b"  Qwen2.5-0.5B: hidden 896, 24 layers, 14 heads (2 KV), intermediate 4864, RoPE theta
///           1e6 (~360M + vocab*896; 494M with its vocabulary of 151936)
/// These tie embeddings; Qwen2 presets have qkv bias, Llama ones none. Besides, one preset per
/// published_models() entry, whose config.json values it copies exactly, vocabulary and tied or
/// untied embeddings included: `vocab_size` (the tokenizer's) must then fit in the published
/// vocabulary, and `family` must be the model's. errc::config naming the preset when unknown,
/// and naming the conflict otherwise.
result<model_config> preset_config(std::string_view preset, model_family family, std::int64_t vocab_size);

/// A published model that a preset reproduces: where its config.json is published, and the
/// chat format of its tokenizer files, which init_model writes beside random weights.
struct published_model {
  std::string_view preset;        ///< "qwen2.5-coder-7b-instruct"
  std::string_view repository;    ///< its Hugging Face repository, "Qwen/Qwen2.5-Coder-7B-Instruct"
  std::string_view chat_template; ///< tokenizer_config.json's "chat_template"
  std::string_view end_of_text;   ///< bos_token_id, pad_token_id and the last eos id: "<|endoftext|>"
  std::string_view end_of_turn;   ///< eos_token_id: "<|im_end|>"
  std::string_view turn_start;    ///< another token the template writes: "<|im_start|>"
};

/// The published models that presets reproduce: Qwen2.5-Coder-1.5B-Instruct and -7B-Instruct.
std::span<const published_model> published_models();
/// The published model `preset` reproduces, or nullptr for crucible's own presets.
const published_model* find_published_model(std::string_view preset);

/// What init_model writes.
struct init_model_options {
  std::filesystem::path dir;        ///< created if missing; config.json and weights written inside
  std::string preset = "tiny";      ///< see preset_config
  model_family family = model_family::qwen2;
  std::int64_t vocab_size = 0;      ///< required; usually the tokenizer's size
  std::uint64_t seed = 0;           ///< weights ~ N(0, 0.02) from this seed, norms 1, biases 0
  std::string dtype = "bfloat16";   ///< "bfloat16", "float16" or "float32"
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;
  std::optional<std::int64_t> pad_token_id;
  /// A tokenizer directory (tokenizer.json, tokenizer_config.json, ...) or tokenizer.json file
  /// whose files are copied into `dir`; empty: the caller puts them there. A published preset
  /// reads the tokenizer there: its ids of the published model's special tokens replace the
  /// three ids above, its tokenizer_config.json gets the published chat template, and
  /// generation_config.json is written with the ids.
  std::filesystem::path tokenizer;
  /// The architecture written in place of the preset's, which still decides the tokenizer
  /// files (tests of a published preset's path at small sizes). Its vocab_size is kept.
  std::optional<model_config> config;
  /// How the weights are split into files (5 GB shards by default).
  shard_options shards;
};

/// Writes a randomly initialised model of a preset as an HF directory that transformers loads
/// (for `crucible init-model`). Implemented in model.cpp; callers need no torch headers.
result<model_config> init_model(const init_model_options& options);

/// The files of a model directory, beside config.json and the weights, that its tokenizer and
/// generation settings live in (the names transformers reads).
inline constexpr const char* model_side_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                                   "generation_config.json", "chat_template.jinja", "vocab.json",
                                                   "merges.txt", "added_tokens.json", "crucible_prompt.json"};

/// The file beside a checkpoint's weights that says how the run that trained it wrote its
/// prompts: {"chat_template": "auto" | "none"} (prompt.chat_template). `crucible serve-policy`
/// follows it, so that a model trained on plain-text prompts is not served through a chat
/// template it never saw.
inline constexpr const char* prompt_format_file = "crucible_prompt.json";

/// Copies the model_side_files present in directory `from` into `to` (each written atomically).
/// `tokenizer_json`, when given, is copied as tokenizer.json in place of `from`'s.
result<void> copy_model_side_files(const std::filesystem::path& from, const std::filesystem::path& to,
                                   const std::filesystem::path& tokenizer_json = {});

} // namespace crucible::policy
