// config.json of Llama and Qwen2: keys, defaults, RoPE variants (new and old layouts), errors
// naming the key, presets and the written form read back.
#include <doctest/doctest.h>

#include <string>

#include "policy/model_config.hpp"

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
