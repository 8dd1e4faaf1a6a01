// tests/unit/policy/data_parallel_util.hpp: what test_data_parallel.cpp and
// test_data_parallel_gradients.cpp share: ranks as threads of the test process, random GRPO
// batches and their shares, and learners of a tiny model joined in one in-process group.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "policy/distributed/collective.hpp"
#include "policy/distributed/data_parallel.hpp"
#include "policy/training/learner.hpp"
#include "tests/unit/policy/policy_test_util.hpp"

namespace crucible::policy::testing::dp {

using namespace std::chrono_literals;

// Tiny tensors: intra-op threads only add synchronisation (see test_learner.cpp).
inline const bool one_thread = [] {
  torch::set_num_threads(1);
  return true;
}();

// Runs f(rank) on `n` threads at once and joins them.
template <class F>
inline void run_ranks(int n, F&& f) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&f, r] { f(r); });
  for (auto& t : threads)
    t.join();
}

inline std::vector<std::shared_ptr<communicator>> join_all(const std::shared_ptr<inproc_group>& group) {
  std::vector<std::shared_ptr<communicator>> out;
  for (int r = 0; r < group->size(); ++r) {
    auto c = group->join(r);
    REQUIRE(c.ok());
    out.push_back(*c);
  }
  return out;
}

inline std::vector<std::int32_t> random_tokens(std::mt19937_64& rng, int n) {
  std::uniform_int_distribution<int> tok(1, 299);
  std::vector<std::int32_t> out;
  for (int i = 0; i < n; ++i)
    out.push_back(tok(rng));
  return out;
}

// Groups of G completions of random lengths, behaviour log-probs from `model` plus noise.
inline grpo_batch make_batch(CausalLMImpl& model, std::uint64_t seed, int groups, int g, double noise) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> prompt_len(2, 8), completion_len(1, 9);
  std::uniform_real_distribution<double> jitter(-noise, noise), reward(-1.0, 2.0);
  grpo_batch batch;
  for (int i = 0; i < groups; ++i) {
    grpo_group group;
    group.prompt = random_tokens(rng, prompt_len(rng));
    for (int s = 0; s < g; ++s) {
      grpo_sample sample;
      sample.completion = random_tokens(rng, completion_len(rng));
      auto lp = teacher_forced_log_probs(model, group.prompt, sample.completion, 1.0);
      for (std::int64_t t = 0; t < lp.size(0); ++t)
        sample.behaviour_log_probs.push_back(static_cast<float>(lp[t].item<double>() + jitter(rng)));
      sample.reward = reward(rng);
      group.samples.push_back(std::move(sample));
    }
    batch.groups.push_back(std::move(group));
  }
  return batch;
}

// Rank r's share of the groups: contiguous, as even as the count allows.
inline grpo_batch share(const grpo_batch& batch, int rank, int ranks) {
  grpo_batch out;
  out.temperature = batch.temperature;
  const auto n = batch.groups.size();
  for (std::size_t i = n * rank / ranks; i < n * (rank + 1) / ranks; ++i)
    out.groups.push_back(batch.groups[i]);
  return out;
}

inline learner_options base_options() {
  learner_options o;
  o.lr = 1e-3;
  // AdamW's first step moves a weight by lr * g / (|g| + eps): an entry g near zero that differs
  // by rounding by d moves its weight by up to lr * d / eps. The ranks add their micro-batches in
  // another order than one learner does (gradients differ by up to 2e-8 here): with eps = 1e-8
  // the parameters differed by up to 2e-6, with eps = 1e-6 by up to 4e-7.
  o.eps = 1e-6;
  o.grad_clip = 1.0;
  o.micro_batch_tokens = 4096;
  o.bucket_mb = 0.05; // ~52 kB: the tiny model's gradient spreads over several buckets
  o.collective_timeout_s = 30;
  return o;
}

inline std::unique_ptr<learner> make_learner(const learner_options& o, std::uint64_t model_seed) {
  auto l = learner::create(small_qwen2_model(model_seed), CausalLM{nullptr}, o, /*seed=*/7);
  REQUIRE(l.ok());
  return std::move(*l);
}

// `n` learners in one data-parallel group; rank r starts from model seed `seed + r * seed_step`,
// so the initial broadcast is what makes them equal (rank 0's weights, those of a learner of
// `seed`). LoRA's ranks must share their frozen base: seed_step 0.
inline std::vector<std::unique_ptr<learner>> make_group(int n, const learner_options& o, std::uint64_t seed,
                                                 std::chrono::milliseconds timeout = 30s, std::uint64_t seed_step = 1) {
  auto group = inproc_group::create(n, timeout);
  auto comms = join_all(group);
  std::vector<std::unique_ptr<learner>> ls;
  for (int r = 0; r < n; ++r)
    ls.push_back(make_learner(o, seed + static_cast<std::uint64_t>(r) * seed_step));
  std::vector<result<void>> joined(static_cast<std::size_t>(n));
  run_ranks(n, [&](int r) { joined[r] = ls[r]->join_data_parallel(comms[r]); });
  for (auto& j : joined)
    REQUIRE_MESSAGE(j.ok(), (j.ok() ? "" : j.error().message));
  return ls;
}

inline double max_param_diff(CausalLMImpl& a, CausalLMImpl& b) {
  auto pb = b.named_parameters(true);
  double worst = 0;
  for (const auto& item : a.named_parameters(true))
    worst = std::max(worst, max_abs_diff(item.value(), pb[item.key()]));
  return worst;
}

} // namespace crucible::policy::testing::dp
