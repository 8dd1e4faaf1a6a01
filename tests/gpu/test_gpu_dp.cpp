// tests/gpu/test_gpu_dp.cpp: the NCCL communicator on every visible GPU (one thread per GPU):
// collectives against their definitions, a missing rank's timeout, data-parallel learners and
// ZeRO-1 against one GPU given the whole batch, weight sync from a learner GPU to an engine GPU.
#include <doctest/doctest.h>

#include <torch/torch.h>
#include <c10/cuda/CUDAGuard.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>

#include "policy/distributed/collective.hpp"
#include "policy/training/learner.hpp"
#include "policy/distributed/weight_sync.hpp"
#include "tests/unit/policy/policy_test_util.hpp"

using namespace crucible;
using namespace crucible::policy;
using namespace crucible::policy::testing;
using namespace std::chrono_literals;

namespace {

// NVLink multicast stays off unless the environment asks for it (shared hosts; see
// tools/bench/bench_learner.cpp).
const bool no_nvls = [] { return ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0) == 0; }();

int gpus() { return static_cast<int>(torch::cuda::device_count()); }

template <class F>
void run_ranks(int n, F&& f) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&f, r] { f(r); });
  for (auto& t : threads)
    t.join();
}

// One NCCL communicator per GPU, rank r on cuda:r, made concurrently (creation is collective).
std::vector<std::shared_ptr<communicator>> nccl_group(int n, std::chrono::milliseconds timeout = 120s) {
  auto id = nccl_id::generate();
  REQUIRE(id.ok());
  // The id as the coordinator would send it: text.
  auto received = nccl_id::from_hex(id->to_hex());
  REQUIRE(received.ok());
  std::vector<result<std::shared_ptr<communicator>>> made(n, crucible::error{errc::cancelled, "not run"});
  // The ranks are threads of this process: they launch together, as in a run (launch_rendezvous).
  auto together = launch_rendezvous::create(n, timeout);
  run_ranks(n, [&](int r) { made[r] = make_nccl_communicator(*received, r, n, r, timeout, together); });
  std::vector<std::shared_ptr<communicator>> out;
  for (auto& m : made) {
    REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
    out.push_back(*m);
  }
  return out;
}

CausalLM tiny_model(std::uint64_t seed, torch::Device device) {
  auto c = preset_config("tiny", model_family::qwen2, 300);
  REQUIRE(c.ok());
  c->hidden_size = 64, c->num_heads = 4, c->num_kv_heads = 2, c->head_dim = 16, c->num_layers = 2;
  c->intermediate_size = 128;
  c->tie_word_embeddings = false;
  auto m = scaled_random_model(*c, seed, 1.0);
  m->to(device);
  return m;
}

grpo_batch make_batch(CausalLMImpl& model, std::uint64_t seed, int groups, int g) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(1, 299), prompt_len(2, 8), completion_len(1, 9);
  std::uniform_real_distribution<double> reward(-1.0, 2.0), jitter(-0.3, 0.3);
  grpo_batch batch;
  for (int i = 0; i < groups; ++i) {
    grpo_group group;
    for (int t = prompt_len(rng); t > 0; --t)
      group.prompt.push_back(tok(rng));
    for (int s = 0; s < g; ++s) {
      grpo_sample sample;
      for (int t = completion_len(rng); t > 0; --t)
        sample.completion.push_back(tok(rng));
      auto lp = teacher_forced_log_probs(model, group.prompt, sample.completion, 1.0).cpu();
      for (std::int64_t t = 0; t < lp.size(0); ++t)
        sample.behaviour_log_probs.push_back(static_cast<float>(lp[t].item<double>() + jitter(rng)));
      sample.reward = reward(rng);
      group.samples.push_back(std::move(sample));
    }
    batch.groups.push_back(std::move(group));
  }
  return batch;
}

grpo_batch share(const grpo_batch& batch, int rank, int ranks) {
  grpo_batch out;
  const auto n = batch.groups.size();
  for (std::size_t i = n * rank / ranks; i < n * (rank + 1) / ranks; ++i)
    out.groups.push_back(batch.groups[i]);
  return out;
}

double max_param_diff(CausalLMImpl& a, CausalLMImpl& b) {
  auto pb = b.named_parameters(true);
  double worst = 0;
  for (const auto& item : a.named_parameters(true))
    worst = std::max(worst, max_abs_diff(item.value().cpu(), pb[item.key()].cpu()));
  return worst;
}

} // namespace

TEST_CASE("NCCL collectives on every visible GPU match their definitions") {
  const int n = gpus();
  auto comms = nccl_group(n);
  std::vector<std::string> errors(n);
  std::vector<torch::Tensor> sum(n), avg(n), mx(n), scattered(n), gathered(n), bcast(n), bf16(n);
  run_ranks(n, [&](int r) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(r));
    auto& c = *comms[r];
    const auto on = torch::TensorOptions().device(c.device());
    auto expect = [&](result<work> w) {
      auto x = w ? w->wait() : result<void>{w.error()};
      if (!x)
        errors[r] += x.error().message + "; ";
    };
    auto base = torch::arange(0, 1 << 20, on.dtype(torch::kFloat)) * static_cast<float>(r + 1);
    sum[r] = base.clone();
    avg[r] = base.clone();
    mx[r] = base.clone();
    expect(c.all_reduce(sum[r], reduce_op::sum));
    expect(c.all_reduce(avg[r], reduce_op::avg));
    expect(c.all_reduce(mx[r], reduce_op::max));
    scattered[r] = torch::zeros({(1 << 20) / 4}, on.dtype(torch::kFloat));
    auto in = torch::ones({(1 << 20) / 4 * n}, on.dtype(torch::kFloat)) * static_cast<float>(r);
    expect(c.reduce_scatter(in, scattered[r], reduce_op::sum));
    gathered[r] = torch::zeros({3 * n}, on.dtype(torch::kFloat));
    expect(c.all_gather(torch::full({3}, static_cast<float>(r), on.dtype(torch::kFloat)), gathered[r]));
    bcast[r] = torch::full({1000}, static_cast<float>(r + 10), on.dtype(torch::kFloat));
    expect(c.broadcast(bcast[r], n - 1));
    bf16[r] = torch::ones({4096}, on.dtype(torch::kBFloat16));
    expect(c.all_reduce(bf16[r], reduce_op::sum));
    if (auto b = c.barrier(); !b)
      errors[r] += b.error().message;
    for (auto* t : {&sum[r], &avg[r], &mx[r], &scattered[r], &gathered[r], &bcast[r], &bf16[r]})
      *t = t->cpu();
  });
  const double ranks_sum = n * (n + 1) / 2.0;
  auto base = torch::arange(0, 1 << 20, torch::kFloat);
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(errors[r].empty());
    CHECK(torch::allclose(sum[r], base * ranks_sum));
    CHECK(torch::allclose(avg[r], base * (ranks_sum / n)));
    CHECK(torch::equal(mx[r], base * static_cast<float>(n)));
    CHECK(torch::equal(scattered[r], torch::full({(1 << 20) / 4}, static_cast<float>(n * (n - 1) / 2))));
    for (int k = 0; k < n; ++k)
      CHECK(torch::equal(gathered[r].narrow(0, 3 * k, 3), torch::full({3}, static_cast<float>(k))));
    CHECK(torch::equal(bcast[r], torch::full({1000}, static_cast<float>(n - 1 + 10))));
    CHECK(torch::equal(bf16[r].to(torch::kFloat), torch::full({4096}, static_cast<float>(n))));
  }
}

TEST_CASE("an NCCL rank that never joins: creation fails with a timeout naming the rank, not a hang") {
  auto id = nccl_id::generate();
  REQUIRE(id.ok());
  const auto start = std::chrono::steady_clock::now();
  // Rank 0 of 2; rank 1 never calls in.
  auto c = make_nccl_communicator(*id, 0, 2, 0, 3s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE_FALSE(c.ok());
  MESSAGE(c.error().message, " (after ", seconds, " s)");
  CHECK(c.error().code == errc::timeout);
  CHECK(c.error().message.find("rank 0 of 2 on cuda:0") != std::string::npos);
  CHECK(c.error().message.find("3 s") != std::string::npos);
  CHECK(seconds < 30);
}

TEST_CASE("NCCL ranks of one process launch together: a rank that closes its communicator fails its peers' next collective at once") {
  const int n = gpus();
  if (n < 2) {
    MESSAGE("one GPU: skipped");
    return;
  }
  auto comms = nccl_group(n, 60s);
  // Both launch and complete one collective together.
  std::vector<result<void>> first(n, crucible::error{errc::cancelled, "not run"});
  run_ranks(n, [&](int r) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(r));
    auto t = torch::ones({1024}, torch::TensorOptions().device(torch::Device(torch::kCUDA, r)));
    auto w = comms[r]->all_reduce(t, reduce_op::sum);
    first[r] = w ? w->wait() : result<void>(w.error());
  });
  for (int r = 0; r < n; ++r)
    CHECK_MESSAGE(first[r].ok(), (first[r].ok() ? "" : first[r].error().message));
  // The last rank closes its communicator; rank 0's next collective is refused before its kernel
  // is launched (a launched one would wait on the device for the rank that left).
  comms.back().reset();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(0));
  const auto start = std::chrono::steady_clock::now();
  auto t = torch::ones({1024}, torch::TensorOptions().device(torch::Device(torch::kCUDA, 0)));
  auto w = comms[0]->all_reduce(t, reduce_op::sum);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE_FALSE(w.ok());
  MESSAGE(w.error().message, " (after ", seconds, " s)");
  CHECK(w.error().code == errc::cancelled);
  CHECK(w.error().message.find("rank " + std::to_string(n - 1) + " left the group's launches: its communicator was closed") !=
        std::string::npos);
  CHECK(seconds < 10);
}

TEST_CASE("data parallel over NCCL: every GPU given a share updates as one GPU given the whole batch") {
  const int n = gpus();
  learner_options o;
  o.lr = 1e-3;
  o.eps = 1e-6; // see test_data_parallel.cpp: bounds how far rounding near zero moves a weight
  o.micro_batch_tokens = 64;
  o.bucket_mb = 0.05;
  o.old_log_probs = old_log_probs_source::behaviour;
  auto single = learner::create(tiny_model(11, torch::Device(torch::kCUDA, 0)), CausalLM{nullptr}, o, 7);
  REQUIRE(single.ok());
  auto batch = make_batch((*single)->model(), 5, 4 * n, 4);
  auto expected = (*single)->grpo_step(batch);
  REQUIRE(expected.ok());
  for (bool zero1 : {false, true}) {
    CAPTURE(zero1);
    o.zero1 = zero1;
    auto comms = nccl_group(n);
    std::vector<std::unique_ptr<learner>> ls(n);
    std::vector<result<step_metrics>> got(n, crucible::error{errc::cancelled, "not run"});
    std::vector<std::string> errors(n);
    run_ranks(n, [&](int r) {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(r));
      auto l = learner::create(tiny_model(11 + r, torch::Device(torch::kCUDA, r)), CausalLM{nullptr}, o, 7);
      if (!l) {
        errors[r] = l.error().message;
        return;
      }
      ls[r] = std::move(*l);
      if (auto j = ls[r]->join_data_parallel(comms[r]); !j) {
        errors[r] = j.error().message;
        return;
      }
      got[r] = ls[r]->grpo_step(share(batch, r, n));
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      REQUIRE_MESSAGE(errors[r].empty(), errors[r]);
      REQUIRE_MESSAGE(got[r].ok(), (got[r].ok() ? "" : got[r].error().message));
      CHECK(got[r]->tokens == expected->tokens);
      CHECK(got[r]->loss == doctest::Approx(expected->loss).epsilon(1e-4));
      const double d = max_param_diff(ls[r]->model(), (*single)->model());
      MESSAGE(n, " GPUs, zero1 ", zero1, ", rank ", r, ": max |parameter difference| from one GPU ", d);
      CHECK(d <= 1e-5);
      CHECK(max_param_diff(ls[r]->model(), ls[0]->model()) == 0.0);
      CHECK(ls[r]->data_parallel_state()->last_stats().issued_during_backward > 0);
    }
  }
}

TEST_CASE("weight sync over NCCL: an engine GPU receives the learner GPU's bf16 weights, and a same-GPU engine shares them") {
  const int n = gpus();
  auto make = [](std::uint64_t seed, int device) {
    auto m = tiny_model(seed, torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device)));
    m->to(torch::kBFloat16);
    return m;
  };
  if (n >= 2) {
    auto comms = nccl_group(2);
    CausalLM models[2] = {make(1, 0), make(2, 1)};
    std::vector<result<weight_sync_stats>> stats(2, crucible::error{errc::cancelled, "not run"});
    run_ranks(2, [&](int r) {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(r));
      auto ws = weight_sync::create(comms[r], sync_tensors(*models[r], false), {32 << 10, 0});
      if (!ws) {
        stats[r] = ws.error();
        return;
      }
      stats[r] = r == 0 ? (*ws)->send(17) : (*ws)->receive();
    });
    for (int r = 0; r < 2; ++r)
      REQUIRE_MESSAGE(stats[r].ok(), (stats[r].ok() ? "" : stats[r].error().message));
    CHECK(stats[1]->version == 17);
    CHECK(stats[1]->buckets > 2);
    CHECK(max_param_diff(*models[1], *models[0]) == 0.0);
  } else {
    MESSAGE("one GPU: the cross-GPU weight sync needs two");
  }
  auto learner_model = make(3, 0), engine_model = make(4, 0);
  REQUIRE(share_weights(sync_tensors(*learner_model, false), *engine_model).ok());
  CHECK(max_param_diff(*engine_model, *learner_model) == 0.0);
}
