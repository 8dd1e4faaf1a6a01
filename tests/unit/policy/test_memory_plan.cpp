// The GPU memory plan: every item of a tiny shape computed by hand (full fine-tuning with and
// without checkpointing, LoRA, ZeRO-1), the published shapes' sizes, refusals naming the option,
// and the Markdown tables.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "policy/memory_plan.hpp"

using namespace crucible;
using namespace crucible::policy;

namespace {

// vocab 1000, hidden 64, intermediate 128, 2 layers, 4 heads of 16 (2 KV), untied, q/k/v biases.
// Per layer: q 4096 + k 2048 + v 2048 + o 4096 + biases 128 + MLP 3 x 8192 + norms 128 = 37120;
// P = 2 x 37120 + 64 (final norm) + 2 x 64000 (embedding, output) = 202304.
model_config tiny_shape() {
  model_config c;
  c.family = model_family::qwen2;
  c.vocab_size = 1000;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 4096;
  c.tie_word_embeddings = false;
  c.qkv_bias = true;
  return c;
}

// Prompt 6 + completion 4: 9 learner inputs a sequence, 2 a micro-batch of 20 tokens (T = 18,
// C = 8 completion tokens); log-prob chunks of 4; the engine samples 4 rows of 10 slots in groups of
// 2, prefilling both prompts at once (12 tokens <= 12). No runtime allowances: the sums are exact.
memory_plan_options tiny_options() {
  memory_plan_options o;
  o.model = tiny_shape();
  o.label = "tiny";
  o.activation_checkpointing = false;
  o.prompt_tokens = 6;
  o.completion_tokens = 4;
  o.micro_batch_tokens = 20;
  o.log_prob_chunk = 4;
  o.group_size = 2;
  o.engine_rows = 4;
  o.max_prefill_tokens = 12;
  o.runtime_gb = 0;
  o.nccl_gb = 0;
  o.bucket_mb = 0.1; // 26214 float32 elements: the largest bucket is the 64000-element embedding
  return o;
}

double item(const memory_plan& p, const std::string& prefix) {
  for (const auto& i : p.items)
    if (i.name.rfind(prefix, 0) == 0)
      return i.bytes;
  FAIL("no item starting with ", prefix);
  return -1;
}

bool has_item(const memory_plan& p, const std::string& prefix) {
  for (const auto& i : p.items)
    if (i.name.rfind(prefix, 0) == 0)
      return true;
  return false;
}

} // namespace

TEST_CASE("memory plan: full fine-tuning of a tiny shape, every item by hand") {
  auto p = plan_memory(tiny_options());
  REQUIRE(p.ok());
  CHECK(p->parameters == 202304);
  CHECK(p->trainable == 202304);
  CHECK(p->micro_batch_rows == 2);
  CHECK(p->micro_batch_tokens == 18);
  // Learner state: bf16 weights, float32 masters, two float32 moments, float32 gradients.
  CHECK(item(*p, "weights") == 404608);
  CHECK(item(*p, "float32 master weights") == 809216);
  CHECK(item(*p, "AdamW moments") == 1618432);
  CHECK(item(*p, "float32 gradients") == 809216);
  CHECK_FALSE(has_item(*p, "data-parallel"));
  CHECK(p->learner_state == 3641472);
  // a = 2 (4 x 64 + 3 x 64 + 2 x 32 + 3 x 128) + 4 x 4 + 2 x 2 x 16 = 1872 bytes per token per layer.
  CHECK(item(*p, "saved activations") == 18 * (2 * 1872 + 128));
  CHECK(item(*p, "one layer's backward") == 18 * 1872);
  CHECK(item(*p, "log-probs: completion") == 2 * 8 * 64 * 2);
  CHECK(item(*p, "log-probs: one chunk") == 4 * (1000 + 64) * 2);
  CHECK(item(*p, "log-probs: output weight") == 6 * 1000 * 64);
  CHECK(item(*p, "phase: backward start") == 69696 + (2048 + 8512 + 384000));
  // The bf16 gradients are added into the float32 ones in place, without a float32 temporary.
  CHECK(item(*p, "phase: backward end") == 2 * 202304);
  CHECK(item(*p, "phase: optimizer step") == 8 * 64000);
  CHECK(p->learner_peak == 512000); // the optimizer step
  // Engine: its own bf16 copy, 4 x 10 x (2 layers x 2 x 32 x 2 B) of cache, decoding's logits
  // (3 x 4 x 1000 x 4 = 48000) over prefill (12 x 256 + 4 x 6 x 64 + 12 x 768 x 2 = 23040).
  CHECK(item(*p, "engine weights") == 404608);
  CHECK(item(*p, "handoff staging (every weight)") == 404608);
  CHECK(item(*p, "KV cache") == 10240);
  CHECK(item(*p, "engine working set (decoding)") == 48000);
  CHECK(p->engine == 462848 + 404608);
  CHECK(p->runtime == 0);
  CHECK(p->total == 3641472 + 512000 + 867456);
  CHECK(p->fits);

  auto small = tiny_options();
  small.gpu_gb = 0.004;
  auto tight = plan_memory(small);
  REQUIRE(tight.ok());
  CHECK_FALSE(tight->fits);
  CHECK(tight->capacity == doctest::Approx(4e6));
}

TEST_CASE("memory plan: an evaluator on the policy's GPU adds its workers' contexts and its evaluations") {
  auto o = tiny_options();
  auto without = plan_memory(o);
  REQUIRE(without.ok());
  CHECK(without->evaluator == 0);
  CHECK_FALSE(has_item(*without, "workers' CUDA contexts"));
  o.evaluator_evaluations = 2;
  o.evaluator_warm_workers = 3;
  o.evaluator_context_gb = 0.5;
  o.evaluator_evaluation_gb = 4;
  auto with = plan_memory(o);
  REQUIRE(with.ok());
  CHECK(item(*with, "workers' CUDA contexts (5)") == doctest::Approx(2.5e9));
  CHECK(item(*with, "evaluations in flight (2)") == doctest::Approx(8e9));
  CHECK(with->evaluator == doctest::Approx(10.5e9));
  CHECK(with->total == doctest::Approx(without->total + 10.5e9));
  CHECK(memory_plan_markdown(*with).find(" + evaluator 10.50") != std::string::npos);
  o.evaluator_warm_workers = -1;
  auto bad = plan_memory(o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("evaluator_warm_workers") != std::string::npos);
}

TEST_CASE("memory plan: an engine on a GPU of its own is planned apart, its staging with it") {
  auto o = tiny_options();
  o.engine_here = false;
  o.engine_gpus = 1;
  o.runtime_gb = 0.001; // the engine's GPU is charged a runtime allowance of its own
  auto p = plan_memory(o);
  REQUIRE(p.ok());
  // Listed, not summed: the engine's weights, KV cache and working set are on its GPU.
  CHECK(item(*p, "engine weights on the engine's GPU") == 404608);
  CHECK(item(*p, "KV cache on the engine's GPU") == 10240);
  CHECK(item(*p, "engine working set (decoding) on the engine's GPU") == 48000);
  CHECK(item(*p, "handoff staging (every weight) on the engine's GPU") == 404608);
  CHECK(p->engine == 0);
  CHECK(p->total == doctest::Approx(3641472 + 512000 + 1e6));
  CHECK(p->engine_gpu == doctest::Approx(2 * 404608 + 10240 + 48000 + 1e6));
  const auto md = memory_plan_markdown(*p);
  CHECK(md.find("*engine weights on the engine's GPU* (not summed)") != std::string::npos);
  CHECK(md.find("The engine's GPU (engine.devices, 1 apart from the learner's): ") != std::string::npos);
  // An evaluator listed on the engine's GPU counts there, not here.
  auto shared = o;
  shared.engine_gpu_evaluations = 2;
  shared.engine_gpu_warm_workers = 1;
  shared.evaluator_context_gb = 0.5;
  shared.evaluator_evaluation_gb = 4;
  auto with_eval = plan_memory(shared);
  REQUIRE(with_eval.ok());
  CHECK(item(*with_eval, "an evaluator on an engine's GPU (3 workers)") == doctest::Approx(1.5e9 + 8e9));
  CHECK(with_eval->engine_gpu == doctest::Approx(p->engine_gpu + 9.5e9));
  CHECK(with_eval->total == doctest::Approx(p->total));
  // Under LoRA on another GPU the engine cannot read the learner's base: it holds every weight.
  auto lora = o;
  lora.lora = true;
  auto l = plan_memory(lora);
  REQUIRE(l.ok());
  CHECK(item(*l, "engine weights on the engine's GPU") == 404608);
  CHECK(l->engine_gpu == doctest::Approx(p->engine_gpu - 404608 + item(*l, "handoff staging (merged adapted projections) on the engine's GPU")));
  o.engine_here = true;
  o.engine_gpus = 0;
  auto here = plan_memory(o);
  REQUIRE(here.ok());
  CHECK(here->engine_gpu == 0);
  CHECK(here->engine == 404608 + 404608 + 10240 + 48000);
  // An engine beside the learner and two apart: this GPU sums its engine, each other GPU holds
  // the same items again (no runtime or evaluator of this GPU's).
  o.engine_gpus = 2;
  auto both = plan_memory(o);
  REQUIRE(both.ok());
  CHECK(both->engine == here->engine);
  CHECK(both->total == doctest::Approx(here->total));
  CHECK(both->engine_gpu == doctest::Approx(p->engine_gpu));
  CHECK(memory_plan_markdown(*both).find("Each engine's GPU (engine.devices, 2 apart from the learner's): ") !=
        std::string::npos);
  // Under LoRA the engine beside the learner reads its base; the ones apart hold every weight.
  o.lora = true;
  auto lora_both = plan_memory(o);
  REQUIRE(lora_both.ok());
  CHECK(lora_both->engine_gpu - lora_both->engine ==
        doctest::Approx(404608 - item(*lora_both, "engine weights (merged adapted projections; base shared)") + 1e6));
  CHECK(lora_both->engine_gpu == doctest::Approx(l->engine_gpu));
}

TEST_CASE("memory plan: activation checkpointing keeps each layer's input") {
  auto o = tiny_options();
  o.activation_checkpointing = true;
  auto p = plan_memory(o);
  REQUIRE(p.ok());
  CHECK(item(*p, "saved activations") == 18 * (2 * 128 + 128));
  CHECK(item(*p, "one layer's backward") == 2 * 18 * 1872);
  CHECK(item(*p, "phase: backward start") == 6912 + 394560);
  CHECK(p->learner_peak == 512000);
}

TEST_CASE("memory plan: LoRA trains adapters and the engine shares the base") {
  auto o = tiny_options();
  o.lora = true;
  o.lora_rank = 2;
  o.lora_targets = {"q_proj", "v_proj"};
  auto p = plan_memory(o);
  REQUIRE(p.ok());
  // q: 2 x (64 + 64), v: 2 x (64 + 32), two layers.
  CHECK(p->trainable == 896);
  CHECK(item(*p, "weights") == 404608);
  CHECK(item(*p, "LoRA adapters") == 1792);
  CHECK(item(*p, "float32 master weights") == 3584);
  CHECK(item(*p, "AdamW moments") == 7168);
  CHECK(item(*p, "float32 gradients") == 3584);
  CHECK(p->learner_state == 420736);
  // Each adapter keeps its rank-2 intermediate: a = 1872 + 2 x 2 x 2; the output weight is frozen.
  CHECK(item(*p, "saved activations") == 18 * (2 * 1880 + 128));
  CHECK_FALSE(has_item(*p, "log-probs: output weight"));
  CHECK(p->learner_peak == 69984 + 33840);
  // Merged q and v with their biases: 2 x (64 x 64 + 64 + 64 x 32 + 32) elements.
  CHECK(item(*p, "engine weights") == 2 * 12480);
  CHECK(item(*p, "handoff staging (merged adapted projections)") == 2 * 12480);
  CHECK(p->total == 420736 + 103824 + (24960 + 24960 + 10240 + 48000));

  o.engine_shares_base = false;
  auto own = plan_memory(o);
  REQUIRE(own.ok());
  CHECK(item(*own, "engine weights") == 404608);
}

TEST_CASE("memory plan: data parallel and ZeRO-1 over two GPUs") {
  auto o = tiny_options();
  o.gpus = 2;
  auto dp = plan_memory(o);
  REQUIRE(dp.ok());
  // The float32 gradients are accumulated in the buckets themselves: one copy, as on one GPU.
  CHECK(item(*dp, "float32 gradients (accumulated in the data-parallel buckets)") == 809216);
  CHECK_FALSE(has_item(*dp, "data-parallel gradient buckets"));
  CHECK(dp->learner_state == 3641472);
  // The hooks add each bf16 gradient into its bucket as it completes: only the largest is held.
  CHECK(item(*dp, "phase: backward end") == 2 * 64000);
  o.zero1 = true;
  auto z = plan_memory(o);
  REQUIRE(z.ok());
  CHECK(item(*z, "float32 master weights (ZeRO-1 shard)") == 404608);
  CHECK(item(*z, "AdamW moments (ZeRO-1 shard)") == 809216);
  CHECK(item(*z, "float32 gradients (accumulated in the data-parallel buckets)") == 809216);
  // The reduce-scatter runs in place: no shard of its own.
  CHECK_FALSE(has_item(*z, "ZeRO-1 reduced gradient shard"));
  CHECK(z->learner_state == 404608 + 404608 + 809216 + 809216);
  // The step: 8 x 32000 (the embedding's shard) + 2 x 2 x (64000 + 32000) of the all-gather.
  CHECK(item(*z, "phase: optimizer step") == 640000);
  o.nccl_gb = 0.5;
  auto nccl = plan_memory(o);
  REQUIRE(nccl.ok());
  CHECK(nccl->runtime == doctest::Approx(0.5e9));
}

TEST_CASE("memory plan: the published shapes") {
  auto m7 = memory_plan_model("7b");
  REQUIRE(m7.ok());
  CHECK(m7->parameter_count() == 7615616512);
  memory_plan_options o;
  o.model = *m7;
  auto p = plan_memory(o);
  REQUIRE(p.ok());
  CHECK(item(*p, "weights") == doctest::Approx(15.23e9).epsilon(0.001)); // bf16 weights of 7.6B
  // KV cache: 8 rows x 6144 slots x 28 layers x 2 x 512 x 2 bytes.
  CHECK(item(*p, "KV cache") == 8.0 * 6144 * 28 * 2 * 512 * 2);
  CHECK_FALSE(p->fits); // full fine-tuning of 7B on one 80 GB GPU
  o.lora = true;
  auto lora = plan_memory(o);
  REQUIRE(lora.ok());
  CHECK(lora->trainable == 10092544); // rank 16 on q, k, v, o: 28 x 16 x 22528
  o.gpu_gb = 141;
  CHECK(plan_memory(o)->fits);

  auto m15 = memory_plan_model("qwen2.5-coder-1.5b-instruct");
  REQUIRE(m15.ok());
  CHECK(m15->tie_word_embeddings);
  CHECK(m15->parameter_count() == 1543714304);
  auto m14 = memory_plan_model("14b");
  REQUIRE(m14.ok());
  CHECK(m14->parameter_count() == doctest::Approx(14.77e9).epsilon(0.001));
  auto m32 = memory_plan_model("32b");
  REQUIRE(m32.ok());
  CHECK(m32->parameter_count() == 32763876352);
  CHECK(m32->num_kv_heads == 8);
  CHECK(memory_plan_model_names().size() == 4);
  auto unknown = memory_plan_model("70b");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message.find("1.5b, 7b, 14b, 32b") != std::string::npos);
}

TEST_CASE("memory plan: refusals name the option") {
  auto refused = [](memory_plan_options o) {
    auto p = plan_memory(o);
    REQUIRE_FALSE(p.ok());
    CHECK(p.error().code == errc::config);
    return p.error().message;
  };
  auto o = tiny_options();
  o.zero1 = true;
  CHECK(refused(o).find("zero1") == 0);
  o = tiny_options();
  o.learner_bytes = 3;
  CHECK(refused(o).find("learner_bytes") == 0);
  o = tiny_options();
  o.lora = true;
  o.lora_targets = {"qkv"};
  CHECK(refused(o).find("lora_targets: 'qkv'") == 0);
  o = tiny_options();
  o.prompt_tokens = 0;
  CHECK(refused(o).find("prompt_tokens") == 0);
  o = tiny_options();
  o.model.num_kv_heads = 3;
  CHECK(refused(o).find("model: ") == 0);
}

TEST_CASE("memory plan: Markdown of one plan and of a grid") {
  auto p = plan_memory(tiny_options());
  REQUIRE(p.ok());
  auto md = memory_plan_markdown(*p);
  CHECK(md.find("**tiny**, full fine-tuning, 1 GPU of 80 GB") == 0);
  CHECK(md.find("| learner state | AdamW moments | 0.00 |") != std::string::npos);
  CHECK(md.find("*phase: backward end (bf16 gradients)* (not summed)") != std::string::npos);
  CHECK(md.find("| **total** | per GPU | **0.01** |") != std::string::npos);
  CHECK(md.find("Fits in 80 GB") != std::string::npos);

  memory_plan_options base;
  const std::vector<std::string> models{"7b"};
  const std::vector<int> gpus{1, 8};
  const std::vector<double> capacities{80, 141};
  auto grid = memory_grid_markdown(base, models, gpus, capacities);
  REQUIRE(grid.ok());
  // Header, rule, and 2 modes x 2 GPU counts.
  CHECK(std::count(grid->begin(), grid->end(), '\n') == 6);
  CHECK(grid->find("| 7b | full | 1 | 7.62B |") != std::string::npos);
  CHECK(grid->find("| 7b | LoRA | 8 | 10.1M |") != std::string::npos);
  CHECK(grid->find("| — | — | — | — |") != std::string::npos); // no ZeRO-1 on one GPU
  const std::vector<std::string> bad{"70b"};
  CHECK_FALSE(memory_grid_markdown(base, bad, gpus, capacities).ok());
}
