// tests/unit/policy/test_learner.cpp: the learner on a tiny random model (CPU): GRPO overfits a
// fixed batch in the right directions, micro-batches give the full batch's gradient, LoRA trains
// adapters only, checkpoints resume exactly and refuse damaged files.
#include <doctest/doctest.h>

#include <fstream>
#include <mutex>
#include <random>
#include <tuple>

#include "policy/training/checkpoint.hpp"
#include "policy/training/episode_batch.hpp"
#include "policy/training/learner.hpp"
#include "tests/unit/policy/policy_test_util.hpp"

using namespace crucible;
using namespace crucible::policy;
using namespace crucible::policy::testing;
namespace fs = std::filesystem;

namespace {

// Tensors here are tiny: intra-op threads only add synchronisation, and on a loaded machine
// OpenMP's spin-waiting made these tests twenty times slower (measured: 11.5 s against 0.5 s).
const bool one_thread = [] {
  torch::set_num_threads(1);
  return true;
}();

CausalLM tiny_model(std::uint64_t seed, double scale = 1.0) {
  auto c = preset_config("tiny", model_family::qwen2, 300);
  REQUIRE(c.ok());
  c->hidden_size = 64, c->num_heads = 4, c->num_kv_heads = 2, c->head_dim = 16, c->num_layers = 2;
  c->intermediate_size = 128;
  c->tie_word_embeddings = false;
  return scaled_random_model(*c, seed, scale);
}

std::vector<std::int32_t> random_tokens(std::mt19937_64& rng, int n) {
  std::uniform_int_distribution<int> tok(1, 299);
  std::vector<std::int32_t> out;
  for (int i = 0; i < n; ++i)
    out.push_back(tok(rng));
  return out;
}

// Groups of G completions with rewards; behaviour log-probs are `model`'s teacher-forced ones at
// `temperature`, plus uniform noise of +-`noise` (a stale sampler).
grpo_batch make_batch(CausalLMImpl& model, std::uint64_t seed, int groups, int g, double noise,
                      const std::vector<double>& rewards, double temperature = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> prompt_len(2, 8), completion_len(1, 9);
  std::uniform_real_distribution<double> jitter(-noise, noise);
  grpo_batch batch;
  batch.temperature = temperature;
  for (int i = 0; i < groups; ++i) {
    grpo_group group;
    group.prompt = random_tokens(rng, prompt_len(rng));
    for (int s = 0; s < g; ++s) {
      grpo_sample sample;
      // One single-token completion in every group.
      sample.completion = random_tokens(rng, s == 0 ? 1 : completion_len(rng));
      auto lp = teacher_forced_log_probs(model, group.prompt, sample.completion, temperature);
      for (std::int64_t t = 0; t < lp.size(0); ++t)
        sample.behaviour_log_probs.push_back(static_cast<float>(lp[t].item<double>() + jitter(rng)));
      sample.reward = rewards[(i * g + s) % rewards.size()];
      group.samples.push_back(std::move(sample));
    }
    batch.groups.push_back(std::move(group));
  }
  return batch;
}

double sequence_log_likelihood(CausalLMImpl& model, const grpo_group& group, const grpo_sample& sample) {
  return teacher_forced_log_probs(model, group.prompt, sample.completion, 1.0).sum().item<double>();
}

std::map<std::string, torch::Tensor> snapshot(CausalLMImpl& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters(true))
    out[item.key()] = item.value().detach().clone();
  return out;
}

double max_param_diff(CausalLMImpl& a, CausalLMImpl& b) {
  auto pb = b.named_parameters(true);
  double worst = 0;
  for (const auto& item : a.named_parameters(true))
    worst = std::max(worst, max_abs_diff(item.value(), pb[item.key()]));
  return worst;
}

learner_options base_options() {
  learner_options o;
  o.lr = 1e-3;
  o.grad_clip = 1.0;
  o.micro_batch_tokens = 4096;
  return o;
}

std::unique_ptr<learner> make_learner(const learner_options& o, std::uint64_t model_seed, bool with_reference) {
  auto l = learner::create(tiny_model(model_seed), with_reference ? tiny_model(model_seed + 100) : CausalLM{nullptr},
                           o, /*seed=*/7);
  REQUIRE(l.ok());
  return std::move(*l);
}

} // namespace

TEST_CASE("GRPO overfits a fixed batch: high-reward completions gain likelihood, low-reward ones lose it") {
  auto o = base_options();
  o.lr = 3e-3;
  auto l = make_learner(o, 1, false);
  // Rewards 1, 0, 1, 0 within each group (advantages +-0.87).
  auto batch = make_batch(l->model(), 42, 3, 4, 0.0, {1.0, 0.0, 1.0, 0.0});
  std::vector<double> before;
  for (const auto& g : batch.groups)
    for (const auto& s : g.samples)
      before.push_back(sequence_log_likelihood(l->model(), g, s));
  for (int step = 0; step < 12; ++step) {
    auto m = l->grpo_step(batch);
    REQUIRE(m.ok());
    CHECK_FALSE(m->skipped);
    CHECK(m->version == static_cast<std::uint64_t>(step + 1));
    CHECK(m->recomputed_old);
    CHECK(m->ratio_mean == doctest::Approx(1.0).epsilon(1e-5)); // one update per batch: pi = pi_old
    CHECK(m->reward_mean == 0.5);
  }
  std::size_t k = 0;
  double gain_high = 0, gain_low = 0;
  for (const auto& g : batch.groups)
    for (const auto& s : g.samples) {
      const double delta = sequence_log_likelihood(l->model(), g, s) - before[k++];
      CAPTURE(k);
      CAPTURE(delta);
      if (s.reward > 0.5) {
        CHECK(delta > 0.0);
        gain_high += delta;
      } else {
        CHECK(delta < 0.0);
        gain_low += delta;
      }
    }
  MESSAGE("log-likelihood change after 12 updates: high-reward ", gain_high, ", low-reward ", gain_low);
  CHECK(gain_high > 1.0);
  CHECK(gain_low < -1.0);
}

TEST_CASE("negative_weight 0: samples below their group's mean carry no gradient, at 1 they do") {
  // One update on two batches that differ only in the tokens of the zero-reward samples (same
  // lengths, so token_mean's denominator is the same): with negative_weight 0 the updates are
  // equal, with 1 (GRPO) they are not.
  auto update_after = [](double negative_weight, bool scramble) {
    auto o = base_options();
    o.negative_weight = negative_weight;
    auto l = make_learner(o, 3, false);
    auto batch = make_batch(l->model(), 11, 2, 4, 0.0, {1.0, 0.0, 2.0, 0.0});
    if (scramble) {
      std::mt19937_64 rng(99);
      for (auto& g : batch.groups)
        for (auto& s : g.samples)
          if (s.reward == 0.0) {
            s.completion = random_tokens(rng, static_cast<int>(s.completion.size()));
            auto lp = teacher_forced_log_probs(l->model(), g.prompt, s.completion, 1.0);
            for (std::int64_t t = 0; t < lp.size(0); ++t)
              s.behaviour_log_probs[static_cast<std::size_t>(t)] = static_cast<float>(lp[t].item<double>());
          }
    }
    auto m = l->grpo_step(batch);
    REQUIRE(m.ok());
    return l;
  };
  auto a = update_after(0.0, false), b = update_after(0.0, true);
  CHECK(max_param_diff(a->model(), b->model()) < 1e-7);
  auto c = update_after(1.0, false), d = update_after(1.0, true);
  CHECK(max_param_diff(c->model(), d->model()) > 1e-5);
}

TEST_CASE("rows whose advantage is 0 are not forwarded, and the update is the one computed with them") {
  // Group 0's rewards are all equal (advantages exactly 0), groups 1 and 2 differ. Without a KL
  // term the learner skips group 0's four rows. The same update computed with every row
  // forwarded: a KL term against a reference equal to the policy (k3's value and gradient are 0
  // where the two agree), which keeps the learner from skipping.
  const std::vector<double> rewards{1.0, 1.0, 1.0, 1.0, 0.0, 2.0, 0.0, 1.0, 3.0, 0.0, 0.5, 0.0};
  std::vector<std::vector<torch::Tensor>> grads(2);
  std::vector<step_metrics> metrics;
  std::vector<std::unique_ptr<learner>> ls;
  for (int run = 0; run < 2; ++run) {
    auto o = base_options();
    o.micro_batch_tokens = 20; // several micro-batches: fewer when rows are skipped
    o.old_log_probs = old_log_probs_source::behaviour;
    o.kl_coef = run == 0 ? 0.0 : 0.05;
    auto l = learner::create(tiny_model(5), run == 0 ? CausalLM{nullptr} : tiny_model(5), o, /*seed=*/7);
    REQUIRE(l.ok());
    auto batch = make_batch((*l)->model(), 21, 3, 4, 0.3, rewards);
    (*l)->set_gradient_hook([&, run](std::span<const named_parameter>, std::span<torch::Tensor> g) -> result<void> {
      for (auto& t : g)
        grads[run].push_back(t.clone());
      return {};
    });
    auto m = (*l)->grpo_step(batch);
    REQUIRE(m.ok());
    metrics.push_back(*m);
    ls.push_back(std::move(*l));
  }
  CHECK(metrics[0].zero_advantage == 4);
  CHECK(metrics[1].zero_advantage == 0);
  CHECK(metrics[0].sequences == 12);
  CHECK(metrics[0].tokens == metrics[1].tokens); // the totals that weigh every token include the skipped rows
  CHECK(metrics[0].micro_batches < metrics[1].micro_batches);
  CHECK(std::abs(metrics[1].kl) < 1e-9);
  CHECK(metrics[0].loss == doctest::Approx(metrics[1].loss).epsilon(1e-6));
  REQUIRE(grads[0].size() == grads[1].size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < grads[0].size(); ++i) {
    worst = std::max(worst, max_abs_diff(grads[0][i], grads[1][i]));
    scale = std::max(scale, grads[0][i].abs().max().item<double>());
  }
  MESSAGE("max |grad difference| skipping zero-advantage rows against forwarding them: ", worst, " (largest entry ",
          scale, ")");
  CHECK(worst < 1e-6);
  CHECK(scale > 1e-3);
  CHECK(max_param_diff(ls[0]->model(), ls[1]->model()) < 1e-6);

  // Every row 0 (a batch of equal rewards, as when every sample is a format error): nothing is
  // forwarded, the gradient is 0, and the step is taken as before (AdamW's decay and step count).
  auto o = base_options();
  o.weight_decay = 0.1;
  auto l = make_learner(o, 6, false);
  auto before = snapshot(l->model());
  auto m = l->grpo_step(make_batch(l->model(), 22, 2, 4, 0.0, {0.0}));
  REQUIRE(m.ok());
  CHECK(m->zero_advantage == 8);
  CHECK(m->micro_batches == 0);
  CHECK(m->loss == 0.0);
  CHECK(m->grad_norm == 0.0);
  CHECK_FALSE(m->skipped);
  CHECK(m->version == 1);
  double moved = 0;
  for (const auto& item : l->model().named_parameters(true))
    moved = std::max(moved, max_abs_diff(item.value(), before[item.key()]));
  CHECK(moved > 0.0); // weight decay
}

TEST_CASE("micro-batches accumulate the full batch's gradient within 1e-6 (GRPO every aggregation, SFT)") {
  for (int variant = 0; variant < 4; ++variant) {
    CAPTURE(variant);
    auto o = base_options();
    o.kl_coef = 0.05;
    o.kl = variant == 1 ? kl_estimator::k1 : kl_estimator::k3;
    o.aggregation = variant == 1 ? loss_aggregation::sequence_mean
                    : variant == 2 ? loss_aggregation::constant
                                   : loss_aggregation::token_mean;
    // Stale behaviour log-probs: with `behaviour` as the old policy the ratio moves (and clips);
    // with `recompute` the stale-sample weights do.
    o.old_log_probs = variant == 3 ? old_log_probs_source::recompute : old_log_probs_source::behaviour;
    o.clip_high = 0.28;
    std::vector<std::vector<torch::Tensor>> grads(2);
    std::vector<step_metrics> metrics;
    for (int run = 0; run < 2; ++run) {
      o.micro_batch_tokens = run == 0 ? 100000 : 20;
      auto l = make_learner(o, 3, true);
      auto batch = make_batch(l->model(), 9, 3, 4, 0.3, {0.2, 1.5, -0.3, 0.9, 0.0});
      l->set_gradient_hook([&, run](std::span<const named_parameter>, std::span<torch::Tensor> g) -> result<void> {
        for (auto& t : g)
          grads[run].push_back(t.clone());
        return {};
      });
      auto m = l->grpo_step(batch);
      REQUIRE(m.ok());
      metrics.push_back(*m);
    }
    CHECK(metrics[0].micro_batches == 1);
    CHECK(metrics[1].micro_batches > 3);
    CHECK(metrics[1].loss == doctest::Approx(metrics[0].loss).epsilon(1e-6));
    CHECK(metrics[1].clip_fraction == doctest::Approx(metrics[0].clip_fraction));
    CHECK(metrics[1].kl == doctest::Approx(metrics[0].kl).epsilon(1e-5));
    if (variant != 3)
      CHECK(metrics[0].clip_fraction > 0.0);
    else
      CHECK(metrics[0].is_weight_mean != doctest::Approx(1.0));
    REQUIRE(grads[0].size() == grads[1].size());
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < grads[0].size(); ++i) {
      worst = std::max(worst, max_abs_diff(grads[0][i], grads[1][i]));
      scale = std::max(scale, grads[0][i].abs().max().item<double>());
    }
    MESSAGE("variant ", variant, ": max |grad difference| ", worst, " (largest gradient entry ", scale, ")");
    CHECK(worst < 1e-6);
    CHECK(scale > 1e-3);
  }
  // SFT.
  std::vector<std::vector<torch::Tensor>> grads(2);
  std::vector<double> losses;
  std::mt19937_64 rng(5);
  std::vector<sft_example> examples;
  for (int i = 0; i < 7; ++i)
    examples.push_back({random_tokens(rng, 2 + i), random_tokens(rng, 1 + (i * 3) % 7)});
  for (int run = 0; run < 2; ++run) {
    auto o = base_options();
    o.micro_batch_tokens = run == 0 ? 100000 : 16;
    auto l = make_learner(o, 4, false);
    l->set_gradient_hook([&, run](std::span<const named_parameter>, std::span<torch::Tensor> g) -> result<void> {
      for (auto& t : g)
        grads[run].push_back(t.clone());
      return {};
    });
    auto m = l->sft_step(examples);
    REQUIRE(m.ok());
    CHECK((run == 0 ? m->micro_batches == 1 : m->micro_batches > 2));
    losses.push_back(m->loss);
    CHECK(m->nll == doctest::Approx(m->loss));
  }
  CHECK(losses[1] == doctest::Approx(losses[0]).epsilon(1e-6));
  double worst = 0;
  for (std::size_t i = 0; i < grads[0].size(); ++i)
    worst = std::max(worst, max_abs_diff(grads[0][i], grads[1][i]));
  CHECK(worst < 1e-6);
}

TEST_CASE("LoRA: only the adapters change, and the optimiser sees only them") {
  auto o = base_options();
  o.lora = true;
  o.lora_rank = 4;
  o.lora_targets = {"q_proj", "v_proj", "down_proj"};
  o.lr = 1e-2;
  auto l = make_learner(o, 5, false);
  CHECK(l->parameters().size() == 2 * 3 * 2);
  for (const auto& p : l->parameters())
    CHECK(p.name.find(".lora_") != std::string::npos);
  CHECK(l->frozen_digest().size() == 64);
  auto before = snapshot(l->model());
  auto batch = make_batch(l->model(), 11, 2, 4, 0.0, {1.0, 0.0, 0.5, 0.0});
  for (int i = 0; i < 3; ++i)
    REQUIRE(l->grpo_step(batch).ok());
  int adapters_changed = 0;
  for (const auto& item : l->model().named_parameters(true)) {
    const auto& name = item.key();
    const bool adapter = name.find(".lora_") != std::string::npos;
    CAPTURE(name);
    if (adapter)
      adapters_changed += max_abs_diff(item.value(), before.at(name)) > 0;
    else
      CHECK(torch::equal(item.value(), before.at(name)));
  }
  CHECK(adapters_changed == 12);
}

TEST_CASE("learner.activation_checkpointing: GRPO and SFT updates give the same losses and weights as without") {
  // Full fine-tuning and LoRA, several micro-batches per update, float32 and bfloat16 parameters.
  struct variant {
    std::string name;
    bool lora;
    std::string dtype;
  };
  for (const auto& v : {variant{"full, float32", false, "float32"}, variant{"LoRA, float32", true, "float32"},
                        variant{"full, bfloat16", false, "bfloat16"}}) {
    CAPTURE(v.name);
    auto o = base_options();
    o.micro_batch_tokens = 30;
    o.lora = v.lora;
    o.lora_rank = 4;
    o.dtype = v.dtype;
    o.kl_coef = 0.05;
    o.old_log_probs = old_log_probs_source::behaviour;
    auto plain = make_learner(o, 6, true);
    o.activation_checkpointing = true;
    auto ckpt = make_learner(o, 6, true);
    CHECK_FALSE(plain->model().activation_checkpointing());
    CHECK(ckpt->model().activation_checkpointing());
    auto batch = make_batch(plain->model(), 13, 3, 4, 0.3, {0.2, 1.5, -0.3, 0.9, 0.0});
    std::mt19937_64 rng(8);
    std::vector<sft_example> examples;
    for (int i = 0; i < 5; ++i)
      examples.push_back({random_tokens(rng, 2 + i), random_tokens(rng, 1 + (i * 3) % 7)});
    for (int step = 0; step < 3; ++step) {
      CAPTURE(step);
      // SFT last: with LoRA the KL reference cannot follow SFT updates (learner.kl_coef).
      auto a = step == 2 ? plain->sft_step(examples) : plain->grpo_step(batch);
      auto b = step == 2 ? ckpt->sft_step(examples) : ckpt->grpo_step(batch);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      CHECK(a->micro_batches > 1);
      // On the CPU the gradients are bit for bit those without checkpointing (test_checkpointing.cpp),
      // so the updates are too.
      CHECK(b->loss == a->loss);
      CHECK(b->grad_norm == a->grad_norm);
      CHECK(max_param_diff(ckpt->model(), plain->model()) == 0.0);
    }
    if (v.lora)
      CHECK(plain->frozen_digest() == ckpt->frozen_digest());
  }
}

TEST_CASE("a bfloat16 learner keeps bf16 parameters and updates them through float32 masters") {
  auto o = base_options();
  o.dtype = "bfloat16";
  auto l = make_learner(o, 14, false);
  const auto& masters = l->optimizer().masters();
  for (std::size_t i = 0; i < l->parameters().size(); ++i) {
    CHECK((l->parameters()[i].param.scalar_type() == torch::kBFloat16));
    CHECK((masters[i].scalar_type() == torch::kFloat));
    CHECK(l->optimizer().has_master_copy(i));
  }
  auto batch = make_batch(l->model(), 5, 2, 4, 0.0, {1.0, 0.0, 0.2, 0.4});
  for (int i = 0; i < 2; ++i)
    REQUIRE(l->grpo_step(batch).ok());
  std::int64_t off_grid = 0;
  for (std::size_t i = 0; i < l->parameters().size(); ++i) {
    const auto& p = l->parameters()[i].param;
    CHECK(torch::equal(p, masters[i].to(torch::kBFloat16))); // the parameter is its master, rounded
    off_grid += (masters[i] != p.to(torch::kFloat)).sum().item<std::int64_t>();
  }
  CHECK(off_grid > 0); // the masters hold what bf16 cannot
}

TEST_CASE("the gradient hook gets the parameters in the model's order and can abort the update") {
  auto l = make_learner(base_options(), 6, false);
  std::vector<std::string> order;
  for (const auto& item : l->model().named_parameters(true))
    order.push_back(item.key());
  std::vector<std::string> seen;
  bool shapes_match = true;
  l->set_gradient_hook([&](std::span<const named_parameter> params, std::span<torch::Tensor> grads) -> result<void> {
    seen.clear();
    for (std::size_t i = 0; i < params.size(); ++i) {
      seen.push_back(params[i].name);
      shapes_match = shapes_match && grads[i].sizes() == params[i].param.sizes() &&
                     grads[i].scalar_type() == torch::kFloat;
    }
    return crucible::error{errc::timeout, std::string{"all-reduce timed out"}};
  });
  auto batch = make_batch(l->model(), 1, 2, 3, 0.0, {1.0, 0.0, 0.0});
  auto before = snapshot(l->model());
  auto m = l->grpo_step(batch);
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().code == errc::timeout);
  CHECK(seen == order);
  CHECK(shapes_match);
  CHECK(l->version() == 0);
  CHECK(l->steps() == 0);
  for (const auto& item : l->model().named_parameters(true))
    CHECK(torch::equal(item.value(), before.at(item.key())));
  // The aborted step's gradients are gone: the next step equals a fresh learner's first step.
  l->set_gradient_hook({});
  auto fresh = make_learner(base_options(), 6, false);
  auto a = l->grpo_step(batch);
  auto b = fresh->grpo_step(batch);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->grad_norm == b->grad_norm);
  CHECK(max_param_diff(l->model(), fresh->model()) == 0.0);
}

TEST_CASE("bad batches are refused, naming the group and sample") {
  auto l = make_learner(base_options(), 2, false);
  auto batch = make_batch(l->model(), 3, 2, 2, 0.0, {1.0, 0.0});
  auto bad = batch;
  bad.groups[1].samples[0].behaviour_log_probs.pop_back();
  auto r = l->grpo_step(bad);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::invalid_arg);
  CHECK(r.error().message.find("group 1 sample 0") != std::string::npos);
  bad = batch;
  bad.groups[0].prompt.clear();
  CHECK(l->grpo_step(bad).error().message.find("group 0 has an empty prompt") != std::string::npos);
  CHECK_FALSE(l->grpo_step(grpo_batch{}).ok());
  CHECK(l->version() == 0);
  // kl_coef without a reference model, an unknown LoRA target: errors name the learner key.
  auto o = base_options();
  o.kl_coef = 0.1;
  auto no_ref = learner::create(tiny_model(1), CausalLM{nullptr}, o);
  REQUIRE_FALSE(no_ref.ok());
  CHECK(no_ref.error().message.find("learner.kl_coef") == 0);
  o = base_options();
  o.lora = true;
  o.lora_targets = {"qq_proj"};
  auto bad_lora = learner::create(tiny_model(1), CausalLM{nullptr}, o);
  REQUIRE_FALSE(bad_lora.ok());
  CHECK(bad_lora.error().message.find("learner.lora_targets") == 0);
}

TEST_CASE("old log-probs: auto takes the behaviour's when on-policy and recomputes for stale samples") {
  auto o = base_options();
  o.old_log_probs = old_log_probs_source::automatic;
  auto l = make_learner(o, 8, false);
  auto batch = make_batch(l->model(), 4, 2, 3, 0.2, {1.0, 0.0, 0.5});
  auto on = l->grpo_step(batch); // versions 0 == learner's 0
  REQUIRE(on.ok());
  CHECK_FALSE(on->recomputed_old);
  CHECK(on->ratio_mean != doctest::Approx(1.0).epsilon(1e-4)); // the jittered behaviour is the denominator
  auto stale = l->grpo_step(batch); // still version 0, learner now at 1
  REQUIRE(stale.ok());
  CHECK(stale->recomputed_old);
  CHECK(stale->ratio_mean == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(stale->is_weight_mean != doctest::Approx(1.0).epsilon(1e-4));
  CHECK(stale->version == 2);
}

TEST_CASE("resume: a restored learner's next updates equal the uninterrupted run's within 1e-6") {
  for (int variant = 0; variant < 3; ++variant) {
    const char* names[] = {"float32 full", "bfloat16 full", "float32 LoRA"};
    CAPTURE(names[variant]);
    auto o = base_options();
    o.old_log_probs = old_log_probs_source::behaviour; // the loss depends on the current weights
    o.kl_coef = 0.02;
    o.warmup_steps = 2;
    o.schedule = lr_schedule::cosine;
    o.total_steps = 8;
    o.weight_decay = 0.01;
    o.dtype = variant == 1 ? "bfloat16" : "float32";
    o.lora = variant == 2;
    o.lora_rank = 4;
    temp_dir tmp;
    const auto dir = tmp.path() / "checkpoints" / "step-3";
    auto a = make_learner(o, 12, true);
    auto batch = make_batch(a->model(), 21, 2, 4, 0.2, {1.0, 0.0, 0.3, 0.7});
    for (int i = 0; i < 3; ++i)
      REQUIRE(a->grpo_step(batch).ok());
    REQUIRE(save_checkpoint(*a, dir).ok());
    CHECK(fs::exists(dir / "manifest.json"));
    CHECK_FALSE(fs::exists(tmp.path() / "checkpoints" / ".step-3.tmp"));
    const auto draw_a = torch::rand({4});
    std::vector<double> uninterrupted;
    for (int i = 0; i < 2; ++i) {
      auto m = a->grpo_step(batch);
      REQUIRE(m.ok());
      uninterrupted.push_back(m->loss);
    }

    auto b = make_learner(o, 12, true);
    auto control = b->grpo_step(batch); // a learner that did not restore: a different loss
    REQUIRE(control.ok());
    auto c = make_learner(o, 12, true);
    auto info = load_checkpoint(*c, dir);
    REQUIRE(info.ok());
    CHECK(info->version == 3);
    CHECK(info->steps == 3);
    CHECK(c->version() == 3);
    CHECK(c->steps() == 3);
    CHECK(torch::equal(torch::rand({4}), draw_a)); // the generator continues where it was saved
    std::vector<double> resumed;
    for (int i = 0; i < 2; ++i) {
      auto m = c->grpo_step(batch);
      REQUIRE(m.ok());
      resumed.push_back(m->loss);
    }
    MESSAGE(std::string{names[variant]}, ": L4 ", uninterrupted[0], ", L5 ", uninterrupted[1], ", |resumed - "
            "uninterrupted| ", std::abs(resumed[0] - uninterrupted[0]), " and ", std::abs(resumed[1] - uninterrupted[1]),
            " (a learner that did not restore: L4 ", control->loss, ")");
    CHECK(std::abs(resumed[0] - uninterrupted[0]) <= 1e-6);
    CHECK(std::abs(resumed[1] - uninterrupted[1]) <= 1e-6);
    CHECK(std::abs(control->loss - uninterrupted[0]) > 1e-4);
    CHECK(max_param_diff(a->model(), c->model()) <= 1e-6);
    CHECK(c->version() == 5);
  }
}

TEST_CASE("checkpoints: damaged, truncated or mismatched ones are refused, naming the file") {
  auto o = base_options();
  temp_dir tmp;
  const auto good = tmp.path() / "good";
  auto l = make_learner(o, 13, false);
  auto batch = make_batch(l->model(), 2, 2, 2, 0.0, {1.0, 0.0});
  REQUIRE(l->grpo_step(batch).ok());
  REQUIRE(save_checkpoint(*l, good).ok());
  CHECK(save_checkpoint(*l, good).error().code == errc::invalid_arg); // never over an existing one
  REQUIRE(verify_checkpoint(good).ok());

  auto damaged = [&](const std::string& name, auto&& damage) {
    const auto dir = tmp.path() / name;
    fs::copy(good, dir, fs::copy_options::recursive);
    damage(dir);
    auto fresh = make_learner(o, 13, false);
    auto before = snapshot(fresh->model());
    auto r = load_checkpoint(*fresh, dir);
    CHECK(fresh->version() == 0);
    CHECK(fresh->steps() == 0);
    for (const auto& item : fresh->model().named_parameters(true))
      CHECK(torch::equal(item.value(), before.at(item.key())));
    return r;
  };
  auto flipped = damaged("flipped", [](const fs::path& dir) {
    std::fstream f(dir / "optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char c;
    f.get(c);
    f.seekp(-5, std::ios::end);
    f.put(static_cast<char>(c ^ 0x40));
  });
  REQUIRE_FALSE(flipped.ok());
  CHECK(flipped.error().code == errc::corrupt);
  CHECK(flipped.error().message.find("optimizer.safetensors") != std::string::npos);

  auto truncated = damaged("truncated", [](const fs::path& dir) {
    fs::resize_file(dir / "model" / "model.safetensors", fs::file_size(dir / "model" / "model.safetensors") - 100);
  });
  REQUIRE_FALSE(truncated.ok());
  CHECK(truncated.error().code == errc::corrupt);
  CHECK(truncated.error().message.find("model/model.safetensors") != std::string::npos);
  CHECK(truncated.error().message.find("truncated") != std::string::npos);

  auto no_manifest = damaged("unfinished", [](const fs::path& dir) { fs::remove(dir / "manifest.json"); });
  REQUIRE_FALSE(no_manifest.ok());
  CHECK(no_manifest.error().code == errc::not_found);
  CHECK(no_manifest.error().message.find("manifest.json") != std::string::npos);

  auto missing = damaged("missing", [](const fs::path& dir) { fs::remove(dir / "model" / "config.json"); });
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find("model/config.json") != std::string::npos);

  // A full fine-tuning checkpoint into a LoRA learner: refused by key.
  auto lo = o;
  lo.lora = true;
  auto lora = make_learner(lo, 13, false);
  auto r = load_checkpoint(*lora, good);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::config);
  CHECK(r.error().message.find("learner.lora") != std::string::npos);

  // The model directory of a checkpoint is an ordinary HF model.
  auto exported = load_model(good / "model");
  REQUIRE(exported.ok());
  CHECK(max_param_diff(**exported, l->model()) == 0.0);
}

TEST_CASE("fresh moments: after reset_moments an update equals a new optimiser's, and a checkpoint keeps the reset") {
  auto o = base_options(); // constant learning rate: the schedule's position does not matter here
  o.old_log_probs = old_log_probs_source::behaviour;
  auto a = make_learner(o, 31, false);
  auto first = make_batch(a->model(), 41, 2, 4, 0.2, {1.0, 0.0, 0.3, 0.7});
  auto second = make_batch(a->model(), 42, 2, 4, 0.2, {0.2, 0.9, 0.0, 0.5});
  for (int i = 0; i < 3; ++i)
    REQUIRE(a->grpo_step(first).ok());
  const auto before = snapshot(a->model());
  auto carried = make_learner(o, 31, false); // the same three updates, moments carried over
  for (int i = 0; i < 3; ++i)
    REQUIRE(carried->grpo_step(first).ok());
  CHECK(max_param_diff(a->model(), carried->model()) == 0.0);

  a->reset_moments();
  CHECK(a->optimizer().moments_since() == 3);
  CHECK(a->steps() == 3); // the schedule's position goes on
  for (const auto& [name, m] : a->optimizer().moments())
    CHECK(m.abs().max().item<double>() == 0.0);
  REQUIRE(a->grpo_step(second).ok());

  // A new learner on the weights before the reset, one update on the same batch.
  auto fresh = make_learner(o, 99, false);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : fresh->model().named_parameters(true))
      item.value().copy_(before.at(item.key()));
    fresh->optimizer().sync_masters();
  }
  REQUIRE(fresh->grpo_step(second).ok());
  REQUIRE(carried->grpo_step(second).ok());
  const double with_reset = max_param_diff(a->model(), fresh->model());
  const double without = max_param_diff(carried->model(), fresh->model());
  MESSAGE("after the reset |a - fresh| = ", with_reset, "; moments carried over: ", without);
  CHECK(with_reset <= 1e-6);
  CHECK(without > 1e-4);

  // A checkpoint after the reset restores it: the next updates match the uninterrupted ones.
  temp_dir tmp;
  REQUIRE(save_checkpoint(*a, tmp.path() / "ck").ok());
  auto b = make_learner(o, 31, false);
  auto info = load_checkpoint(*b, tmp.path() / "ck");
  REQUIRE(info.ok());
  CHECK(info->moments_since == 3);
  CHECK(b->optimizer().moments_since() == 3);
  REQUIRE(a->grpo_step(first).ok());
  REQUIRE(b->grpo_step(first).ok());
  CHECK(max_param_diff(a->model(), b->model()) <= 1e-6);
}

TEST_CASE("KL reference: RL after SFT takes it from the policy once, and a checkpoint keeps it") {
  auto o = base_options();
  o.kl_coef = 0.1;
  std::mt19937_64 rng(11);
  std::vector<sft_example> examples;
  for (int i = 0; i < 4; ++i)
    examples.push_back({random_tokens(rng, 3 + i), random_tokens(rng, 2 + i)});

  // RL alone: the reference stays the model given to create().
  {
    auto l = make_learner(o, 51, true);
    const auto given = snapshot(*l->reference());
    REQUIRE(l->grpo_step(make_batch(l->model(), 61, 2, 4, 0.0, {1.0, 0.0, 0.3, 0.7})).ok());
    CHECK(l->reference_since() == 0);
    CHECK(l->sft_until() == 0);
    for (const auto& item : l->reference()->named_parameters(true))
      CHECK(max_abs_diff(item.value(), given.at(item.key())) == 0.0);
  }

  auto a = make_learner(o, 51, true);
  for (int i = 0; i < 2; ++i)
    REQUIRE(a->sft_step(examples).ok());
  CHECK(a->sft_until() == 2);
  CHECK(a->reference_since() == 0);
  const auto after_sft = snapshot(a->model());
  CHECK(max_param_diff(*a->reference(), a->model()) > 1e-3); // still the other model given to create()

  auto batch = make_batch(a->model(), 62, 2, 4, 0.0, {1.0, 0.0, 0.3, 0.7});
  auto m = a->grpo_step(batch);
  REQUIRE(m.ok());
  CHECK(m->kl == doctest::Approx(0.0).epsilon(1e-9).scale(1.0)); // the policy before the update is the reference
  CHECK(a->reference_since() == 2);
  for (const auto& item : a->reference()->named_parameters(true))
    CHECK(max_abs_diff(item.value(), after_sft.at(item.key())) == 0.0);
  REQUIRE(a->grpo_step(batch).ok()); // not taken again: it stays the policy after SFT
  for (const auto& item : a->reference()->named_parameters(true))
    CHECK(max_abs_diff(item.value(), after_sft.at(item.key())) == 0.0);
  CHECK(max_param_diff(*a->reference(), a->model()) > 0.0);

  // A checkpoint keeps the reference; a learner restored from it does not take it again.
  temp_dir tmp;
  REQUIRE(save_checkpoint(*a, tmp.path() / "ck").ok());
  CHECK(fs::exists(tmp.path() / "ck" / "reference.safetensors"));
  auto b = make_learner(o, 51, true);
  auto info = load_checkpoint(*b, tmp.path() / "ck");
  REQUIRE_MESSAGE(info.ok(), info.error().to_string());
  CHECK(info->sft_until == 2);
  CHECK(info->reference_since == 2);
  CHECK(max_param_diff(*b->reference(), *a->reference()) == 0.0);
  REQUIRE(a->grpo_step(batch).ok());
  REQUIRE(b->grpo_step(batch).ok());
  CHECK(max_param_diff(a->model(), b->model()) <= 1e-6);
  CHECK(max_param_diff(*b->reference(), *a->reference()) == 0.0);

  // A checkpoint that names a reference but lacks its file is refused.
  fs::remove(tmp.path() / "ck" / "reference.safetensors");
  auto damaged = load_checkpoint(*make_learner(o, 51, true), tmp.path() / "ck");
  REQUIRE_FALSE(damaged.ok());
  CHECK(damaged.error().message.find("reference.safetensors") != std::string::npos);
}

TEST_CASE("a sample's given advantage replaces its group's: the same values give the same update") {
  // Rewards 1, 0, 2, 0 in each group; the update with each sample's advantage given as the value
  // its group would compute is the update without (max parameter difference 0 up to rounding).
  auto o = base_options();
  auto plain = make_learner(o, 5, false), given = make_learner(o, 5, false);
  auto batch = make_batch(plain->model(), 31, 2, 4, 0.0, {1.0, 0.0, 2.0, 0.0});
  auto explicit_batch = batch;
  for (auto& g : explicit_batch.groups) {
    std::vector<double> r;
    for (const auto& s : g.samples)
      r.push_back(s.reward);
    const auto adv = group_advantages(r, o.std_normalize, o.std_eps);
    for (std::size_t s = 0; s < g.samples.size(); ++s) {
      g.samples[s].advantage = adv[s];
      g.samples[s].reward = 0.0; // not used where the advantage is given
    }
  }
  REQUIRE(plain->grpo_step(batch).ok());
  REQUIRE(given->grpo_step(explicit_batch).ok());
  CHECK(max_param_diff(plain->model(), given->model()) < 1e-7);
  // An infinite advantage is refused, naming the group and sample.
  auto bad = explicit_batch;
  bad.groups[1].samples[2].advantage = std::numeric_limits<double>::infinity();
  auto r = make_learner(o, 5, false)->grpo_step(bad);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("group 1 sample 2 has an infinite advantage") != std::string::npos);
}

TEST_CASE("multi-turn episodes train turn by turn: each turn after its context, with its turn's advantage") {
  // Two episodes of a group: A fails its first turn (reward 0) and then reaches 2; B reaches 1 at
  // once and ends. Discounted returns (gamma 1): A 2, 2; B 1. GRPO per turn: turn 0 has A and B
  // (returns 2 and 1: advantages +0.707 and -0.707 with std 0.707); turn 1 has A alone (0).
  std::mt19937_64 rng(3);
  auto l = make_learner(base_options(), 9, false);
  auto lp_of = [&](const std::vector<std::int32_t>& context, const std::vector<std::int32_t>& completion) {
    auto lp = teacher_forced_log_probs(l->model(), context, completion, 1.0);
    std::vector<float> out;
    for (std::int64_t t = 0; t < lp.size(0); ++t)
      out.push_back(static_cast<float>(lp[t].item<double>()));
    return out;
  };
  scored_episode a, b;
  a.tokens.prompt = b.tokens.prompt = random_tokens(rng, 5);
  a.tokens.completions = {random_tokens(rng, 4), random_tokens(rng, 3)};
  a.tokens.feedback = {random_tokens(rng, 6)};
  a.rewards = {0.0, 2.0};
  b.tokens.completions = {random_tokens(rng, 4)};
  b.rewards = {1.0};
  auto context1 = a.tokens.prompt;
  context1.insert(context1.end(), a.tokens.completions[0].begin(), a.tokens.completions[0].end());
  context1.insert(context1.end(), a.tokens.feedback[0].begin(), a.tokens.feedback[0].end());
  a.behaviour_log_probs = {lp_of(a.tokens.prompt, a.tokens.completions[0]), lp_of(context1, a.tokens.completions[1])};
  b.behaviour_log_probs = {lp_of(b.tokens.prompt, b.tokens.completions[0])};
  episode_options opt;
  opt.gamma = 1.0;
  opt.eps = 0.0;
  const std::vector<scored_episode> eps{a, b};
  auto groups = episode_groups(eps, opt, l->version());
  REQUIRE(groups.ok());
  REQUIRE(groups->size() == 3); // A turn 0, A turn 1, B turn 0
  CHECK((*groups)[0].prompt == a.tokens.prompt);
  CHECK((*groups)[1].prompt == context1); // the feedback is context, never a completion
  CHECK((*groups)[1].samples[0].completion == a.tokens.completions[1]);
  CHECK((*groups)[0].samples[0].reward == 2.0);
  CHECK((*groups)[0].samples[0].advantage == doctest::Approx(1.0 / std::sqrt(2.0)));
  CHECK((*groups)[1].samples[0].advantage == 0.0);
  CHECK((*groups)[2].samples[0].advantage == doctest::Approx(-1.0 / std::sqrt(2.0)));
  // The update raises A's first answer, lowers B's, and leaves A's second (advantage 0) to the rest.
  const double a0 = sequence_log_likelihood(l->model(), (*groups)[0], (*groups)[0].samples[0]);
  const double b0 = sequence_log_likelihood(l->model(), (*groups)[2], (*groups)[2].samples[0]);
  grpo_batch batch;
  batch.groups = *groups;
  for (int step = 0; step < 5; ++step)
    REQUIRE(l->grpo_step(batch).ok());
  CHECK(sequence_log_likelihood(l->model(), (*groups)[0], (*groups)[0].samples[0]) > a0);
  CHECK(sequence_log_likelihood(l->model(), (*groups)[2], (*groups)[2].samples[0]) < b0);
  // Episodes whose parts do not line up are refused, naming the episode.
  auto broken = eps;
  broken[1].rewards.push_back(1.0);
  CHECK(episode_groups(broken, opt, 0).error().message.find("episode 1: 1 turns, 2 rewards") != std::string::npos);
}

TEST_CASE("episode rows after the contexts the engine was given: returns and TRLOO advantages by hand") {
  // Episode A: two turns, rewards 0 and 2; episode B: one turn, reward 0.2. Discounted at 0.5:
  // A's returns 0 + 0.5 * 2 = 1 and 2, B's 0.2. TRLOO at turn 0: A 1 - 0.2 = 0.8, B 0.2 - 1 =
  // -0.8; at turn 1 only A: 0. Each row's prompt is its context as given (a shortened history
  // included), not one rebuilt from the episode's tokens.
  scored_episode a, b;
  a.tokens.completions = {{7, 8}, {9}};
  a.behaviour_log_probs = {{-0.5f, -0.25f}, {-1.0f}};
  a.rewards = {0.0, 2.0};
  a.contexts = {{1, 2, 3}, {1, 2, 3, 4, 5}};
  b.tokens.completions = {{6}};
  b.behaviour_log_probs = {{-2.0f}};
  b.rewards = {0.2};
  b.contexts = {{1, 2, 3}};
  episode_options opt;
  opt.returns = turn_return_kind::discounted;
  opt.gamma = 0.5;
  opt.advantages = turn_advantage_kind::trloo;
  const std::vector<scored_episode> eps{a, b};
  auto groups = episode_groups(eps, opt, 7);
  REQUIRE(groups.ok());
  REQUIRE(groups->size() == 3);
  const std::vector<std::vector<std::int32_t>> prompts{{1, 2, 3}, {1, 2, 3, 4, 5}, {1, 2, 3}};
  const std::vector<double> returns{1.0, 2.0, 0.2}, advantages{0.8, 0.0, -0.8};
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    const auto& g = (*groups)[i];
    CHECK(g.prompt == prompts[i]);
    CHECK(g.policy_version == 7);
    REQUIRE(g.samples.size() == 1);
    CHECK(g.samples[0].reward == doctest::Approx(returns[i]).epsilon(1e-12));
    CHECK(g.samples[0].advantage == doctest::Approx(advantages[i]).epsilon(1e-12));
  }
  CHECK((*groups)[1].samples[0].completion == std::vector<std::int32_t>{9});
  CHECK((*groups)[1].samples[0].behaviour_log_probs == std::vector<float>{-1.0f});
  // Contexts that do not line up with the turns are refused, naming the episode.
  auto broken = eps;
  broken[0].contexts.pop_back();
  CHECK(episode_groups(broken, opt, 0).error().message.find("episode 0: 2 turns and 1 contexts") != std::string::npos);
  broken = eps;
  broken[1].contexts[0].clear();
  CHECK(episode_groups(broken, opt, 0).error().message.find("episode 1: turn 0 has an empty context") !=
        std::string::npos);
}

TEST_CASE("checkpoints: a save and a load report their phases, and checksums count every byte of the files") {
  auto o = base_options();
  temp_dir tmp;
  auto l = make_learner(o, 17, false);
  std::mutex mtx;
  std::vector<std::tuple<std::string, std::uint64_t, std::uint64_t>> heard;
  auto record = [&](std::string_view what, std::uint64_t done, std::uint64_t total) {
    std::lock_guard guard{mtx};
    heard.emplace_back(std::string{what}, done, total);
  };
  auto phases = [&] {
    std::vector<std::string> out;
    for (const auto& [what, done, total] : heard) {
      CHECK(done <= total);
      if (out.empty() || out.back() != what)
        out.push_back(what);
    }
    return out;
  };
  auto last_of = [&](const std::string& phase) {
    std::pair<std::uint64_t, std::uint64_t> last{0, 0};
    for (const auto& [what, done, total] : heard)
      if (what == phase)
        last = {std::max(last.first, done), total};
    return last;
  };
  const auto dir = tmp.path() / "ck";
  REQUIRE(save_checkpoint(*l, dir, {}, record).ok());
  CHECK(phases() == std::vector<std::string>{"writing the model", "writing the optimiser state", "checksumming"});
  std::uint64_t bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "manifest.json")
      bytes += e.file_size();
  CHECK(last_of("checksumming") == std::pair{bytes, bytes});

  heard.clear();
  auto b = make_learner(o, 18, false);
  REQUIRE(load_checkpoint(*b, dir, record).ok());
  CHECK(phases() == std::vector<std::string>{"checking", "reading the optimiser state", "reading the weights"});
  CHECK(last_of("checking") == std::pair{bytes, bytes});
  const auto opt = fs::file_size(dir / "optimizer.safetensors");
  CHECK(last_of("reading the optimiser state") == std::pair{opt, opt});
}
