// config.json of Llama and Qwen2: keys, defaults, RoPE variants (new and old layouts), errors
// naming the key, presets (those of published models with their values) and the written form read
// back; shard sizes.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "policy/model/model_config.hpp"

using namespace crucible;
using namespace crucible::policy;

namespace {

const char* qwen_json = R"({
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
  "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
  "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_scaling": null,
  "tie_word_embeddings": true, "use_sliding_window": false, "sliding_window": 32768,
  "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16", "hidden_act": "silu"})";

std::string error_of(const std::string& json) {
  auto c = parse_model_config(json, "m/config.json");
  REQUIRE_FALSE(c.ok());
  return c.error().message;
}

// qwen_json with `from` replaced by `to`.
std::string edit(std::string from, std::string to) {
  std::string s = qwen_json;
  auto pos = s.find(from);
  REQUIRE(pos != std::string::npos);
  return s.replace(pos, from.size(), to);
}

} // namespace

TEST_CASE("config.json: Qwen2.5-0.5B reads as written by transformers 4") {
  auto c = parse_model_config(qwen_json);
  REQUIRE_MESSAGE(c.ok(), c.error().message);
  CHECK(c->family == model_family::qwen2);
  CHECK(c->hidden_size == 896);
  CHECK(c->num_layers == 24);
  CHECK(c->num_heads == 14);
  CHECK(c->num_kv_heads == 2);
  CHECK(c->head_dim == 64);
  CHECK(c->intermediate_size == 4864);
  CHECK(c->rope.type == rope_type::standard);
  CHECK(c->rope.theta == 1e6);
  CHECK(c->rms_norm_eps == 1e-6);
  CHECK(c->tie_word_embeddings);
  CHECK(c->qkv_bias);
  CHECK_FALSE(c->o_bias);
  CHECK(c->eos_token_ids == std::vector<std::int64_t>{151643});
  CHECK(c->dtype == "bfloat16");
  CHECK(c->parameter_count() == 494032768); // Qwen2.5-0.5B's published count
}

TEST_CASE("config.json: Llama keys, transformers 5 rope_parameters and RoPE variants") {
  const char* llama = R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "attention_bias": false, "mlp_bias": false,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "max_position_embeddings": 131072, "eos_token_id": [128001, 128008, 128009]})";
  auto c = parse_model_config(llama);
  REQUIRE_MESSAGE(c.ok(), c.error().message);
  CHECK(c->family == model_family::llama);
  CHECK_FALSE(c->qkv_bias);
  CHECK_FALSE(c->tie_word_embeddings);
  CHECK(c->rope.type == rope_type::llama3);
  CHECK(c->rope.theta == 500000.0);
  CHECK(c->rope.factor == 32.0);
  CHECK(c->rope.original_max_position_embeddings == 8192);
  CHECK(c->eos_token_ids.size() == 3);
  CHECK(c->rms_norm_eps == 1e-6); // default

  auto yarn = parse_model_config(edit(R"("rope_scaling": null)",
                                      R"("rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192})"));
  REQUIRE_MESSAGE(yarn.ok(), yarn.error().message);
  CHECK(yarn->rope.type == rope_type::yarn);
  CHECK(yarn->rope.theta == 1e6); // the top-level rope_theta
  CHECK(yarn->rope.beta_fast == 32.0);
  CHECK_FALSE(yarn->rope.attention_factor.has_value());

  auto linear = parse_model_config(edit(R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "linear", "factor": 2})"));
  REQUIRE(linear.ok());
  CHECK(linear->rope.type == rope_type::linear);
  CHECK(linear->rope.factor == 2.0);

  auto llama_bias = parse_model_config(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "attention_bias": true})");
  REQUIRE(llama_bias.ok());
  CHECK(llama_bias->qkv_bias);
  CHECK(llama_bias->o_bias);
  CHECK(llama_bias->num_kv_heads == 2);
  CHECK(llama_bias->max_position_embeddings == 2048);
}

TEST_CASE("config.json: errors name the key at fault") {
  CHECK(error_of(edit(R"("hidden_size": 896,)", "")).find("hidden_size: missing") != std::string::npos);
  CHECK(error_of(edit(R"("hidden_size": 896)", R"("hidden_size": "896")")).find("hidden_size: expected an integer") !=
        std::string::npos);
  CHECK(error_of(edit(R"("model_type": "qwen2")", R"("model_type": "gpt2")")).find("model_type") != std::string::npos);
  CHECK(error_of(edit(R"("num_key_value_heads": 2)", R"("num_key_value_heads": 3)")).find("num_key_value_heads") !=
        std::string::npos);
  auto rope = error_of(edit(R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "longrope", "factor": 2.0})"));
  CHECK(rope.find("rope_scaling.rope_type") != std::string::npos);
  CHECK(rope.find("longrope") != std::string::npos);
  CHECK(error_of(edit(R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "linear"})")).find("rope_scaling.factor") !=
        std::string::npos);
  CHECK(error_of(edit(R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})"))
            .find("low_freq_factor") != std::string::npos);
  CHECK(error_of(edit(R"("use_sliding_window": false)", R"("use_sliding_window": true)")).find("use_sliding_window") !=
        std::string::npos);
  CHECK(error_of(edit(R"("hidden_act": "silu")", R"("hidden_act": "gelu")")).find("hidden_act") != std::string::npos);
  CHECK(error_of(edit(R"("tie_word_embeddings": true)", R"("tie_word_embeddings": 1)")).find("tie_word_embeddings") !=
        std::string::npos);
  CHECK(error_of("{not json").find("m/config.json") != std::string::npos);
  // Strict JSON, read as core's json_value: the syntax error's line and column, and the value a
  // key of the wrong type holds.
  CHECK(error_of("{\n  \"vocab_size\": 1,,\n}").rfind("m/config.json:2:19: not valid JSON: ", 0) == 0);
  CHECK(error_of("{\"model_type\": 'qwen2'}").find("not valid JSON") != std::string::npos);
  CHECK(error_of(edit(R"("hidden_size": 896)", R"("hidden_size": 896.5)")).find("hidden_size: expected an integer, got '896.5'") !=
        std::string::npos);
  CHECK(error_of(edit(R"("rms_norm_eps": 1e-06)", R"("rms_norm_eps": [1])")).find("rms_norm_eps: expected a number, got '[1]'") !=
        std::string::npos);
  CHECK(error_of(edit(R"("hidden_size": 896)", R"("hidden_size": 896, "hidden_size": 897)")).find("hidden_size: given twice") !=
        std::string::npos);
  CHECK(error_of(edit(R"("eos_token_id": 151643)", R"("eos_token_id": 999999)")).find("m/config.json: eos_token_id") !=
        std::string::npos);
}

TEST_CASE("config.json: what crucible writes reads back the same") {
  for (auto type : {rope_type::standard, rope_type::linear, rope_type::dynamic, rope_type::llama3, rope_type::yarn}) {
    auto c = preset_config("tiny", model_family::llama, 300);
    REQUIRE(c.ok());
    c->rope.type = type;
    c->rope.factor = 4.0;
    c->rope.original_max_position_embeddings = 1024;
    c->eos_token_ids = {1, 2};
    c->bos_token_id = 0;
    auto back = parse_model_config(to_config_json(*c, "float32"));
    REQUIRE_MESSAGE(back.ok(), back.error().message);
    CHECK(back->rope.type == type);
    CHECK(back->rope.theta == c->rope.theta);
    CHECK(back->hidden_size == c->hidden_size);
    CHECK(back->tie_word_embeddings == c->tie_word_embeddings);
    CHECK(back->eos_token_ids == c->eos_token_ids);
    CHECK(back->bos_token_id == c->bos_token_id);
    CHECK_FALSE(back->pad_token_id.has_value());
    CHECK(back->dtype == "float32");
    if (type != rope_type::standard)
      CHECK(back->rope.factor == 4.0);
  }
}

TEST_CASE("presets: tiny, small and 0.5b for both families") {
  auto half = preset_config("0.5b", model_family::qwen2, 151936);
  REQUIRE(half.ok());
  CHECK(half->parameter_count() == 494032768);
  auto tiny = preset_config("tiny", model_family::qwen2, 512);
  REQUIRE(tiny.ok());
  CHECK(tiny->parameter_count() > 500'000);
  CHECK(tiny->parameter_count() < 5'000'000);
  auto small = preset_config("small", model_family::llama, 32000);
  REQUIRE(small.ok());
  CHECK(small->parameter_count() > 30'000'000);
  CHECK(small->parameter_count() < 100'000'000);
  CHECK_FALSE(small->qkv_bias);
  auto unknown = preset_config("huge", model_family::llama, 32000);
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message.find("huge") != std::string::npos);
}

TEST_CASE("presets: Qwen2.5-Coder-1.5B-Instruct and -7B-Instruct have their published config.json values") {
  // The published values (policy/model/model_config.cpp names the sources): hidden_size,
  // intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, rope_theta,
  // rms_norm_eps, max_position_embeddings, vocab_size, tie_word_embeddings; qwen2 (q/k/v bias).
  struct published_values {
    const char* preset;
    std::int64_t hidden, intermediate, layers, heads, kv_heads, max_positions, vocab;
    bool tied;
    std::int64_t parameters; // Qwen2.5-1.5B's 1,543,714,304 and Qwen2.5-7B's 7,615,616,512
  };
  const published_values expected[] = {
    {"qwen2.5-coder-1.5b-instruct", 1536, 8960, 28, 12, 2, 32768, 151936, true, 1'543'714'304},
    {"qwen2.5-coder-7b-instruct", 3584, 18944, 28, 28, 4, 32768, 152064, false, 7'615'616'512},
  };
  REQUIRE(published_models().size() == 2);
  for (const auto& e : expected) {
    CAPTURE(e.preset);
    // The tokenizer's size (here 2048) only has to fit: the table keeps the published rows.
    auto c = preset_config(e.preset, model_family::qwen2, 2048);
    REQUIRE_MESSAGE(c.ok(), c.error().message);
    CHECK(c->family == model_family::qwen2);
    CHECK(c->hidden_size == e.hidden);
    CHECK(c->intermediate_size == e.intermediate);
    CHECK(c->num_layers == e.layers);
    CHECK(c->num_heads == e.heads);
    CHECK(c->num_kv_heads == e.kv_heads);
    CHECK(c->head_dim == 128);
    CHECK(c->max_position_embeddings == e.max_positions);
    CHECK(c->vocab_size == e.vocab);
    CHECK(c->tie_word_embeddings == e.tied);
    CHECK(c->qkv_bias);
    CHECK_FALSE(c->o_bias);
    CHECK_FALSE(c->mlp_bias);
    CHECK(c->rope.type == rope_type::standard);
    CHECK(c->rope.theta == 1000000.0);
    CHECK(c->rms_norm_eps == 1e-6);
    CHECK(c->parameter_count() == e.parameters);
    // Written and read back as config.json, as transformers would read it.
    auto back = parse_model_config(to_config_json(*c, "bfloat16"));
    REQUIRE_MESSAGE(back.ok(), back.error().message);
    CHECK(back->vocab_size == e.vocab);
    CHECK(back->tie_word_embeddings == e.tied);
    CHECK(back->parameter_count() == e.parameters);
    const auto* m = find_published_model(e.preset);
    REQUIRE(m != nullptr);
    CHECK(m->end_of_turn == "<|im_end|>");
    // The published vocabulary is a ceiling for the tokenizer, and the family is fixed.
    auto big = preset_config(e.preset, model_family::qwen2, e.vocab + 1);
    REQUIRE_FALSE(big.ok());
    CHECK(big.error().message.find("published vocabulary of " + std::to_string(e.vocab)) != std::string::npos);
    auto llama = preset_config(e.preset, model_family::llama, 2048);
    REQUIRE_FALSE(llama.ok());
    CHECK(llama.error().message.find("is a qwen2 model") != std::string::npos);
  }
  CHECK(find_published_model("0.5b") == nullptr);
  auto unknown = preset_config("huge", model_family::qwen2, 32000);
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message.find("qwen2.5-coder-7b-instruct") != std::string::npos);
}

TEST_CASE("presets: the Qwen2.5 chat template is the text test_jinja renders as transformers does") {
  std::ifstream in(std::filesystem::path{CRUCIBLE_SOURCE_DIR} / "tests/unit/jinja/chat_templates/qwen2.5.jinja",
                   std::ios::binary);
  REQUIRE(in);
  const std::string file{std::istreambuf_iterator<char>(in), {}};
  for (const auto& m : published_models())
    CHECK(m.chat_template == file);
}

TEST_CASE("shard sizes parse as transformers' max_shard_size") {
  const std::pair<const char*, std::uint64_t> good[] = {
    {"5GB", 5'000'000'000ull}, {"500MB", 500'000'000ull}, {"40kb", 40'000ull}, {"1.5GB", 1'500'000'000ull},
    {"2GiB", 2147483648ull},   {"1MiB", 1048576ull},      {"123", 123ull},      {"1TB", 1'000'000'000'000ull},
  };
  for (const auto& [text, bytes] : good) {
    CAPTURE(text);
    auto r = parse_shard_size(text);
    REQUIRE_MESSAGE(r.ok(), r.error().message);
    CHECK(*r == bytes);
  }
  for (const char* text : {"", "GB", "5 GB", "5XB", "0", "0MB", "1.2.3GB", "-5GB"}) {
    CAPTURE(text);
    auto r = parse_shard_size(text);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("shard size '" + std::string{text} + "'") != std::string::npos);
  }
}
