// tests/actors/scripted_policy.cpp: the scripted tokenizer and model (see the header).
#include "tests/actors/scripted_policy.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "text/bpe_trainer.hpp"
#include "policy/model/model_config.hpp"
#include "policy/model/safetensors.hpp"

namespace fs = std::filesystem;

namespace crucible::testing {

namespace {

constexpr double norm_eps = 1e-6;

// The factor the final RMSNorm leaves on a hidden state of ones: 1 / sqrt(1 + eps), in float32
// as the model computes it.
double norm_factor() {
  return static_cast<double>(1.0f / std::sqrt(1.0f + static_cast<float>(norm_eps)));
}

} // namespace

std::shared_ptr<const policy::tokenizer> scripted_tokenizer(const std::vector<std::string>& responses) {
  const fs::path src{CRUCIBLE_SOURCE_DIR};
  policy::bpe_train_options opts;
  opts.vocab_size = 700;
  for (const auto& r : responses)
    opts.special_tokens.push_back(r);
  policy::bpe_trainer trainer{opts};
  auto ok = trainer.validate();
  REQUIRE_MESSAGE(ok.ok(), (ok.ok() ? "" : ok.error().message));
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(src / "env/tasks/cpu"))
    if (e.path().extension() == ".py")
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  files.push_back(src / "configs/prompts/contrastive.yaml");
  for (const auto& f : files)
    REQUIRE(trainer.feed_file(f).ok());
  auto model = trainer.train();
  auto tok = policy::tokenizer::from_json(policy::tokenizer_json(model, opts), policy::tokenizer_config_json(model, opts));
  REQUIRE_MESSAGE(tok.ok(), (tok.ok() ? "" : tok.error().message));
  for (std::size_t i = 0; i < responses.size(); ++i)
    REQUIRE(tok->id_of(responses[i]) == response_id(i));
  return std::make_shared<const policy::tokenizer>(std::move(*tok));
}

void write_scripted_model(const fs::path& dir, std::int64_t vocab, const std::map<std::int32_t, double>& logits) {
  policy::model_config c;
  c.family = policy::model_family::llama;
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 16;
  c.max_position_embeddings = 32768;
  c.rms_norm_eps = norm_eps;
  c.tie_word_embeddings = false;
  c.eos_token_ids = {2};
  REQUIRE(c.validate().ok());
  const auto h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim, inter = c.intermediate_size;

  struct tensor {
    std::string name;
    std::vector<std::int64_t> shape;
    std::vector<float> data;
  };
  std::vector<tensor> ts;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, float fill) {
    std::int64_t n = 1;
    for (auto d : shape)
      n *= d;
    ts.push_back({std::move(name), std::move(shape), std::vector<float>(static_cast<std::size_t>(n), fill)});
    return &ts.back();
  };
  ts.reserve(16);
  // Every token embeds as ones; attention and MLP add nothing (o_proj, down_proj zero), so the
  // final hidden state is ones / sqrt(1 + eps) at every position.
  add("model.embed_tokens.weight", {vocab, h}, 1.0f);
  add("model.layers.0.input_layernorm.weight", {h}, 1.0f);
  add("model.layers.0.self_attn.q_proj.weight", {q, h}, 0.01f);
  add("model.layers.0.self_attn.k_proj.weight", {kv, h}, 0.01f);
  add("model.layers.0.self_attn.v_proj.weight", {kv, h}, 0.01f);
  add("model.layers.0.self_attn.o_proj.weight", {h, q}, 0.0f);
  add("model.layers.0.post_attention_layernorm.weight", {h}, 1.0f);
  add("model.layers.0.mlp.gate_proj.weight", {inter, h}, 0.01f);
  add("model.layers.0.mlp.up_proj.weight", {inter, h}, 0.01f);
  add("model.layers.0.mlp.down_proj.weight", {h, inter}, 0.0f);
  add("model.norm.weight", {h}, 1.0f);
  // Row t of the output projection is (logit_t / hidden) * ones: its dot product with the final
  // hidden state is logit_t times the norm's factor.
  auto* head = add("lm_head.weight", {vocab, h}, 0.0f);
  for (const auto& [token, logit] : logits) {
    REQUIRE(token >= 0);
    REQUIRE(token < vocab);
    for (std::int64_t j = 0; j < h; ++j)
      head->data[static_cast<std::size_t>(token * h + j)] = static_cast<float>(logit / static_cast<double>(h));
  }

  fs::create_directories(dir);
  std::vector<policy::tensor_view> views;
  for (const auto& t : ts)
    views.push_back({t.name, policy::st_dtype::f32, t.shape,
                     std::as_bytes(std::span<const float>(t.data.data(), t.data.size()))});
  auto written = policy::write_checkpoint_weights(dir, views);
  REQUIRE_MESSAGE(written.ok(), (written.ok() ? "" : written.error().message));
  auto json = policy::to_config_json(c, "float32");
  auto saved = write_file_atomic(dir / "config.json", json);
  REQUIRE_MESSAGE(saved.ok(), (saved.ok() ? "" : saved.error().message));
}

double scripted_log_prob(std::int64_t vocab, const std::map<std::int32_t, double>& logits, std::int32_t token) {
  const double f = norm_factor();
  double top = 0;
  for (const auto& [t, l] : logits)
    top = std::max(top, l * f);
  double sum = static_cast<double>(vocab - static_cast<std::int64_t>(logits.size())) * std::exp(-top);
  for (const auto& [t, l] : logits)
    sum += std::exp(l * f - top);
  auto it = logits.find(token);
  const double mine = it == logits.end() ? 0.0 : it->second * f;
  return mine - top - std::log(sum);
}

std::string scripted_response(const std::string& code) {
  return "### Performance Analysis\nThe reference makes one pass per operation.\n\n"
         "### Algorithm Design\nFuse the passes into one.\n\n"
         "### Code Implementation\n```python\n"
         + code + "```\n";
}

} // namespace crucible::testing
