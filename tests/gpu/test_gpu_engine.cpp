// The model and the sampling engine on CUDA: CPU parity, CUDA-graph decoding against eager
// decoding, behaviour log-probs against a teacher-forced forward, and a throughput figure.
#include <doctest/doctest.h>

#include <chrono>
#include <numeric>

#include <torch/torch.h>

#include "policy/distributed/weight_handoff.hpp"
#include "policy/model/engine.hpp"
#include "policy/model/model.hpp"
#include "policy/runtime.hpp"
#include "policy/training/learner.hpp"
#include "../unit/policy/policy_test_util.hpp"

using namespace crucible;
using namespace crucible::policy;
using namespace crucible::policy::testing;

namespace {

CausalLM random_model(const std::string& preset, model_family family, std::int64_t vocab, torch::ScalarType dtype,
                      std::uint64_t seed = 1) {
  auto c = preset_config(preset, family, vocab);
  REQUIRE(c.ok());
  auto m = scaled_random_model(*c, seed, 4.0);
  m->to(torch::Device(torch::kCUDA, 0), dtype);
  return m;
}

std::vector<std::vector<std::int32_t>> random_prompts(std::vector<int> lengths, std::int64_t vocab) {
  torch::manual_seed(7);
  std::vector<std::vector<std::int32_t>> out;
  for (int n : lengths) {
    auto t = torch::randint(0, vocab, {n}, torch::kInt);
    out.emplace_back(t.data_ptr<std::int32_t>(), t.data_ptr<std::int32_t>() + n);
  }
  return out;
}

} // namespace

TEST_CASE("CUDA float32 logits equal the CPU's") {
  auto gpu = random_model("tiny", model_family::qwen2, 1000, torch::kFloat);
  auto cpu = scaled_random_model(gpu->config(), 1, 4.0);
  torch::NoGradGuard g;
  token_batch b;
  b.input_ids = torch::randint(0, 1000, {2, 40});
  auto expect = cpu->forward(b);
  b.input_ids = b.input_ids.cuda();
  CHECK(max_abs_diff(gpu->forward(b), expect) <= 1e-3);
}

TEST_CASE("greedy decoding with CUDA graphs equals eager decoding") {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    CAPTURE(c10::toString(dtype));
    auto m = random_model("tiny", model_family::llama, 1000, dtype);
    engine_options graphs_on, graphs_off;
    graphs_off.cuda_graphs = false;
    engine with(m.ptr(), graphs_on), without(m.ptr(), graphs_off);
    auto prompts = random_prompts({5, 40, 17, 3, 64}, 1000);
    sampling_options o;
    o.temperature = 0.0;
    o.max_new_tokens = 300; // past the first 256-slot bucket
    o.samples_per_prompt = 2;
    auto a = with.generate(prompts, o);
    auto b = without.generate(prompts, o);
    REQUIRE((a.ok() && b.ok()));
    CHECK(with.last_stats().graph_replays > 0);
    CHECK(with.last_stats().graph_captures >= 2);
    CHECK(without.last_stats().graph_replays == 0);
    std::size_t same = 0, total = 0;
    for (std::size_t i = 0; i < a->size(); ++i) {
      const auto& x = (*a)[i].tokens;
      const auto& y = (*b)[i].tokens;
      std::size_t k = 0;
      while (k < x.size() && k < y.size() && x[k] == y[k])
        ++k;
      same += k;
      total += y.size();
      // Log-probs of the shared prefix agree.
      for (std::size_t j = 0; j < k; ++j)
        CHECK(std::abs((*a)[i].logprobs[j] - (*b)[i].logprobs[j]) <= (dtype == torch::kFloat ? 1e-3 : 5e-2));
    }
    MESSAGE(c10::toString(dtype) << ": graph vs eager greedy tokens equal: " << same << " / " << total);
    if (dtype == torch::kFloat)
      CHECK(same == total);
    else // bf16: a different reduction length can flip a near-tie; most must agree
      CHECK(same >= total * 9 / 10);
  }
}

TEST_CASE("greedy sampling inside the CUDA graphs equals sampling after them, bit for bit") {
  // One row's fused output matrix sums in another order than cuBLAS: off here (next case).
  kernels::decode_options no_head;
  no_head.greedy_head = false;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (std::int64_t interval : {16, 5}) {
      CAPTURE(c10::toString(dtype));
      CAPTURE(interval);
      auto m = random_model("tiny", model_family::llama, 1000, dtype);
      m->set_decode_options(no_head);
      engine_options inside, after;
      inside.sync_interval = after.sync_interval = interval;
      after.greedy_in_graph = false;
      engine with(m.ptr(), inside), without(m.ptr(), after);
      auto prompts = random_prompts({5, 40, 17, 3, 64}, 1000);
      sampling_options o;
      o.temperature = 0.0;
      o.max_new_tokens = 300; // past the first 256-slot bucket, inside a block
      o.samples_per_prompt = 2;
      // An eos id that one completion reaches early, so that rows finish at different steps and
      // the batch is compacted between blocks.
      auto probe = without.generate(prompts, o);
      REQUIRE(probe.ok());
      o.eos_ids = {(*probe)[3].tokens[40]};
      auto a = with.generate(prompts, o);
      const auto sa = with.last_stats();
      auto b = without.generate(prompts, o);
      const auto sb = without.last_stats();
      REQUIRE((a.ok() && b.ok()));
      CHECK(sa.graph_sampled_steps == sa.decode_steps);
      CHECK(sa.graph_replays == sa.decode_steps);
      CHECK(sb.graph_sampled_steps == 0);
      CHECK(sb.graph_replays == sb.decode_steps);
      // In the graphs, each block's first step is queued before the host reads the block before
      // it: one step more where every row finished by then, and one more at each compaction (the
      // step is dropped and run again on the compacted batch).
      CHECK(sa.decode_steps >= sb.decode_steps);
      CHECK(sa.decode_steps <= sb.decode_steps + 1 + sa.compactions);
      CHECK(sa.compactions == sb.compactions);
      CHECK(sa.compactions > 0);
      CHECK(sa.host_syncs == sb.host_syncs);
      REQUIRE(a->size() == b->size());
      std::size_t finished_early = 0;
      for (std::size_t i = 0; i < a->size(); ++i) {
        CAPTURE(i);
        CHECK((*a)[i].tokens == (*b)[i].tokens);
        CHECK((*a)[i].logprobs == (*b)[i].logprobs);
        CHECK((*a)[i].finish == (*b)[i].finish);
        finished_early += (*a)[i].finish == finish_reason::eos ? 1 : 0;
      }
      CHECK(finished_early > 0);
      // Sampling at a temperature stays outside the graphs.
      o.temperature = 0.8;
      o.max_new_tokens = 20;
      REQUIRE(with.generate(prompts, o).ok());
      CHECK(with.last_stats().graph_sampled_steps == 0);
      CHECK(with.last_stats().graph_replays > 0);
    }
  }
}

TEST_CASE("one row's greedy steps ending in greedy_head equal sampling after the graphs, up to rounding") {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    CAPTURE(c10::toString(dtype));
    auto m = random_model("tiny", model_family::qwen2, 1000, dtype);
    engine_options after;
    after.greedy_in_graph = false;
    engine with(m.ptr(), {}), without(m.ptr(), after);
    sampling_options o;
    o.temperature = 0.0;
    o.max_new_tokens = 300;
    for (auto prompts : {random_prompts({37}, 1000), random_prompts({250}, 1000)}) {
      auto a = with.generate(prompts, o);
      const auto sa = with.last_stats();
      auto b = without.generate(prompts, o);
      REQUIRE((a.ok() && b.ok()));
      CHECK(sa.graph_sampled_steps == sa.decode_steps);
      const auto& x = (*a)[0];
      const auto& y = (*b)[0];
      REQUIRE(x.tokens.size() == y.tokens.size());
      std::size_t k = 0;
      while (k < x.tokens.size() && x.tokens[k] == y.tokens[k])
        ++k;
      double worst = 0.0;
      for (std::size_t j = 0; j < k; ++j)
        worst = std::max(worst, static_cast<double>(std::abs(x.logprobs[j] - y.logprobs[j])));
      MESSAGE(c10::toString(dtype) << ": " << k << " of " << y.tokens.size()
                                   << " tokens equal; max |log-prob difference| over them " << worst);
      CHECK(worst <= (dtype == torch::kFloat ? 1e-3 : 5e-2));
      if (dtype == torch::kFloat)
        CHECK(k == y.tokens.size());
      else // bf16: a logit one rounding step apart can flip a near-tie; most must agree
        CHECK(k >= y.tokens.size() / 2);
    }
  }
}

TEST_CASE("sampled log-probs on CUDA equal a teacher-forced forward") {
  auto m = random_model("tiny", model_family::qwen2, 1000, torch::kFloat);
  engine e(m.ptr(), {});
  auto prompts = random_prompts({9, 30, 2}, 1000);
  sampling_options o;
  o.temperature = 0.7;
  o.top_p = 0.95;
  o.max_new_tokens = 80;
  o.samples_per_prompt = 4;
  o.seed = 3;
  auto out = e.generate(prompts, o);
  REQUIRE(out.ok());
  auto again = e.generate(prompts, o);
  REQUIRE(again.ok());
  double worst = 0.0;
  torch::NoGradGuard g;
  for (std::size_t i = 0; i < out->size(); ++i) {
    const auto& c = (*out)[i];
    CHECK(c.tokens == (*again)[i].tokens); // seeded
    auto lp = teacher_forced_log_probs(*m, prompts[c.prompt_index], c.tokens, o.temperature);
    worst = std::max(worst, max_abs_diff(lp, torch::tensor(c.logprobs)));
  }
  MESSAGE("CUDA float32: max |engine log-prob - teacher-forced| = " << worst);
  CHECK(worst <= 1e-3);
}

TEST_CASE("weight handoff across two GPUs: the engine on cuda:1 gets each version the learner on cuda:0 stages") {
  if (torch::cuda::device_count() < 2) {
    MESSAGE("skipped: one CUDA device (an engine apart needs a second)");
    return;
  }
  for (const bool lora : {false, true}) {
    CAPTURE(lora);
    learner_options o;
    o.lr = 1e-2;
    o.lora = lora;
    o.lora_rank = 4;
    auto model = small_qwen2_model(21);
    model->to(torch::Device(torch::kCUDA, 0));
    auto l = learner::create(model, CausalLM{nullptr}, o, 5);
    REQUIRE(l.ok());
    auto& lm = (*l)->model();
    auto h = weight_handoff::create(lm, "float32", 0, "cuda:1");
    REQUIRE(h.ok());
    auto& em = *(*h)->engine_model();
    CHECK((*h)->stats().tensors_shared == 0); // nothing is shared across devices, LoRA's base included
    for (const auto& item : em.named_parameters(true))
      CHECK(item.value().device() == torch::Device(torch::kCUDA, 1));
    engine_options eo;
    eo.device = "cuda:1";
    engine across((*h)->engine_model(), eo);
    auto ex = sft_example{{5, 6, 7, 8}, {9, 10, 11}};
    for (int step = 1; step <= 2; ++step) {
      REQUIRE((*l)->sft_step(std::span<const sft_example>(&ex, 1)).ok());
      REQUIRE((*h)->stage(static_cast<std::uint64_t>(step)).ok());
    }
    REQUIRE(*(*h)->install() == 2);
    // The engine's weights are the learner's, bit for bit (adapters merged).
    torch::NoGradGuard g;
    auto exported = lm.export_tensors();
    std::map<std::string, torch::Tensor> published;
    for (auto& [name, t] : exported)
      published[name] = t.detach().to(torch::kCPU);
    for (const auto& item : em.named_parameters(true)) {
      auto it = published.find(item.key());
      REQUIRE_MESSAGE(it != published.end(), item.key());
      CHECK(max_abs_diff(item.value().to(torch::kCPU), it->second) == 0.0);
    }
    // And the engine on cuda:1 samples what one beside the learner on cuda:0 samples.
    auto beside = weight_handoff::create(lm, "float32", 2);
    REQUIRE(beside.ok());
    engine_options eo0;
    eo0.device = "cuda:0";
    engine here((*beside)->engine_model(), eo0);
    sampling_options s;
    s.temperature = 0; // greedy
    s.max_new_tokens = 16;
    s.samples_per_prompt = 2;
    std::vector<std::vector<std::int32_t>> prompts{{3, 4, 5, 6}, {7, 8}};
    auto a = across.generate(prompts, s);
    auto b = here.generate(prompts, s);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    REQUIRE(a->size() == b->size());
    for (std::size_t i = 0; i < a->size(); ++i)
      CHECK((*a)[i].tokens == (*b)[i].tokens);
  }
}

TEST_CASE("benchmark: 0.5b preset, bf16, 8 prompts x 8 samples, 256 new tokens, graphs on and off") {
  auto m = random_model("0.5b", model_family::qwen2, 151936, torch::kBFloat16);
  auto prompts = random_prompts({512, 300, 450, 200, 512, 128, 400, 333}, 151936);
  sampling_options o;
  o.temperature = 1.0;
  o.max_new_tokens = 256;
  o.samples_per_prompt = 8;
  for (bool graphs : {true, false}) {
    engine_options eo;
    eo.cuda_graphs = graphs;
    engine e(m.ptr(), eo);
    REQUIRE(e.generate(prompts, o).ok()); // warm-up (captures graphs)
    torch::cuda::synchronize();
    auto t0 = std::chrono::steady_clock::now();
    auto out = e.generate(prompts, o);
    torch::cuda::synchronize();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    REQUIRE(out.ok());
    const auto& st = e.last_stats();
    MESSAGE("graphs " << (graphs ? "on" : "off") << ": " << st.generated_tokens << " tokens in " << s << " s = "
                      << st.generated_tokens / s << " tokens/s (prefill " << st.prefill_seconds << " s, decode "
                      << st.decode_seconds << " s, " << st.decode_steps << " steps, " << st.graph_replays
                      << " replays, " << st.compactions << " compactions)");
  }
}
