// tests/unit/policy/test_weight_handoff.cpp: a learner's weights to an engine of the same process
// through memory (policy/distributed/weight_handoff): what is shared and what is copied, staged
// snapshots, the merged LoRA weights, and sampling that matches an engine loaded from a published
// directory.
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "policy/model/engine.hpp"
#include "policy/training/learner.hpp"
#include "policy/distributed/weight_handoff.hpp"
#include "tests/unit/policy/policy_test_util.hpp"

using namespace crucible;
using namespace crucible::policy;
using namespace crucible::policy::testing;

namespace {

// The weights an engine loaded from a published directory would hold: the learner's, with
// adapters merged.
std::map<std::string, torch::Tensor> published(CausalLMImpl& m) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : m.export_tensors())
    out[name] = t.detach().clone();
  return out;
}

double max_diff_to(CausalLMImpl& engine, const std::map<std::string, torch::Tensor>& expected) {
  double worst = 0;
  std::size_t seen = 0;
  for (const auto& item : engine.named_parameters(true)) {
    auto it = expected.find(item.key());
    REQUIRE_MESSAGE(it != expected.end(), item.key());
    worst = std::max(worst, max_abs_diff(item.value(), it->second.to(item.value().scalar_type())));
    ++seen;
  }
  CHECK(seen == expected.size());
  return worst;
}

const void* ptr(CausalLMImpl& m, const std::string& name) { return m.named_parameters(true)[name].data_ptr(); }

sft_example example() { return {{5, 6, 7, 8}, {9, 10, 11}}; }

result<step_metrics> train_once(learner& l) {
  auto ex = example();
  return l.sft_step(std::span<const sft_example>(&ex, 1));
}

} // namespace

TEST_CASE("weight handoff, full fine-tuning: the engine gets its own copy, changed only by install") {
  learner_options o;
  o.lr = 1e-2;
  auto l = learner::create(small_qwen2_model(11), CausalLM{nullptr}, o);
  REQUIRE(l.ok());
  auto& lm = (*l)->model();
  auto h = weight_handoff::create(lm, "float32", 7);
  REQUIRE(h.ok());
  auto& engine = *(*h)->engine_model();
  CHECK((*h)->installed_version() == 7);
  CHECK(max_diff_to(engine, published(lm)) == 0.0);
  const auto& st = (*h)->stats();
  CHECK(st.tensors_shared == 0); // every tensor trains
  CHECK(st.tensors_staged == st.tensors_own);
  CHECK(st.staged_bytes == st.own_bytes);
  CHECK(ptr(engine, "lm_head.weight") != ptr(lm, "lm_head.weight"));
  for (const auto& item : engine.named_parameters(true))
    CHECK_FALSE(item.value().requires_grad());

  const auto v7 = published(lm);
  REQUIRE(train_once(**l).ok());
  const auto v8 = published(lm);
  CHECK(max_diff_to(engine, v7) == 0.0); // nothing reaches the engine before a stage and an install
  REQUIRE((*h)->stage(8).ok());
  CHECK(max_diff_to(engine, v7) == 0.0); // staged, not installed
  // The learner goes on; the engine installs the snapshot staged at 8, not the live weights.
  REQUIRE(train_once(**l).ok());
  auto v = (*h)->install();
  REQUIRE(v.ok());
  CHECK(*v == 8);
  CHECK(max_diff_to(engine, v8) == 0.0);
  CHECK(max_diff_to(engine, published(lm)) > 0.0);
  // Installing again copies nothing new; staging an older version is refused.
  CHECK(*(*h)->install() == 8);
  auto old = (*h)->stage(5);
  REQUIRE_FALSE(old.ok());
  CHECK(old.error().message.find("older than the version staged (8)") != std::string::npos);
  REQUIRE((*h)->stage(9).ok());
  CHECK(*(*h)->install() == 9);
  CHECK(max_diff_to(engine, published(lm)) == 0.0);
}

TEST_CASE("weight handoff under LoRA: the frozen base is shared, adapted projections hold the merged weight") {
  for (bool tied : {false, true}) {
    CAPTURE(tied);
    learner_options o;
    o.lr = 1e-2;
    o.lora = true;
    o.lora_rank = 4;
    o.lora_targets = {"q_proj", "v_proj", "o_proj"};
    auto l = learner::create(small_qwen2_model(12, 64, tied), CausalLM{nullptr}, o, /*seed=*/3);
    REQUIRE(l.ok());
    auto& lm = (*l)->model();
    // B starts at zero: make the adapters matter before the handoff is built.
    REQUIRE(train_once(**l).ok());
    auto h = weight_handoff::create(lm, "float32", 1);
    REQUIRE(h.ok());
    auto& engine = *(*h)->engine_model();
    CHECK(max_diff_to(engine, published(lm)) == 0.0);
    CHECK_FALSE(engine.has_lora());
    // Shared: embeddings, norms, the MLP (no adapter there) and the output matrix.
    for (const char* name : {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.mlp.gate_proj.weight",
                             "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight",
                             "model.layers.0.input_layernorm.weight"}) {
      CAPTURE(name);
      CHECK(ptr(engine, name) == ptr(lm, name));
    }
    // k_proj has no adapter but decodes as one GEMM with q and v: owned with them, joined again.
    for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                             "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight"}) {
      CAPTURE(name);
      CHECK(ptr(engine, name) != ptr(lm, name));
    }
    auto params = engine.named_parameters(true);
    const auto& q = params["model.layers.0.self_attn.q_proj.weight"];
    const auto& k = params["model.layers.0.self_attn.k_proj.weight"];
    CHECK(static_cast<const char*>(k.data_ptr()) == static_cast<const char*>(q.data_ptr()) + q.numel() * q.element_size());
    const auto& st = (*h)->stats();
    CHECK(st.tensors_shared > 0);
    CHECK(st.tensors_staged == 2 * 3); // q, v, o of two layers
    CHECK(st.staged_bytes < st.own_bytes);

    REQUIRE(train_once(**l).ok());
    CHECK(max_diff_to(engine, published(lm)) > 0.0);
    REQUIRE((*h)->stage(2).ok());
    REQUIRE(*(*h)->install() == 2);
    CHECK(max_diff_to(engine, published(lm)) == 0.0);
  }
}

TEST_CASE("weight handoff in another dtype than the learner's shares nothing and converts") {
  learner_options o;
  o.lora = true;
  o.lora_rank = 4;
  auto l = learner::create(small_qwen2_model(13), CausalLM{nullptr}, o, 5);
  REQUIRE(l.ok());
  auto& lm = (*l)->model();
  REQUIRE(train_once(**l).ok());
  auto h = weight_handoff::create(lm, "bfloat16", 1);
  REQUIRE(h.ok());
  auto& engine = *(*h)->engine_model();
  CHECK((*h)->stats().tensors_shared == 0);
  for (const auto& item : engine.named_parameters(true))
    CHECK((item.value().scalar_type() == torch::kBFloat16));
  CHECK(max_diff_to(engine, published(lm)) == 0.0); // compared after the same rounding
  auto bad = weight_handoff::create(lm, "int8", 1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == errc::config);
  CHECK(bad.error().message.find("model.engine_dtype") != std::string::npos);
}

TEST_CASE("an engine over the handoff samples what an engine loaded from the published directory samples") {
  learner_options o;
  o.lr = 1e-2;
  o.lora = true;
  o.lora_rank = 4;
  auto l = learner::create(small_qwen2_model(14), CausalLM{nullptr}, o, 9);
  REQUIRE(l.ok());
  auto& lm = (*l)->model();
  auto h = weight_handoff::create(lm, "float32", 0);
  REQUIRE(h.ok());
  engine_options eo;
  engine in_memory((*h)->engine_model(), eo);
  for (int step = 1; step <= 2; ++step)
    REQUIRE(train_once(**l).ok());
  REQUIRE((*h)->stage(2).ok());
  REQUIRE(*(*h)->install() == 2);
  const auto dir = std::filesystem::temp_directory_path() / ("crucible_handoff_" + std::to_string(::getpid()));
  save_options so;
  so.dtype = torch::kFloat;
  REQUIRE(save_model(lm, dir, so).ok());
  eo.dtype = "float32";
  auto loaded = engine::load(dir, eo);
  REQUIRE(loaded.ok());
  sampling_options s;
  s.temperature = 0.9;
  s.max_new_tokens = 12;
  s.samples_per_prompt = 3;
  s.seed = 4;
  std::vector<std::vector<std::int32_t>> prompts{{3, 4, 5, 6}, {7, 8}};
  auto a = in_memory.generate(prompts, s);
  auto b = (*loaded)->generate(prompts, s);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->size() == b->size());
  for (std::size_t i = 0; i < a->size(); ++i) {
    CHECK((*a)[i].tokens == (*b)[i].tokens);
    REQUIRE((*a)[i].logprobs.size() == (*b)[i].logprobs.size());
    for (std::size_t t = 0; t < (*a)[i].logprobs.size(); ++t)
      CHECK((*a)[i].logprobs[t] == doctest::Approx((*b)[i].logprobs[t]).epsilon(1e-5));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("weight handoff on a named device: the learner's own shares as before, a name that is no device is refused") {
  learner_options o;
  o.lora = true;
  o.lora_rank = 4;
  auto l = learner::create(small_qwen2_model(15), CausalLM{nullptr}, o, 3);
  REQUIRE(l.ok());
  auto& lm = (*l)->model();
  auto implicit = weight_handoff::create(lm, "float32", 0);
  auto named = weight_handoff::create(lm, "float32", 0, "cpu");
  REQUIRE(implicit.ok());
  REQUIRE(named.ok());
  CHECK((*named)->stats().tensors_shared == (*implicit)->stats().tensors_shared);
  CHECK((*named)->stats().tensors_shared > 0); // the frozen base, as on the learner's device
  CHECK(ptr(*(*named)->engine_model(), "model.embed_tokens.weight") == ptr(lm, "model.embed_tokens.weight"));
  auto bad = weight_handoff::create(lm, "float32", 0, "gpu0");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == errc::config);
  CHECK(bad.error().message == "engine.devices: 'gpu0' is not a device (cpu, cuda:N)");
}

TEST_CASE("weight handoff: stages and installs from two threads never mix versions") {
  learner_options o;
  o.lr = 1e-2;
  auto l = learner::create(small_qwen2_model(15), CausalLM{nullptr}, o);
  REQUIRE(l.ok());
  auto& lm = (*l)->model();
  auto h = weight_handoff::create(lm, "float32", 0);
  REQUIRE(h.ok());
  // Each staged version v has every weight of the output matrix at v (set by hand), so a mixed
  // install would show two values.
  auto head = lm.named_parameters(true)["lm_head.weight"];
  std::atomic<bool> done{false};
  std::thread engine_thread([&] {
    auto target = (*h)->engine_model()->named_parameters(true)["lm_head.weight"];
    while (!done.load()) {
      auto v = (*h)->install();
      REQUIRE(v.ok());
      if (*v == 0)
        continue; // the initial weights, random
      auto lo = target.min().item<double>(), hi = target.max().item<double>();
      CHECK(lo == hi);
      CHECK(lo >= static_cast<double>(*v));
    }
  });
  for (std::uint64_t v = 1; v <= 200; ++v) {
    {
      torch::NoGradGuard no_grad;
      head.fill_(static_cast<double>(v));
    }
    REQUIRE((*h)->stage(v).ok());
  }
  done = true;
  engine_thread.join();
  CHECK(*(*h)->install() == 200);
  CHECK((*h)->engine_model()->named_parameters(true)["lm_head.weight"].max().item<double>() == 200.0);
}
