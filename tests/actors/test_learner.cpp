// tests/actors/test_learner.cpp: learner actors (detached, so on a real actor system, driven by a
// scoped_actor's requests with timeouts) over the in-process communicator and a tiny CPU model:
// two ranks given a global batch update as one learner given all of it, publish the new weights
// to a real engine actor, and fail with errors instead of hanging when a peer never comes or a
// batch is refused.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/engine.hpp"
#include "actors/learner.hpp"
#include "actors/learner_group.hpp"
#include "actors/run_roles.hpp"
#include "policy/memory_plan.hpp"
#include "policy/training/checkpoint.hpp"
#include "policy/distributed/collective.hpp"
#include "policy/model/engine.hpp"
#include "policy/training/learner.hpp"
#include "tests/actors/scripted_policy.hpp"
#include "tests/unit/policy/policy_test_util.hpp"

using namespace crucible;
using namespace crucible::policy::testing;
using namespace std::chrono_literals;

namespace {

const bool one_thread = [] {
  torch::set_num_threads(1); // tiny tensors: intra-op threads only add synchronisation
  return true;
}();

constexpr std::int64_t vocab = 700; // the scripted tokenizer's, so that an engine can serve the model

policy::CausalLM tiny_model(std::uint64_t seed) {
  auto c = policy::preset_config("tiny", policy::model_family::qwen2, vocab);
  REQUIRE(c.ok());
  c->hidden_size = 64, c->num_heads = 4, c->num_kv_heads = 2, c->head_dim = 16, c->num_layers = 2;
  c->intermediate_size = 128;
  c->tie_word_embeddings = false;
  return scaled_random_model(*c, seed, 1.0);
}

learner_options options() {
  learner_options o;
  o.lr = 1e-3;
  o.eps = 1e-6; // see test_data_parallel.cpp: keeps rounding differences of the gradient small
  o.grad_clip = 1.0;
  o.micro_batch_tokens = 4096;
  o.bucket_mb = 0.05;
  o.collective_timeout_s = 30;
  return o;
}

std::shared_ptr<policy::learner> make_learner(std::uint64_t model_seed) {
  auto l = policy::learner::create(tiny_model(model_seed), policy::CausalLM{nullptr}, options(), /*seed=*/7);
  REQUIRE(l.ok());
  return std::shared_ptr<policy::learner>(std::move(*l));
}

std::vector<std::int32_t> random_tokens(std::mt19937_64& rng, int n) {
  std::uniform_int_distribution<int> tok(1, 299);
  std::vector<std::int32_t> out;
  for (int i = 0; i < n; ++i)
    out.push_back(tok(rng));
  return out;
}

// `groups` complete groups of `g` completions as the exemplar actor sends them, behaviour
// log-probs from `model` plus noise, rewards from the verdicts.
learner_batch make_batch(policy::CausalLMImpl& model, std::uint64_t seed, int groups, int g) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> prompt_len(2, 8), completion_len(1, 9);
  std::uniform_real_distribution<double> jitter(-0.3, 0.3), reward(-1.0, 2.0);
  learner_batch batch;
  for (int i = 0; i < groups; ++i) {
    rollout_group group;
    group.group = group_id{static_cast<std::uint64_t>(i + 1)};
    group.task = task_id{"level1/19_ReLU"};
    group.prompt_token_ids = random_tokens(rng, prompt_len(rng));
    for (int s = 0; s < g; ++s) {
      completion c;
      c.token_ids = random_tokens(rng, completion_len(rng));
      auto lp = teacher_forced_log_probs(model, group.prompt_token_ids, c.token_ids, 1.0);
      for (std::int64_t t = 0; t < lp.size(0); ++t)
        c.logprobs.push_back(static_cast<float>(lp[t].item<double>() + jitter(rng)));
      verdict v;
      v.reward = reward(rng);
      group.completions.push_back(std::move(c));
      group.verdicts.push_back(v);
    }
    batch.groups.push_back(std::move(group));
  }
  return batch;
}

// The same groups as the policy learner takes them.
policy::grpo_batch to_policy(const learner_batch& b) {
  policy::grpo_batch out;
  out.temperature = b.temperature;
  for (const auto& g : b.groups) {
    policy::grpo_group pg;
    pg.prompt = g.prompt_token_ids;
    for (std::size_t i = 0; i < g.completions.size(); ++i)
      pg.samples.push_back({g.completions[i].token_ids, g.completions[i].logprobs, g.verdicts[i].reward});
    out.groups.push_back(std::move(pg));
  }
  return out;
}

double max_param_diff(policy::CausalLMImpl& a, policy::CausalLMImpl& b) {
  auto pb = b.named_parameters(true);
  double worst = 0;
  for (const auto& item : a.named_parameters(true))
    worst = std::max(worst, max_abs_diff(item.value(), pb[item.key()]));
  return worst;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct fixture {
  actor_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  temp_dir dir;

  learner_actor spawn(std::shared_ptr<policy::learner> l, learner_actor_spec spec, std::vector<engine_actor> engines = {}) {
    auto a = spawn_learner_actor(sys, learner_actor_deps{std::move(l), std::move(engines), {}}, std::move(spec));
    REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().to_string()));
    spawned.push_back(caf::actor_cast<caf::actor>(*a));
    return *a;
  }

  // Sends `msg` to every actor at once, then collects the replies (or errors) in rank order.
  template <class T>
  std::vector<result<train_report>> step(const std::vector<learner_actor>& ranks, const T& msg) {
    std::vector<decltype(self->request(ranks[0], 60s, msg))> handles;
    for (const auto& a : ranks)
      handles.push_back(self->request(a, 60s, msg));
    std::vector<result<train_report>> out;
    for (auto& h : handles)
      h.receive([&](train_report& r) { out.emplace_back(r); },
                [&](caf::error& e) { out.emplace_back(to_error(e)); });
    return out;
  }

  // The actor system waits for every actor at its end: the detached ones are told to quit.
  std::vector<caf::actor> spawned;

  ~fixture() {
    for (auto& a : spawned)
      self->send_exit(a, caf::exit_reason::user_shutdown);
  }
};

learner_actor_spec rank_spec(int rank, int world, std::shared_ptr<policy::inproc_group> group) {
  learner_actor_spec s;
  s.backend = "inproc";
  s.rank = rank;
  s.world_size = world;
  s.group = std::move(group);
  return s;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "two learner actors take groups r, r+2, ... of a batch and update as one learner, then publish") {
  // The reference: one learner given the whole batch, then SFT examples.
  auto single = make_learner(11);
  const auto batch = make_batch(single->model(), 5, 6, 4);
  sft_batch sft;
  {
    std::mt19937_64 rng(9);
    for (int i = 0; i < 4; ++i) {
      sft.prompts.push_back(random_tokens(rng, 3 + i));
      sft.completions.push_back(random_tokens(rng, 2 + i));
    }
  }
  auto expected = single->grpo_step(to_policy(batch));
  REQUIRE(expected.ok());

  // An engine actor serving rank 0's initial weights; it gets each published version.
  auto l0 = make_learner(11), l1 = make_learner(12); // rank 1 starts elsewhere: the group broadcasts rank 0's
  policy::save_options so;
  so.dtype = torch::kFloat;
  REQUIRE(policy::save_model(l0->model(), dir.path() / "initial", so).ok());
  auto e = policy::engine::load(dir.path() / "initial", {});
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
  auto tok = crucible::testing::scripted_tokenizer({"x"});
  auto engine = spawn_engine_actor(sys, engine_deps{std::shared_ptr<policy::engine>(std::move(*e)), tok, {}}, {});
  REQUIRE(engine.ok());
  spawned.push_back(caf::actor_cast<caf::actor>(*engine));

  auto group = policy::inproc_group::create(2, 30s);
  auto spec0 = rank_spec(0, 2, group);
  spec0.publish_dir = dir.path() / "published";
  std::vector<learner_actor> ranks{spawn(l0, spec0, {*engine}), spawn(l1, rank_spec(1, 2, group))};

  auto got = step(ranks, batch);
  REQUIRE(got.size() == 2);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE_MESSAGE(got[r].ok(), (got[r].ok() ? "" : got[r].error().to_string()));
    const auto& m = *got[r];
    CHECK(m.policy_version == policy_version{1});
    CHECK(m.step == 1);
    CHECK(m.groups == 3);
    CHECK(m.tokens == static_cast<std::uint64_t>(expected->tokens));
    CHECK(m.sequences == static_cast<std::uint64_t>(expected->sequences));
    CHECK(m.loss == doctest::Approx(expected->loss).epsilon(1e-5));
    CHECK(m.grad_norm == doctest::Approx(expected->grad_norm).epsilon(1e-5));
    CHECK(m.mean_reward == doctest::Approx(expected->reward_mean));
    CHECK(m.seconds > 0);
    CHECK_FALSE(m.skipped);
  }
  CHECK(got[0]->loss == got[1]->loss); // the ranks reduce the same numbers in the same order
  CHECK(got[0]->grad_norm == got[1]->grad_norm);
  // Each reply comes after the update: the actors are idle, their learners can be read.
  const double diff = max_param_diff(l0->model(), single->model());
  MESSAGE("max |parameter difference| to one learner: ", diff);
  CHECK(diff <= 1e-6);
  CHECK(max_param_diff(l0->model(), l1->model()) == 0.0);

  // Rank 0 published version 1: the directory holds its weights, and the engine samples with
  // them from its next call on (updates are installed before waiting requests run).
  auto published = policy::load_model(dir.path() / "published" / "v1");
  REQUIRE(published.ok());
  CHECK(max_param_diff(**published, l0->model()) == 0.0);
  generation_request req;
  req.group = group_id{1};
  req.prompt_token_ids = {5, 6, 7};
  req.samples = 1;
  req.params.max_new_tokens = 1;
  self->request(*engine, 60s, req)
    .receive([&](generation_result& r) {
               REQUIRE(r.completions.size() == 1);
               CHECK(r.completions[0].policy_version == policy_version{1});
             },
             [&](caf::error& err) { FAIL(to_error(err).to_string()); });

  // SFT: examples r, r+2 per rank, as one learner given all four.
  std::vector<policy::sft_example> examples;
  for (std::size_t i = 0; i < sft.prompts.size(); ++i)
    examples.push_back({sft.prompts[i], sft.completions[i]});
  auto expected_sft = single->sft_step(examples);
  REQUIRE(expected_sft.ok());
  auto sgot = step(ranks, sft);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE_MESSAGE(sgot[r].ok(), (sgot[r].ok() ? "" : sgot[r].error().to_string()));
    CHECK(sgot[r]->policy_version == policy_version{2});
    CHECK(sgot[r]->groups == 2);
    CHECK(sgot[r]->loss == doctest::Approx(expected_sft->loss).epsilon(1e-5));
  }
  CHECK(max_param_diff(l0->model(), single->model()) <= 1e-6);
  CHECK(std::filesystem::exists(dir.path() / "published" / "v2"));

  // A batch with fewer groups than ranks leaves rank 1 nothing: refused, and rank 0 fails at
  // once with it instead of waiting for the timeout.
  learner_batch one;
  one.groups.push_back(batch.groups[0]);
  auto refused = step(ranks, one);
  REQUIRE_FALSE(refused[0].ok());
  REQUIRE_FALSE(refused[1].ok());
  CHECK(refused[1].error().code == errc::invalid_arg);
  CHECK(contains(refused[1].error().message, "no groups"));
  CHECK(contains(refused[0].error().message, "refused their batch"));
  CHECK(l0->version() == 2);
}

TEST_CASE_FIXTURE(fixture, "groups dealt to the ranks in turn train on train_atom as one learner given all of them") {
  auto single = make_learner(21);
  const auto batch = make_batch(single->model(), 6, 4, 3);
  auto expected = single->grpo_step(to_policy(batch));
  REQUIRE(expected.ok());
  auto l0 = make_learner(21), l1 = make_learner(22);
  auto group = policy::inproc_group::create(2, 30s);
  std::vector<learner_actor> ranks{spawn(l0, rank_spec(0, 2, group)), spawn(l1, rank_spec(1, 2, group))};
  for (std::size_t i = 0; i < batch.groups.size(); ++i) // as the exemplar actor deals them
    self->send(ranks[i % 2], batch.groups[i]);
  auto got = step(ranks, train_atom_v);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE_MESSAGE(got[r].ok(), (got[r].ok() ? "" : got[r].error().to_string()));
    CHECK(got[r]->policy_version == policy_version{1});
    CHECK(got[r]->groups == 2);
    CHECK(got[r]->dropped_stale == 0);
    CHECK(got[r]->loss == doctest::Approx(expected->loss).epsilon(1e-5));
  }
  CHECK(max_param_diff(l0->model(), single->model()) <= 1e-6);
  // Nothing queued any more: both shares are empty and refused, on every rank at once.
  auto empty = step(ranks, train_atom_v);
  CHECK_FALSE(empty[0].ok());
  CHECK_FALSE(empty[1].ok());
  CHECK(l0->version() == 1);
}

TEST_CASE_FIXTURE(fixture, "train_atom drops groups older than max_staleness and trains on the rest alone") {
  // Three updates with max_staleness 1. The third gets two groups sampled at version 0 (two
  // versions old: dropped) and two at version 2 (fresh); it must equal an update on the fresh
  // two alone.
  auto b1 = make_batch(make_learner(31)->model(), 41, 2, 3);
  auto b2 = make_batch(make_learner(31)->model(), 42, 2, 3);
  auto b3 = make_batch(make_learner(31)->model(), 43, 4, 3);
  auto stamp = [](learner_batch& b, std::size_t from, std::size_t to, std::uint64_t v) {
    for (std::size_t i = from; i < to; ++i)
      for (auto& c : b.groups[i].completions)
        c.policy_version = policy_version{v};
  };
  stamp(b2, 0, 2, 1);
  stamp(b3, 0, 2, 0);
  stamp(b3, 2, 4, 2);
  auto single = make_learner(31);
  auto with_versions = [](const learner_batch& b, std::size_t from, std::size_t to) {
    learner_batch part;
    part.temperature = b.temperature;
    part.groups.assign(b.groups.begin() + static_cast<std::ptrdiff_t>(from), b.groups.begin() + static_cast<std::ptrdiff_t>(to));
    auto out = to_policy(part);
    for (std::size_t i = 0; i < out.groups.size(); ++i)
      out.groups[i].policy_version = part.groups[i].completions.front().policy_version.value;
    return out;
  };
  REQUIRE(single->grpo_step(with_versions(b1, 0, 2)).ok());
  REQUIRE(single->grpo_step(with_versions(b2, 0, 2)).ok());
  auto expected = single->grpo_step(with_versions(b3, 2, 4));
  REQUIRE(expected.ok());

  auto l = make_learner(31);
  auto spec = rank_spec(0, 1, policy::inproc_group::create(1, 30s));
  spec.max_staleness = 1;
  std::vector<learner_actor> rank{spawn(l, spec)};
  std::uint64_t dropped_total = 0;
  for (auto* b : {&b1, &b2, &b3}) {
    for (const auto& g : b->groups)
      self->send(rank[0], g);
    auto got = step(rank, train_atom_v);
    REQUIRE_MESSAGE(got[0].ok(), (got[0].ok() ? "" : got[0].error().to_string()));
    dropped_total += got[0]->dropped_stale;
    if (b == &b3) {
      CHECK(got[0]->dropped_stale == 2);
      CHECK(got[0]->groups == 2);
      CHECK(got[0]->loss == doctest::Approx(expected->loss).epsilon(1e-5));
    }
  }
  CHECK(dropped_total == 2);
  CHECK(l->version() == 3);
  CHECK(max_param_diff(l->model(), single->model()) <= 1e-6);
}

TEST_CASE_FIXTURE(fixture, "a learner actor whose peer never arrives fails with a timeout, then at once") {
  auto probe = make_learner(31);
  const auto batch = make_batch(probe->model(), 2, 2, 3);
  auto group = policy::inproc_group::create(2, 500ms); // rank 1 is never spawned
  auto a = spawn(make_learner(31), rank_spec(0, 2, group));
  for (int attempt = 0; attempt < 2; ++attempt) {
    CAPTURE(attempt);
    const auto start = std::chrono::steady_clock::now();
    auto got = step({a}, batch);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    REQUIRE_FALSE(got[0].ok());
    CHECK(got[0].error().code == errc::timeout);
    CHECK(contains(got[0].error().message, "learner rank 0 of 2"));
    CHECK(contains(got[0].error().message, "0.5 s"));
    CHECK(seconds < 10.0);
  }
}

TEST_CASE_FIXTURE(fixture, "a learner group drives two ranks as one learner: each request to every rank, rank 0's reply, a failure by rank") {
  auto single = make_learner(41);
  const auto batch = make_batch(single->model(), 7, 4, 3);
  const auto dealt = make_batch(single->model(), 8, 4, 3);
  auto expected = single->grpo_step(to_policy(batch));
  REQUIRE(expected.ok());

  auto l0 = make_learner(41), l1 = make_learner(42);
  auto group = policy::inproc_group::create(2, 30s);
  auto g = spawn_learner_group(sys, {spawn(l0, rank_spec(0, 2, group)), spawn(l1, rank_spec(1, 2, group))});
  REQUIRE(g.ok());
  spawned.push_back(caf::actor_cast<caf::actor>(*g));
  auto ask = [&](const auto&... msg) {
    result<train_report> out = crucible::error{errc::cancelled, "no reply"};
    self->request(*g, 60s, msg...)
      .receive([&](train_report& r) { out = r; }, [&](caf::error& e) { out = to_error(e); });
    return out;
  };

  // A global batch: rank 0's report (its own group count), both ranks updated as one learner.
  auto got = ask(batch);
  REQUIRE_MESSAGE(got.ok(), (got.ok() ? "" : got.error().to_string()));
  CHECK(got->policy_version == policy_version{1});
  CHECK(got->groups == 2);
  CHECK(got->loss == doctest::Approx(expected->loss).epsilon(1e-5));
  CHECK(max_param_diff(l0->model(), l1->model()) == 0.0);
  CHECK(max_param_diff(l0->model(), single->model()) <= 1e-6);

  // Lone groups are dealt to the ranks in turn; train_atom then trains each rank's queue.
  auto expected_dealt = single->grpo_step(to_policy(dealt));
  REQUIRE(expected_dealt.ok());
  for (const auto& x : dealt.groups)
    self->send(*g, x);
  got = ask(train_atom_v);
  REQUIRE_MESSAGE(got.ok(), (got.ok() ? "" : got.error().to_string()));
  CHECK(got->policy_version == policy_version{2});
  CHECK(got->groups == 2);
  CHECK(got->loss == doctest::Approx(expected_dealt->loss).epsilon(1e-5));
  CHECK(max_param_diff(l0->model(), l1->model()) == 0.0);
  // A second update from weights that already differ by rounding (its old log-probs recomputed
  // from them, its moments carrying the first's): the difference grows a little.
  CHECK(max_param_diff(l0->model(), single->model()) <= 1e-5);

  // reset_atom reaches every rank: an SFT update after it is the same on both.
  self->send(*g, reset_atom_v);
  sft_batch sft;
  sft.prompts = {{5, 6, 7}, {8, 9}};
  sft.completions = {{10, 11}, {12, 13, 14}};
  got = ask(sft);
  REQUIRE_MESSAGE(got.ok(), (got.ok() ? "" : got.error().to_string()));
  CHECK(got->policy_version == policy_version{3});
  CHECK(max_param_diff(l0->model(), l1->model()) == 0.0);

  // The checkpoint is collective: every rank takes part, the reply is its version.
  const auto ck = dir.path() / "ck";
  std::optional<policy_version> saved;
  self->request(*g, 60s, save_atom_v, ck.string())
    .receive([&](policy_version v) { saved = v; }, [&](caf::error& e) { FAIL(to_error(e).to_string()); });
  CHECK(saved == policy_version{3});
  auto info = policy::verify_checkpoint(ck);
  REQUIRE_MESSAGE(info.ok(), (info.ok() ? "" : info.error().message));
  CHECK(info->version == 3);

  // One group for two ranks: rank 1 has none and refuses, which fails rank 0 at once; the group
  // answers with the first failure, naming its rank, and counts the other.
  learner_batch one;
  one.groups.push_back(batch.groups[0]);
  got = ask(one);
  REQUIRE_FALSE(got.ok());
  CHECK_MESSAGE((contains(got.error().message, "learner rank 0 of 2: ") ||
                 contains(got.error().message, "learner rank 1 of 2: ")), got.error().message);
  CHECK_MESSAGE(contains(got.error().message, "(1 other rank failed too)"), got.error().message);
  CHECK(l0->version() == 3);
  CHECK(l1->version() == 3);

  CHECK(spawn_learner_group(sys, {}).error().code == errc::invalid_arg);
  CHECK(spawn_learner_group(sys, {learner_actor{}}).error().code == errc::invalid_arg);
}

TEST_CASE("learner actor specs name the field at fault") {
  auto check = [](const learner_actor_spec& s, const std::string& key) {
    auto ok = s.validate();
    REQUIRE_FALSE(ok.ok());
    CHECK(ok.error().code == errc::config);
    CHECK_MESSAGE(contains(ok.error().message, key), ok.error().message);
  };
  learner_actor_spec s;
  CHECK(s.validate().ok()); // one rank alone needs no group
  s.backend = "tcp";
  check(s, "learner_actor.backend");
  s = {};
  s.world_size = 2;
  check(s, "learner_actor.group");
  s.group = policy::inproc_group::create(3, 1s);
  check(s, "learner_actor.group");
  s.group = policy::inproc_group::create(2, 1s);
  s.rank = 2;
  check(s, "learner_actor.rank");
  s = {};
  s.backend = "nccl";
  s.nccl_id_hex = "abc";
  check(s, "learner_actor.nccl_id_hex");
  s = {};
  s.timeout_s = 0;
  check(s, "learner_actor.timeout_s");
}

TEST_CASE("a CUDA run whose memory plan exceeds a learner GPU is refused before loading, naming both figures") {
  const std::filesystem::path src{CRUCIBLE_SOURCE_DIR};
  auto cfg = load_config(src / "configs/gpu-7b-full-4x.yaml");
  REQUIRE_MESSAGE(cfg.ok(), (cfg.ok() ? "" : cfg.error().message));
  auto gpus = [](const char* name, std::uint64_t bytes) {
    std::vector<policy::cuda_device> d(4);
    for (int i = 0; i < 4; ++i)
      d[static_cast<std::size_t>(i)] = {i, name, bytes, 9, 0};
    return d;
  };
  const auto h100 = gpus("NVIDIA H100 80GB HBM3", 85'520'809'984ull);
  const auto h200 = gpus("NVIDIA H200", 150'754'820'096ull);
  // 7B full fine-tuning with ZeRO-1 over four GPUs: about 120 GB on GPU 0 (docs/scaling.md).
  auto refused = check_memory_plan(*cfg, h100);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == errc::config);
  const auto& m = refused.error().message;
  CAPTURE(m);
  CHECK(contains(m, "learner.memory_check: this configuration's memory plan needs 139.8 GB"));
  CHECK(contains(m, " GB on each learner GPU (learner "));
  CHECK(contains(m, "over 4 GPUs with ZeRO-1"));
  CHECK(contains(m, "cuda:0 (NVIDIA H100 80GB HBM3) has 85.5 GB"));
  CHECK(contains(m, "learner.memory_check: false starts anyway"));
  CHECK(check_memory_plan(*cfg, h200).ok());
  // Its evaluator on the policy's GPU counts there: with 8 evaluations in flight and 8 warm
  // workers beside the learner and the engine, GPU 0 of an H200 is short, and the refusal says
  // what the evaluator takes and how to give it less.
  auto crowded = *cfg;
  crowded.evaluator.concurrency = 8;
  crowded.evaluator.warm_workers = 8;
  auto busy = check_memory_plan(crowded, h200);
  REQUIRE_FALSE(busy.ok());
  CHECK_MESSAGE(contains(busy.error().message, ", the evaluator's workers on cuda:0 73.6 GB"), busy.error().message);
  CHECK_MESSAGE(contains(busy.error().message, "the policy's GPU out of evaluator.devices"), busy.error().message);
  crowded.evaluator.devices = {"cuda:1", "cuda:2", "cuda:3"};
  CHECK(check_memory_plan(crowded, h200).ok());
  // One smaller GPU among the learners is the one named.
  auto mixed = h200;
  mixed[2] = {2, "NVIDIA H100 80GB HBM3", 85'520'809'984ull, 9, 0};
  auto one = check_memory_plan(*cfg, mixed);
  REQUIRE_FALSE(one.ok());
  CHECK_MESSAGE(contains(one.error().message, "cuda:2 (NVIDIA H100 80GB HBM3)"), one.error().message);
  // Off, or no such device to compare with: nothing to refuse here.
  auto off = *cfg;
  off.learner.memory_check = false;
  CHECK(check_memory_plan(off, h100).ok());
  CHECK(check_memory_plan(*cfg, {}).ok());
  // The 1.5B config fits one H100; the CPU quickstart is not checked.
  auto small = load_config(src / "configs/gpu-1.5b.yaml");
  REQUIRE(small.ok());
  CHECK(check_memory_plan(*small, h100).ok());
  // An engine on a GPU of its own (engine.devices) takes its part off the learner's GPU and is
  // checked against its own: a 0.2 GB fourth GPU cannot hold it, and the refusal names it, also
  // where another engine (on cuda:2) fits.
  auto split = *small;
  split.engine.devices = {"cuda:2", "cuda:3"};
  split.rollout.actors = 2;
  auto tiny = h100;
  tiny[3] = {3, "a small GPU", 200'000'000ull, 9, 0};
  auto short_engine = check_memory_plan(split, tiny);
  REQUIRE_FALSE(short_engine.ok());
  CHECK_MESSAGE(contains(short_engine.error().message, "the engine's memory plan needs "), short_engine.error().message);
  CHECK_MESSAGE(contains(short_engine.error().message, " on cuda:3 of engine.devices (a small GPU), which has 0.2 GB"),
                short_engine.error().message);
  CHECK(check_memory_plan(split, h100).ok());
  // With the engine away the learner's GPU needs less: a GPU just short of the whole plan holds it.
  auto o = policy::memory_plan_options_of(*small);
  REQUIRE(o.ok());
  o->gpu_gb = 1000;
  auto whole = policy::plan_memory(*o);
  REQUIRE(whole.ok());
  auto learner_only = h100;
  learner_only[0].memory_bytes = static_cast<std::uint64_t>(whole->total - 1e9);
  CHECK_FALSE(check_memory_plan(*small, learner_only).ok());
  CHECK(check_memory_plan(split, learner_only).ok());
  auto quick = load_config(src / "configs/quickstart.yaml");
  REQUIRE(quick.ok());
  CHECK(check_memory_plan(*quick, {}).ok());
}
