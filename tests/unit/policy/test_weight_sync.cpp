// tests/unit/policy/test_weight_sync.cpp: weights from a learner rank to engine ranks over the
// in-process communicator (full weights and LoRA adapters, several buckets), refused manifests,
// and an engine sharing the learner's tensors (CPU).
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "policy/training/learner.hpp"
#include "policy/distributed/weight_sync.hpp"
#include "tests/unit/policy/policy_test_util.hpp"

using namespace crucible;
using namespace crucible::policy;
using namespace crucible::policy::testing;
using namespace std::chrono_literals;

namespace {

const bool one_thread = [] {
  torch::set_num_threads(1);
  return true;
}();

double max_param_diff(CausalLMImpl& a, CausalLMImpl& b) {
  auto pb = b.named_parameters(true);
  double worst = 0;
  for (const auto& item : a.named_parameters(true))
    worst = std::max(worst, max_abs_diff(item.value(), pb[item.key()]));
  return worst;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Rank 0 sends `learner_model`'s tensors stamped `version`; ranks 1.. receive into theirs.
struct sync_outcome {
  std::vector<result<weight_sync_stats>> stats;
};

sync_outcome sync_once(CausalLMImpl& learner_model, std::vector<CausalLM>& engines, bool adapters_only,
                       std::int64_t bucket_bytes, std::uint64_t version) {
  const int n = 1 + static_cast<int>(engines.size());
  auto group = inproc_group::create(n, 10s);
  sync_outcome out;
  out.stats.assign(static_cast<std::size_t>(n), crucible::error{errc::cancelled, "not run"});
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto comm = group->join(r);
      REQUIRE(comm.ok());
      auto& model = r == 0 ? learner_model : *engines[static_cast<std::size_t>(r - 1)];
      auto ws = weight_sync::create(*comm, sync_tensors(model, adapters_only), {bucket_bytes, 0});
      REQUIRE(ws.ok());
      out.stats[r] = r == 0 ? (*ws)->send(version) : (*ws)->receive();
    });
  for (auto& t : threads)
    t.join();
  return out;
}

} // namespace

TEST_CASE("weight sync: engines receive the learner's weights in several buckets, stamped with its version") {
  auto learner_model = small_qwen2_model(1);
  std::vector<CausalLM> engines{small_qwen2_model(2), small_qwen2_model(3)};
  REQUIRE(max_param_diff(*engines[0], *learner_model) > 0.1);
  // 20 kB buckets: the embedding and output matrices (76.8 kB) go alone, the rest in groups.
  auto out = sync_once(*learner_model, engines, false, 20000, 42);
  std::int64_t total = 0;
  for (const auto& t : sync_tensors(*learner_model, false))
    total += static_cast<std::int64_t>(t.param.nbytes());
  for (std::size_t r = 0; r < out.stats.size(); ++r) {
    CAPTURE(r);
    REQUIRE_MESSAGE(out.stats[r].ok(), (out.stats[r].ok() ? "" : out.stats[r].error().message));
    CHECK(out.stats[r]->version == 42);
    CHECK(out.stats[r]->bytes == total);
    CHECK(out.stats[r]->buckets > 4);
  }
  for (auto& e : engines)
    CHECK(max_param_diff(*e, *learner_model) == 0.0);
}

TEST_CASE("weight sync of LoRA adapters only: the engine's adapters follow the learner's, its base stays") {
  learner_options o;
  o.lora = true;
  o.lora_rank = 4;
  o.lr = 1e-2;
  auto l = learner::create(small_qwen2_model(5), CausalLM{nullptr}, o, /*seed=*/3);
  REQUIRE(l.ok());
  // One update so that B (zero at the start) is not.
  sft_example ex{{5, 6, 7, 8}, {9, 10, 11}};
  REQUIRE((*l)->sft_step(std::span<const sft_example>(&ex, 1)).ok());
  std::vector<CausalLM> engines{small_qwen2_model(5)};
  lora_options lo;
  lo.rank = 4;
  lo.alpha = o.lora_alpha;
  lo.targets = o.lora_targets;
  lo.seed = 99; // other adapters than the learner's
  REQUIRE(engines[0]->add_lora(lo).ok());
  auto base_before = engines[0]->named_parameters(true)["model.layers.0.self_attn.q_proj.weight"].clone();
  auto out = sync_once((*l)->model(), engines, true, 1 << 20, (*l)->version());
  REQUIRE(out.stats[1].ok());
  CHECK(out.stats[1]->version == 1);
  CHECK(max_param_diff(*engines[0], (*l)->model()) == 0.0);
  CHECK(torch::equal(engines[0]->named_parameters(true)["model.layers.0.self_attn.q_proj.weight"], base_before));
}

TEST_CASE("weight sync refuses engines whose tensors differ, on every rank, naming the tensor") {
  SUBCASE("a shape") {
    auto learner_model = small_qwen2_model(1);
    std::vector<CausalLM> engines{small_qwen2_model(2), small_qwen2_model(3, 32)};
    auto before = engines[0]->named_parameters(true)["model.norm.weight"].clone();
    auto out = sync_once(*learner_model, engines, false, 1 << 20, 7);
    REQUIRE_FALSE(out.stats[0].ok());
    CHECK(contains(out.stats[0].error().message, "1 engine rank(s) refused"));
    REQUIRE_FALSE(out.stats[1].ok()); // the matching engine does not half-update either
    CHECK(torch::equal(engines[0]->named_parameters(true)["model.norm.weight"], before));
    REQUIRE_FALSE(out.stats[2].ok());
    CHECK(contains(out.stats[2].error().message, "engine rank 2"));
    CHECK(contains(out.stats[2].error().message, "model.embed_tokens.weight is Float [300, 64] on the learner but "
                                                 "Float [300, 32] on this engine"));
  }
  SUBCASE("a name") {
    auto learner_model = small_qwen2_model(1);
    std::vector<CausalLM> engines{small_qwen2_model(2, 64, /*tied=*/true)};
    auto out = sync_once(*learner_model, engines, false, 1 << 20, 7);
    REQUIRE_FALSE(out.stats[1].ok());
    CHECK(contains(out.stats[1].error().message, "the learner sends lm_head.weight"));
    REQUIRE_FALSE(out.stats[0].ok());
  }
  SUBCASE("roles") {
    auto group = inproc_group::create(1, 1s);
    auto comm = group->join(0);
    REQUIRE(comm.ok());
    auto m = small_qwen2_model(1);
    auto ws = weight_sync::create(*comm, sync_tensors(*m, false), {});
    REQUIRE(ws.ok());
    CHECK_FALSE((*ws)->receive().ok());
  }
}

TEST_CASE("an engine on the learner's device shares its tensors: every update is seen without a copy") {
  learner_options o;
  o.lr = 1e-2;
  auto l = learner::create(small_qwen2_model(8), CausalLM{nullptr}, o);
  REQUIRE(l.ok());
  auto engine_model = small_qwen2_model(9);
  auto source = sync_tensors((*l)->model(), false);
  REQUIRE(share_weights(source, *engine_model).ok());
  CHECK(max_param_diff(*engine_model, (*l)->model()) == 0.0);
  sft_example ex{{5, 6, 7, 8}, {9, 10, 11}};
  auto before = engine_model->named_parameters(true)["lm_head.weight"].clone();
  REQUIRE((*l)->sft_step(std::span<const sft_example>(&ex, 1)).ok());
  CHECK_FALSE(torch::equal(engine_model->named_parameters(true)["lm_head.weight"], before));
  CHECK(max_param_diff(*engine_model, (*l)->model()) == 0.0);
  CHECK(engine_model->named_parameters(true)["lm_head.weight"].data_ptr() ==
        (*l)->model().named_parameters(true)["lm_head.weight"].data_ptr());
  // A model of another shape is refused before anything is shared.
  auto other = small_qwen2_model(9, 32);
  auto e = share_weights(source, *other);
  REQUIRE_FALSE(e.ok());
  CHECK(contains(e.error().message, "model.embed_tokens.weight is Float [300, 64]"));
}
