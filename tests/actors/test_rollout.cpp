// tests/actors/test_rollout.cpp: rollout actors on CAF's deterministic scheduler with the real
// engine actor (a scripted model on the CPU: tests/actors/scripted_policy.hpp), the real exemplar
// actor and replay store, the real prompt builder (configs/prompts/contrastive.yaml) and response
// parser, and the project's CPU tasks. Only the evaluator pool is a stand-in
// (`table_evaluator_pool`, the evaluator_pool_actor interface answering from a fixed table of
// verdicts), because the real evaluators run sandboxed processes on their own threads, which the
// deterministic scheduler cannot drive; test_rollout_cpu.cpp runs the real pool.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/engine.hpp"
#include "actors/exemplar.hpp"
#include "actors/rollout.hpp"
#include "actors/trainer.hpp"
#include "env/task.hpp"
#include "storage/replay_store.hpp"
#include "tests/actors/deterministic.hpp"
#include "tests/actors/scripted_policy.hpp"
#include "tests/test_util/read_text.hpp"
#include "tests/test_util/temp_dir.hpp"

using namespace crucible;
using namespace std::chrono_literals;
using crucible::testing::deterministic;
using crucible::testing::response_id;
using crucible::testing::scripted_response;
using crucible::testing::temp_dir;

namespace {

const std::string fast_code = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x  # fast\n";
const std::string slow_code = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x  # slow\n";

const std::vector<std::string>& responses() {
  static const std::vector<std::string> r{scripted_response(fast_code), scripted_response(slow_code),
                                          "I would rather not write code today."};
  return r;
}
const std::int32_t fast = response_id(0), slow = response_id(1), bad = response_id(2);

std::map<std::int32_t, double> distribution(double p_fast, double p_slow, double p_bad) {
  std::map<std::int32_t, double> out;
  if (p_fast > 0)
    out[fast] = 30 + std::log(p_fast);
  if (p_slow > 0)
    out[slow] = 30 + std::log(p_slow);
  if (p_bad > 0)
    out[bad] = 30 + std::log(p_bad);
  return out;
}

// -- the evaluator pool stand-in ------------------------------------------------------------

// What the table pool does with a candidate.
struct table_control {
  bool hold = false;              // keep candidates until release() (else answer at once)
  std::size_t busy_at = 1u << 30; // refuse with errc::busy while holding this many
  std::vector<candidate> received;
  std::uint64_t refused = 0;
};

struct held_candidate {
  candidate cand;
  caf::typed_response_promise<verdict> rp;
};

// A stand-in with evaluator_pool_actor's interface, plus a test-only verb that answers the
// held candidates (all, or those of one group's variants).
using table_pool_actor = evaluator_pool_actor::extend<
  // Answers every held candidate whose variant id is in [first, last].
  caf::reacts_to<caf::put_atom, std::uint64_t, std::uint64_t>>;

struct table_state {
  std::vector<held_candidate> held;
  static inline const char* name = "table_evaluator_pool";
};

// The table: the fast code is ok at 2x, the slow code incorrect, anything else a runtime error.
verdict table_verdict(const candidate& c) {
  verdict v;
  v.hardware = "cpu: table";
  if (c.code == fast_code) {
    v.status = verdict_status::ok;
    v.correct = true;
    v.speedup = 2.0;
    v.speedup_spread = 0.01;
    v.reward = 2.0;
  } else if (c.code == slow_code) {
    v.status = verdict_status::incorrect;
    v.reward = 0.0;
    v.message = "outputs differ";
  } else {
    v.status = verdict_status::runtime_error;
    v.reward = 0.0;
  }
  return v;
}

table_pool_actor::behavior_type table_evaluator_pool(table_pool_actor::stateful_pointer<table_state> self,
                                                     std::shared_ptr<table_control> ctl) {
  return {
    [=](candidate& c) -> caf::result<verdict> {
      if (self->state.held.size() >= ctl->busy_at) {
        ++ctl->refused;
        return make_error(errc::busy, "table pool full");
      }
      ctl->received.push_back(c);
      if (!ctl->hold)
        return table_verdict(c);
      auto rp = self->make_response_promise<verdict>();
      self->state.held.push_back({c, rp});
      return rp;
    },
    [=](caf::get_atom) { return std::vector<device_info>{{0, "cpu: table", "cpu", 0}}; },
    // The table has no evaluators to add or remove.
    [=](caf::add_atom, const std::vector<caf::actor>&) {},
    [=](caf::delete_atom, const std::vector<caf::actor>&) {},
    [=](caf::put_atom, std::uint64_t first, std::uint64_t last) {
      auto& held = self->state.held;
      for (auto it = held.begin(); it != held.end();) {
        if (it->cand.variant.value >= first && it->cand.variant.value <= last) {
          it->rp.deliver(table_verdict(it->cand));
          it = held.erase(it);
        } else {
          ++it;
        }
      }
    },
  };
}

// -- complete groups ------------------------------------------------------------------------

using groups_seen = std::vector<rollout_group>;

group_sink_actor::behavior_type sink(group_sink_actor::pointer, std::shared_ptr<groups_seen> got) {
  return {[=](rollout_group& g) { got->push_back(std::move(g)); }};
}

// -- fixture --------------------------------------------------------------------------------

struct fixture {
  temp_dir dir;
  std::shared_ptr<const policy::tokenizer> tok = crucible::testing::scripted_tokenizer(responses());
  config cfg = [] {
    config c;
    c.reward.format_error = -0.5;
    return c;
  }();
  actor_config acfg;
  caf::actor_system sys{deterministic(acfg)};
  caf::scoped_actor self{sys, true};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::shared_ptr<groups_seen> groups = std::make_shared<groups_seen>();
  std::shared_ptr<table_control> table = std::make_shared<table_control>();
  std::vector<caf::actor> spawned;
  std::shared_ptr<const task_catalog> tasks = load_tasks();
  prompt_setup prompts = [this] {
    auto p = make_prompt_setup(cfg, tok);
    REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().to_string()));
    return std::move(*p);
  }();

  engine_actor engine;
  table_pool_actor pool;
  exemplar_actor exemplars;

  ~fixture() {
    for (auto& a : spawned)
      self->send_exit(a, caf::exit_reason::user_shutdown);
    sched.run();
  }

  static std::shared_ptr<const task_catalog> load_tasks() {
    auto out = std::make_shared<task_catalog>();
    for (const char* name : {"01_relu_scale", "02_silu_bias_residual", "03_softmax_rows"}) {
      auto t = env::load_task(std::filesystem::path{CRUCIBLE_SOURCE_DIR} / "env/tasks/cpu" / (std::string{name} + ".py"),
                              std::string{"cpu/"} + name);
      REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
      out->emplace(task_id{t->name}, *t);
    }
    return out;
  }

  template <class Handle>
  void keep(const Handle& h) {
    spawned.push_back(caf::actor_cast<caf::actor>(h));
  }

  // The engine (scripted distribution), the table pool and the exemplar actor.
  void collaborators(const std::map<std::int32_t, double>& dist, engine_actor_options eopt = {},
                     std::uint64_t max_open_groups = 256) {
    auto model_dir = dir.path() / "model";
    crucible::testing::write_scripted_model(model_dir, static_cast<std::int64_t>(tok->vocab_size()), dist);
    auto e = policy::engine::load(model_dir, {});
    REQUIRE(e.ok());
    eopt.detached = false;
    auto ea = spawn_engine_actor(sys, engine_deps{std::shared_ptr<policy::engine>(std::move(*e)), tok, {}}, eopt);
    REQUIRE(ea.ok());
    engine = *ea;
    keep(engine);
    pool = sys.spawn(table_evaluator_pool, table);
    keep(pool);
    group_sink_actor learner = sys.spawn(sink, groups);
    keep(learner);
    auto xopt = exemplar_actor_options::from(cfg, dir.path() / "replay.db");
    xopt.detached = false;
    xopt.max_open_groups = max_open_groups;
    auto xa = spawn_exemplar_actor(sys, xopt, {learner});
    REQUIRE_MESSAGE(xa.ok(), (xa.ok() ? "" : xa.error().to_string()));
    exemplars = *xa;
    keep(exemplars);
    sched.run();
  }

  rollout_actor_options options(std::uint32_t g, std::uint64_t in_flight, std::uint64_t max_groups = 0) {
    auto o = rollout_actor_options::from(cfg, 0);
    o.group_size = g;
    o.max_groups_in_flight = in_flight;
    o.max_groups = max_groups;
    o.sampling.max_new_tokens = 1; // one token: one whole scripted response
    o.add_special_tokens = prompts.add_special_tokens;
    return o;
  }

  rollout_actor spawn(rollout_actor_options opt) {
    rollout_deps deps{engine, pool, exemplars, tasks, prompts.builder, prompts.parse, cfg.reward};
    auto r = spawn_rollout_actor(sys, deps, opt);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().to_string()));
    keep(*r);
    sched.run();
    return *r;
  }

  void start(const rollout_actor& r) {
    self->send(r, start_atom_v);
    sched.run();
  }

  template <class Out, class Actor, class Msg>
  std::optional<result<Out>> try_ask(const Actor& a, Msg msg) {
    auto rh = self->request(a, caf::infinite, std::move(msg));
    sched.run();
    if (self->mailbox().empty())
      return std::nullopt;
    std::optional<result<Out>> out;
    rh.receive([&](Out& x) { out.emplace(std::move(x)); }, [&](caf::error& e) { out.emplace(to_error(e)); });
    return out;
  }

  template <class Out, class Actor, class Msg>
  Out ask(const Actor& a, Msg msg) {
    auto out = try_ask<Out>(a, std::move(msg));
    REQUIRE_MESSAGE(out.has_value(), "no reply");
    REQUIRE_MESSAGE(out->ok(), out->error().to_string());
    return std::move(**out);
  }

  rollout_stats stats(const rollout_actor& r) { return ask<rollout_stats>(r, caf::get_atom_v); }

  // Stops `r` and waits (on the scheduler) for its final counters and sampler state.
  std::pair<rollout_stats, sampler_state> stop(const rollout_actor& r) {
    auto rh = self->request(r, caf::infinite, stop_atom_v);
    sched.run();
    REQUIRE_MESSAGE(!self->mailbox().empty(), "no reply to stop");
    std::optional<std::pair<rollout_stats, sampler_state>> out;
    rh.receive([&](rollout_stats& s, sampler_state& x) { out.emplace(s, x); },
               [&](caf::error& e) { FAIL(caf::to_string(e)); });
    REQUIRE(out.has_value());
    return *out;
  }

  // A sampler over the fixture's tasks restored from `s`.
  env::task_sampler restored(const sampler_state& s) {
    auto x = env::task_sampler::create(sampler_pool(*tasks), task_sampling::uniform, 0, 0);
    REQUIRE(x.ok());
    auto r = x->restore(s.text);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    return std::move(*x);
  }

  // Verdicts the sampler of state `s` has seen, over all tasks.
  std::uint64_t attempts(const sampler_state& s) {
    std::uint64_t n = 0;
    const auto x = restored(s);
    for (const auto& rec : x.records())
      n += rec.attempts;
    return n;
  }
  exemplar_stats xstats() { return ask<exemplar_stats>(exemplars, caf::get_atom_v); }
  engine_status estats() { return ask<engine_status>(engine, caf::get_atom_v); }

  // Answers the held candidates with variant ids in [first, last] (all by default).
  void release(std::uint64_t first = 0, std::uint64_t last = UINT64_MAX) {
    self->send(pool, caf::put_atom_v, first, last);
    sched.run();
  }

  void advance(caf::timespan d) {
    sched.advance_time(d);
    sched.run();
  }

  std::string prompt_text(const rollout_group& g) const { return tok->decode(g.prompt_token_ids, false); }
};

} // namespace

TEST_CASE_FIXTURE(fixture, "tasks become complete scored groups at the exemplar actor") {
  collaborators(distribution(0.5, 0.25, 0.25));
  auto r = spawn(options(4, 2, 6));
  CHECK(stats(r).groups_started == 0); // nothing before start
  start(r);
  auto s = stats(r);
  CHECK(s.groups_started == 6);
  CHECK(s.groups_finished == 6);
  CHECK(s.in_flight == 0);
  CHECK(s.completions == 24);
  CHECK(s.evaluated + s.format_errors == 24);
  CHECK(s.retries == 0);
  CHECK(s.eval_errors == 0);
  // Format errors never reached the evaluators.
  CHECK(table->received.size() == s.evaluated);
  for (const auto& c : table->received) {
    CHECK((c.code == fast_code || c.code == slow_code));
    CHECK(c.hardware == "cpu");
    CHECK(tasks->count(c.task) == 1);
  }

  REQUIRE(groups->size() == 6);
  std::set<std::uint64_t> ids;
  std::size_t format_errors = 0, with_exemplars = 0;
  for (const auto& g : *groups) {
    ids.insert(g.group.value);
    CHECK(tasks->count(g.task) == 1);
    REQUIRE(g.completions.size() == 4);
    REQUIRE(g.verdicts.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      const auto& c = g.completions[i];
      const auto& v = g.verdicts[i];
      REQUIRE(c.token_ids.size() == 1);
      CHECK(c.policy_version == policy_version{0});
      CHECK(c.logprobs[0] == doctest::Approx(crucible::testing::scripted_log_prob(
                                               static_cast<std::int64_t>(tok->vocab_size()), distribution(0.5, 0.25, 0.25),
                                               c.token_ids[0]))
                                 .epsilon(1e-4));
      if (c.token_ids[0] == fast) {
        CHECK(v.status == verdict_status::ok);
        CHECK(v.speedup == 2.0);
      } else if (c.token_ids[0] == slow) {
        CHECK(v.status == verdict_status::incorrect);
      } else {
        REQUIRE(c.token_ids[0] == bad);
        CHECK(v.status == verdict_status::format_error);
        CHECK(v.reward == -0.5);
        CHECK(v.checks_failed == std::vector<std::string>{"format:no_code_block"});
        ++format_errors;
      }
    }
    // The prompt: the contrastive template rendered with the ChatML template, for this task.
    auto text = prompt_text(g);
    CHECK(text.rfind("<|im_start|>system\n", 0) == 0);
    CHECK(text.find("Task: " + g.task.value + ". Target hardware: cpu: table.") != std::string::npos);
    if (text.find("### Implementation 1: speedup 2.00x") != std::string::npos)
      ++with_exemplars;
  }
  CHECK(ids.size() == 6);
  CHECK(format_errors == s.format_errors);
  // Groups started after a fast variant of their task was recorded show it as an exemplar.
  CHECK(with_exemplars >= 1);
  auto x = xstats();
  CHECK(x.recorded == 24);
  CHECK(x.groups_completed == 6);
  CHECK(x.open_groups == 0);
  CHECK(x.unknown == 0);
  CHECK(x.duplicates == 0);
}

TEST_CASE_FIXTURE(fixture, "at most max_groups_in_flight groups are under way, the next task is taken when one finishes") {
  table->hold = true;
  collaborators(distribution(0.5, 0.5, 0));
  auto r = spawn(options(3, 2));
  start(r);
  auto s = stats(r);
  CHECK(s.groups_started == 2);
  CHECK(s.in_flight == 2);
  CHECK(table->received.size() == 6);
  CHECK(estats().requests == 2);
  CHECK(xstats().open_groups == 2);
  // Nothing more happens while the evaluators hold everything, however long.
  advance(std::chrono::seconds(60));
  CHECK(stats(r).groups_started == 2);
  CHECK(table->received.size() == 6);

  // The first group's verdicts (its variants are the actor's first three ids) free its slot:
  // exactly one more task is taken.
  release(1, 3);
  s = stats(r);
  CHECK(s.groups_finished == 1);
  CHECK(s.groups_started == 3);
  CHECK(s.in_flight == 2);
  CHECK(groups->size() == 1);
  CHECK(table->received.size() == 9);
  for (int round = 0; round < 5; ++round) {
    release();
    s = stats(r);
    CHECK(s.in_flight <= 2);
    CHECK(xstats().open_groups <= 2);
    CHECK(estats().queued == 0);
  }
  // Each round answers both groups in flight, and each finished group made room for a new one.
  CHECK(s.groups_finished == 11);
  CHECK(s.groups_started == 13);
}

TEST_CASE_FIXTURE(fixture, "requests refused as busy are sent again after retry_s, holding their slot") {
  SUBCASE("the engine's queue") {
    engine_actor_options eopt;
    eopt.max_queued = 1;
    collaborators(distribution(1, 0, 0), eopt);
    auto r = spawn(options(2, 3, 3));
    start(r);
    // One request ran at once, one waited, the third was refused and waits for its retry.
    auto s = stats(r);
    CHECK(s.retries == 1);
    CHECK(s.groups_finished == 2);
    CHECK(s.in_flight == 1);
    CHECK(estats().refused == 1);
    advance(std::chrono::milliseconds(999));
    CHECK(stats(r).groups_finished == 2);
    advance(std::chrono::milliseconds(1));
    s = stats(r);
    CHECK(s.groups_finished == 3);
    CHECK(s.in_flight == 0);
    CHECK(groups->size() == 3);
  }
  SUBCASE("the evaluator pool") {
    table->hold = true;
    table->busy_at = 3;
    collaborators(distribution(1, 0, 0));
    auto r = spawn(options(2, 2, 2));
    start(r);
    CHECK(table->received.size() == 3);
    CHECK(table->refused == 1);
    CHECK(stats(r).retries == 1);
    release();
    CHECK(groups->size() == 1); // the first group; the second misses a verdict
    advance(std::chrono::seconds(1));
    CHECK(table->received.size() == 4);
    release();
    auto s = stats(r);
    CHECK(s.groups_finished == 2);
    CHECK(groups->size() == 2);
    CHECK(s.eval_errors == 0);
  }
  SUBCASE("the exemplar actor's open groups") {
    table->hold = true;
    collaborators(distribution(1, 0, 0), {}, 1);
    auto r = spawn(options(2, 2, 2));
    start(r);
    CHECK(xstats().groups_refused == 1);
    CHECK(stats(r).retries == 1);
    CHECK(table->received.size() == 2); // only the announced group is evaluated
    release();
    advance(std::chrono::seconds(1));
    CHECK(table->received.size() == 4);
    release();
    CHECK(stats(r).groups_finished == 2);
    CHECK(groups->size() == 2);
  }
}

TEST_CASE_FIXTURE(fixture, "stop finishes the groups in flight, or drops them, and the actor quits") {
  table->hold = true;
  SUBCASE("finish") {
    collaborators(distribution(1, 0, 0));
    auto r = spawn(options(2, 2));
    start(r);
    auto rh = self->request(r, caf::infinite, stop_atom_v);
    sched.run();
    CHECK(self->mailbox().empty()); // waits for the groups in flight
    release();
    REQUIRE_FALSE(self->mailbox().empty());
    std::optional<rollout_stats> out;
    sampler_state sampler;
    rh.receive([&](rollout_stats& s, sampler_state& x) { out = s, sampler = x; },
               [&](caf::error& e) { FAIL(caf::to_string(e)); });
    REQUIRE(out.has_value());
    CHECK(out->groups_started == 2);
    CHECK(out->groups_finished == 2);
    // The sampler's state comes with the reply, the verdicts of the groups finished after the
    // stop included.
    CHECK(attempts(sampler) == 4);
    CHECK(out->in_flight == 0);
    CHECK_FALSE(out->running);
    CHECK(groups->size() == 2);
    CHECK(table->received.size() == 4); // no task taken after the stop
    auto gone = try_ask<rollout_stats>(r, caf::get_atom_v);
    REQUIRE(gone.has_value());
    CHECK_FALSE(gone->ok());
  }
  SUBCASE("drop") {
    collaborators(distribution(1, 0, 0));
    auto o = options(2, 2);
    o.on_stop = in_flight_policy::drop;
    auto r = spawn(o);
    start(r);
    auto out = stop(r).first;
    CHECK(out.groups_started == 2);
    CHECK(out.groups_abandoned == 2);
    CHECK(out.groups_finished == 0);
    CHECK(out.in_flight == 0);
    release(); // late verdicts go nowhere
    CHECK(groups->empty());
  }
  SUBCASE("drop asked by the stop, whatever on_stop says") {
    collaborators(distribution(1, 0, 0));
    auto r = spawn(options(2, 2)); // on_stop: finish
    start(r);
    auto rh = self->request(r, caf::infinite, stop_atom_v, cancel_atom_v);
    sched.run();
    REQUIRE_FALSE(self->mailbox().empty()); // answered at once: nothing is waited for
    std::optional<rollout_stats> out;
    rh.receive([&](rollout_stats& s, sampler_state&) { out = s; }, [&](caf::error& e) { FAIL(caf::to_string(e)); });
    REQUIRE(out.has_value());
    CHECK(out->groups_started == 2);
    CHECK(out->groups_abandoned == 2);
    CHECK(out->groups_finished == 0);
    CHECK(estats().cancelled == 0); // the engine had sampled them already; nothing was waiting
    release();
    CHECK(groups->empty());
  }
}

TEST_CASE_FIXTURE(fixture, "a prompt that cannot fit the budget abandons its group and the next task follows after retry_s") {
  cfg.prompt.max_tokens = 50; // smaller than any task's reference code
  auto small = make_prompt_setup(cfg, tok);
  REQUIRE(small.ok());
  prompts = std::move(*small);
  collaborators(distribution(1, 0, 0));
  auto r = spawn(options(2, 1, 3));
  start(r);
  auto s = stats(r);
  CHECK(s.groups_started == 1);
  CHECK(s.groups_abandoned == 1);
  CHECK(estats().requests == 0);
  advance(std::chrono::seconds(1));
  advance(std::chrono::seconds(1));
  s = stats(r);
  CHECK(s.groups_started == 3);
  CHECK(s.groups_abandoned == 3);
  advance(std::chrono::seconds(10));
  CHECK(stats(r).groups_started == 3); // max_groups
  CHECK(groups->empty());
}

TEST_CASE_FIXTURE(fixture, "the actor quits when a collaborator goes down, answering a stop that waits") {
  table->hold = true;
  collaborators(distribution(1, 0, 0));
  auto r = spawn(options(2, 2));
  start(r);
  auto rh = self->request(r, caf::infinite, stop_atom_v);
  sched.run();
  CHECK(self->mailbox().empty());
  self->send_exit(pool, caf::exit_reason::kill);
  sched.run();
  REQUIRE_FALSE(self->mailbox().empty());
  std::optional<rollout_stats> out;
  rh.receive([&](rollout_stats& s, sampler_state&) { out = s; }, [&](caf::error& e) { FAIL(caf::to_string(e)); });
  REQUIRE(out.has_value());
  CHECK(out->groups_abandoned == 2);
  auto gone = try_ask<rollout_stats>(r, caf::get_atom_v);
  REQUIRE(gone.has_value());
  CHECK_FALSE(gone->ok());
}

TEST_CASE_FIXTURE(fixture, "the run's rollout actors share their collaborators and never share an id") {
  collaborators(distribution(0.5, 0.5, 0));
  cfg.rollout.actors = 3;
  cfg.rollout.group_size = 2;
  cfg.rollout.max_groups_in_flight = 1;
  cfg.rollout.max_new_tokens = 1;
  rollout_deps deps{engine, pool, exemplars, tasks, prompts.builder, prompts.parse, cfg.reward};
  auto rs = spawn_rollout_actors(sys, deps, cfg, prompts.add_special_tokens);
  REQUIRE_MESSAGE(rs.ok(), (rs.ok() ? "" : rs.error().to_string()));
  REQUIRE(rs->size() == 3);
  for (const auto& r : *rs) {
    keep(r);
    self->send(r, start_atom_v);
  }
  table->hold = true;
  sched.run();
  // One group each: the first request is sampled at once, the two that waited meanwhile share
  // the next engine call.
  CHECK(estats().batches == 2);
  CHECK(estats().requests == 3);
  CHECK(table->received.size() == 6);
  std::set<std::uint64_t> variants;
  for (const auto& c : table->received)
    variants.insert(c.variant.value);
  CHECK(variants.size() == 6);
  for (std::uint64_t i = 0; i < 3; ++i) // index i's ids are i * 2^40 + 1, + 2, ...
    CHECK(variants.count((i << 40) + 1) == 1);
  release();
  CHECK(groups->size() == 3);
  std::set<std::uint64_t> ids;
  for (const auto& g : *groups)
    ids.insert(g.group.value);
  CHECK(ids == std::set<std::uint64_t>{1, (1ull << 40) + 1, (2ull << 40) + 1});
  cfg.rollout.group_size = 0;
  CHECK_FALSE(spawn_rollout_actors(sys, deps, cfg, false).ok());
}

TEST_CASE_FIXTURE(fixture, "spawning refuses bad options and missing collaborators") {
  collaborators(distribution(1, 0, 0));
  rollout_deps deps{engine, pool, exemplars, tasks, prompts.builder, prompts.parse, cfg.reward};
  auto o = options(0, 1);
  auto r = spawn_rollout_actor(sys, deps, o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("rollout.group_size") != std::string::npos);
  o = options(2, 1);
  o.retry_s = 0;
  CHECK(spawn_rollout_actor(sys, deps, o).error().message.find("rollout.retry_s") != std::string::npos);
  auto no_tasks = deps;
  no_tasks.tasks = std::make_shared<const task_catalog>();
  CHECK(spawn_rollout_actor(sys, no_tasks, options(2, 1)).error().code == errc::invalid_arg);
  auto no_engine = deps;
  no_engine.engine = engine_actor{};
  CHECK(spawn_rollout_actor(sys, no_engine, options(2, 1)).error().code == errc::invalid_arg);
}

TEST_CASE_FIXTURE(fixture, "the task sampler's state goes out with save and stop, and a rollout actor given it goes on drawing") {
  collaborators(distribution(1, 0, 0)); // every completion is the fast code: ok at 2x
  auto opt = options(2, 1, 4);
  opt.sampler = task_sampling::improvement;
  opt.sampler_mix = 0.2;
  // What an uninterrupted actor draws: its sampler, fed each group's two verdicts before the
  // next draw (one group in flight).
  verdict fast_ok;
  fast_ok.status = verdict_status::ok;
  fast_ok.correct = true;
  fast_ok.speedup = 2.0;
  auto whole = make_task_sampler(*tasks, opt);
  REQUIRE(whole.ok());
  std::vector<std::string> expected;
  for (int i = 0; i < 9; ++i) {
    expected.push_back(whole->next());
    whole->observe(expected.back(), fast_ok);
    whole->observe(expected.back(), fast_ok);
  }

  auto first = spawn(opt);
  start(first);
  REQUIRE(groups->size() == 4);
  auto now = ask<sampler_state>(first, save_atom_v);
  auto [counters, saved] = stop(first);
  CHECK(counters.groups_finished == 4);
  CHECK(now == saved); // nothing was in flight
  auto seen = restored(saved);
  std::map<std::string, std::uint64_t> drawn;
  for (const auto& g : *groups)
    drawn[g.task.value] += 2;
  for (std::size_t i = 0; i < seen.tasks().size(); ++i) {
    const auto& name = seen.tasks()[i];
    INFO(name);
    CHECK(seen.records()[i].attempts == drawn[name]);
    CHECK(seen.records()[i].failures == 0);
    CHECK(seen.records()[i].best_speedup == (drawn[name] ? 2.0 : 0.0));
  }

  // The next actor (another index, so other ids and another seed) continues the sampler.
  auto next = opt;
  next.index = 1;
  next.max_groups = 5;
  auto fresh = make_task_sampler(*tasks, next);
  REQUIRE(fresh.ok());
  next.saved_sampler = saved.text;
  auto second = spawn(next);
  CHECK(ask<sampler_state>(second, save_atom_v) == saved);
  start(second);
  REQUIRE(groups->size() == 9);
  std::vector<std::string> got;
  for (const auto& g : *groups)
    got.push_back(g.task.value);
  CHECK(got == expected);
  CHECK(stop(second).second.text == whole->save());
  // Without the saved state the second actor would have drawn otherwise (so the check above
  // can fail).
  std::vector<std::string> unsaved;
  for (int i = 0; i < 5; ++i)
    unsaved.push_back(fresh->next());
  CHECK(unsaved != std::vector<std::string>(expected.begin() + 4, expected.end()));
}

TEST_CASE_FIXTURE(fixture, "a saved sampler that does not fit the task pool is refused at spawn") {
  collaborators(distribution(1, 0, 0));
  auto other = env::task_sampler::create({"cpu/01_relu_scale", "cpu/99_gone"}, task_sampling::uniform, 0, 1);
  REQUIRE(other.ok());
  auto opt = options(2, 1);
  opt.saved_sampler = other->save();
  rollout_deps deps{engine, pool, exemplars, tasks, prompts.builder, prompts.parse, cfg.reward};
  auto r = spawn_rollout_actor(sys, deps, opt);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::corrupt);
  CHECK(r.error().message.find("2 tasks saved, the pool has 3") != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "samplers.json holds each rollout place's sampler, and a resumed run reads it back") {
  auto a = env::task_sampler::create(sampler_pool(*tasks), task_sampling::improvement, 0.1, 3);
  REQUIRE(a.ok());
  verdict v;
  v.status = verdict_status::ok;
  v.speedup = 1.0 / 3.0;
  a->observe("cpu/02_silu_bias_residual", v);
  a->next();
  a->next();
  sampler_checkpoint ck{{a->save(), "", a->save()}};
  const auto text = ck.to_json();
  CHECK(text.find("\"format\":\"crucible-samplers-1\"") != std::string::npos);
  auto back = sampler_checkpoint::from_json(text, "samplers.json");
  REQUIRE_MESSAGE(back.ok(), (back.ok() ? "" : back.error().message));
  CHECK(*back == ck); // place 1, which never sampled, is not written and comes back empty
  for (const auto& [bad, key] : std::vector<std::pair<std::string, std::string>>{
         {"{\"format\":\"crucible-samplers-2\",\"samplers\":[]}", "'format'"},
         {"{\"format\":\"crucible-samplers-1\"}", "'samplers'"},
         {"{\"format\":\"crucible-samplers-1\",\"samplers\":[{\"place\":-1,\"state\":\"x\"}]}", "'place'"},
         {"{\"format\":\"crucible-samplers-1\",\"samplers\":[{\"place\":0}]}", "'state'"},
         {"{\"format\":\"crucible-samplers-1\",\"samplers\":[{\"place\":0,\"state\":\"x\"},{\"place\":0,\"state\":\"y\"}]}",
          "given twice"},
         {"[1,", "samplers.json"}}) {
    auto r = sampler_checkpoint::from_json(bad, "samplers.json");
    INFO(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == errc::corrupt);
    CHECK_MESSAGE(r.error().message.find(key) != std::string::npos, r.error().message);
  }

  manual_clock clk;
  logger log{clk, log_level::off};
  REQUIRE(log.open_file(dir.path() / "events.log", log_level::info).ok());
  const auto ckdir = dir.path() / "step-4";
  std::filesystem::create_directories(ckdir);
  // A checkpoint from before samplers were saved: none, and the log says they start fresh.
  auto none = load_sampler_states(ckdir, *tasks, log);
  REQUIRE(none.ok());
  CHECK(none->empty());
  CHECK(crucible::testing::read_text(dir.path() / "events.log").find("the task samplers start fresh") != std::string::npos);
  // One that fits the pool.
  std::ofstream(ckdir / "samplers.json") << text;
  auto fits = load_sampler_states(ckdir, *tasks, log);
  REQUIRE_MESSAGE(fits.ok(), (fits.ok() ? "" : fits.error().message));
  CHECK(*fits == ck.states);
  // The pool changed since: the file, the place and the tasks are named, and the way out.
  auto fewer = std::make_shared<task_catalog>(*tasks);
  fewer->erase(task_id{"cpu/03_softmax_rows"});
  auto changed = load_sampler_states(ckdir, *fewer, log);
  REQUIRE_FALSE(changed.ok());
  CHECK(changed.error().code == errc::config);
  const auto& m = changed.error().message;
  INFO(m);
  CHECK(m.find((ckdir / "samplers.json").string() + ": the task sampler of rollout place 0") != std::string::npos);
  CHECK(m.find("saved over 3 tasks and the run's pool now has 2") != std::string::npos);
  CHECK(m.find("no longer in the pool: cpu/03_softmax_rows") != std::string::npos);
  CHECK(m.find("delete " + (ckdir / "samplers.json").string()) != std::string::npos);
  // A state that is not one.
  std::ofstream(ckdir / "samplers.json") << sampler_checkpoint{{"not a sampler"}}.to_json();
  auto corrupt = load_sampler_states(ckdir, *tasks, log);
  REQUIRE_FALSE(corrupt.ok());
  CHECK(corrupt.error().code == errc::corrupt);
  CHECK(corrupt.error().message.find("rollout place 0: task sampler state") != std::string::npos);
}

TEST_CASE("rollout options come from the rollout: section") {
  auto cfg = parse_config("run: {seed: 9}\nrollout: {group_size: 8, temperature: 0.7, top_p: 0.9, top_k: 40, max_new_tokens: 512,"
                          " stop: [\"</answer>\"], max_groups_in_flight: 3, sampler: improvement, sampler_mix: 0.25,"
                          " hardware: h100, retry_s: 2.5, on_stop: drop}\n",
                          "test.yaml");
  REQUIRE_MESSAGE(cfg.ok(), (cfg.ok() ? "" : cfg.error().message));
  auto o = rollout_actor_options::from(*cfg, 5);
  CHECK(o.group_size == 8);
  CHECK(o.sampling.temperature == 0.7);
  CHECK(o.sampling.top_p == 0.9);
  CHECK(o.sampling.top_k == 40);
  CHECK(o.sampling.max_new_tokens == 512);
  CHECK(o.sampling.stop == std::vector<std::string>{"</answer>"});
  CHECK(o.max_groups_in_flight == 3);
  CHECK(o.sampler == task_sampling::improvement);
  CHECK(o.sampler_mix == 0.25);
  CHECK(o.hardware == "h100");
  CHECK(o.retry_s == 2.5);
  CHECK(o.on_stop == in_flight_policy::drop);
  CHECK(o.index == 5);
  CHECK(o.seed == 9);
  CHECK(o.validate().ok());
  auto bad = parse_config("rollout: {top_p: 0, stop: [\"\"], sampler: greedy}\n", "test.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("rollout.top_p") != std::string::npos);
  CHECK(bad.error().message.find("rollout.stop") != std::string::npos);
  CHECK(bad.error().message.find("rollout.sampler") != std::string::npos);
  auto e = parse_config("engine: {max_queued: 5, max_batch_prompts: 2, max_batch_samples: 16, max_prompt_tokens: 3000}\n",
                        "test.yaml");
  REQUIRE(e.ok());
  auto eo = engine_actor_options::from(*e);
  CHECK(eo.max_queued == 5);
  CHECK(eo.max_batch_prompts == 2);
  CHECK(eo.max_batch_samples == 16);
  CHECK(eo.max_prompt_tokens == 3000);
}

// -- the trainer's checkpoints --------------------------------------------------------------

namespace {

// Save requests a learner got, and their answers, held until the test gives them.
struct held_saves {
  std::vector<std::string> dirs;
  std::vector<caf::typed_response_promise<policy_version>> answers;
};

// A learner whose saves are answered when it is sent put_atom (promises are delivered from the
// actor's own context).
using saving_learner_actor = learner_actor::extend<caf::reacts_to<caf::put_atom>>;

saving_learner_actor::behavior_type saving_learner(saving_learner_actor::pointer self,
                                                   std::shared_ptr<held_saves> saves) {
  auto none = [] { return caf::make_error(caf::sec::unexpected_message); };
  return {
    [saves](caf::put_atom) {
      auto answers = std::move(saves->answers);
      saves->answers.clear();
      for (auto& rp : answers)
        rp.deliver(policy_version{0});
    },
    [](rollout_group&) {},
    [none](train_atom) -> caf::result<train_report> { return none(); },
    [none](learner_batch&) -> caf::result<train_report> { return none(); },
    [none](sft_batch&) -> caf::result<train_report> { return none(); },
    [](reset_atom) {},
    [self, saves](save_atom, std::string& dir) -> caf::result<policy_version> {
      saves->dirs.push_back(dir);
      std::filesystem::create_directories(dir);
      auto rp = self->make_response_promise<policy_version>();
      saves->answers.push_back(rp);
      return rp;
    },
  };
}

// A trainer over the fixture's collaborators and `learner`, its run folder in the test's.
trainer_actor saving_trainer(fixture& f, const saving_learner_actor& learner, const config& cfg, manual_clock& clk,
                             logger& log) {
  trainer_deps deps;
  deps.cfg = cfg;
  deps.run_dir = f.dir.path() / "run";
  std::filesystem::create_directories(deps.run_dir);
  deps.learner = caf::actor_cast<learner_actor>(learner);
  deps.engine = f.engine;
  deps.evaluators = caf::actor_cast<evaluator_pool_actor>(f.pool);
  deps.tasks = f.tasks;
  deps.prompts = f.prompts;
  deps.tokenizer = f.tok;
  deps.clk = &clk;
  deps.log = &log;
  auto trainer = spawn_trainer(f.sys, std::move(deps));
  REQUIRE_MESSAGE(trainer.ok(), (trainer.ok() ? "" : trainer.error().message));
  f.keep(*trainer);
  f.sched.run();
  return *trainer;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "a second save of a step being saved waits for the first and gets the same checkpoint") {
  // A pause that arrives while the periodic checkpoint of the same step is being written: the
  // second save once cleared the temporary directory the first was writing into.
  collaborators(distribution(0.5, 0.25, 0.25));
  auto saves = std::make_shared<held_saves>();
  manual_clock clk;
  logger log{clk, log_level::off};
  auto learner = sys.spawn(saving_learner, saves);
  keep(learner);
  auto trainer = saving_trainer(*this, learner, cfg, clk, log);
  auto first = self->request(trainer, caf::infinite, save_atom_v);
  auto second = self->request(trainer, caf::infinite, save_atom_v);
  sched.run();
  CHECK(saves->dirs.size() == 1); // the learner writes the step once
  CHECK(self->mailbox().empty()); // nobody is answered before the learner is done
  REQUIRE(saves->answers.size() == 1);
  self->send(learner, caf::put_atom_v);
  sched.run();
  for (auto* rh : {&first, &second}) {
    std::optional<std::string> got;
    rh->receive([&](std::string& d) { got = d; }, [&](caf::error& e) { FAIL(caf::to_string(e)); });
    REQUIRE(got.has_value());
    CHECK(*got == (dir.path() / "run" / "checkpoints" / "step-0").string());
  }
  CHECK(std::filesystem::exists(dir.path() / "run" / "checkpoints" / "step-0" / "trainer.json"));
  CHECK(saves->dirs.size() == 1);
  self->send_exit(trainer, caf::exit_reason::user_shutdown); // before its clock and logger go
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "a learner that does not answer a checkpoint save is named as silent after run.stall_timeout_s") {
  collaborators(distribution(0.5, 0.25, 0.25));
  auto saves = std::make_shared<held_saves>();
  manual_clock clk;
  logger log{clk, log_level::off};
  auto c = cfg;
  c.run.stall_timeout_s = 90;
  auto learner = sys.spawn(saving_learner, saves); // never told to answer
  keep(learner);
  auto trainer = saving_trainer(*this, learner, c, clk, log);
  auto saved = self->request(trainer, caf::infinite, save_atom_v);
  sched.run();
  REQUIRE(saves->dirs.size() == 1);
  CHECK(self->mailbox().empty()); // the learner is silent: nothing yet
  // run.stall_timeout_s passes (other actors' timers may come first).
  for (int i = 0; i < 20 && self->mailbox().empty(); ++i) {
    if (!sched.trigger_timeout())
      break;
    sched.run();
  }
  std::optional<std::string> failed;
  saved.receive([&](std::string& d) { FAIL("saved to " << d); },
                [&](caf::error& e) { failed = to_error(e).message; });
  REQUIRE(failed.has_value());
  CHECK(failed->find("the learner did not answer a checkpoint save in 90 s (run.stall_timeout_s)") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.path() / "run" / "checkpoints" / "latest")); // no checkpoint claimed
  self->send_exit(trainer, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "a step that waits for groups and gets none stops after run.stall_timeout_s, naming the silence") {
  table->hold = true; // a candidate that reaches the evaluators is kept: they are connected and silent
  collaborators(distribution(0.5, 0.25, 0.25));
  auto saves = std::make_shared<held_saves>();
  auto learner = sys.spawn(saving_learner, saves);
  keep(learner);
  manual_clock clk;
  logger log{clk, log_level::off};
  auto c = cfg;
  c.tasks.warm_start = false;
  c.tasks.check_references = false;
  c.stages.rl.steps = 1;
  c.stages.rl.groups = 1;
  c.run.stall_timeout_s = 60;
  auto trainer = saving_trainer(*this, learner, c, clk, log);
  auto step = self->request(trainer, caf::infinite, advance_atom_v);
  sched.run();
  CHECK(self->mailbox().empty()); // waiting for its group
  for (int i = 0; i < 1000 && self->mailbox().empty(); ++i) {
    if (!sched.trigger_timeout())
      break;
    sched.run();
  }
  std::optional<std::string> failed;
  step.receive([&](stage_report&) { FAIL("the step ended without its group"); },
               [&](caf::error& e) { failed = to_error(e).message; });
  REQUIRE(failed.has_value());
  INFO(*failed);
  CHECK(failed->find("no rollout group arrived in 60 s (run.stall_timeout_s) while rl step 1 waited for them (0 of 1 in")
        != std::string::npos);
  self->send_exit(trainer, caf::exit_reason::user_shutdown);
  sched.run();
}

// -- multi-turn episodes ----------------------------------------------------------------------

namespace {

// The fixture's deps with the feedback template a run of `turns` turns loads (make_prompt_setup).
rollout_deps episode_deps(fixture& f, std::int64_t turns) {
  auto c = f.cfg;
  c.rollout.turns = turns;
  auto p = make_prompt_setup(c, f.tok);
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().to_string()));
  REQUIRE(p->feedback != nullptr);
  return rollout_deps{f.engine, f.pool, f.exemplars, f.tasks, p->builder, p->parse, f.cfg.reward, p->feedback};
}

} // namespace

TEST_CASE_FIXTURE(fixture, "two-turn episodes: each member sees its verdict as feedback and tries again, one group holds every turn") {
  collaborators(distribution(0.4, 0.3, 0.3));
  auto opt = options(3, 2, 4);
  opt.turns = 2;
  auto made = spawn_rollout_actor(sys, episode_deps(*this, 2), opt);
  REQUIRE_MESSAGE(made.ok(), (made.ok() ? "" : made.error().to_string()));
  keep(*made);
  sched.run();
  start(*made);
  auto s = stats(*made);
  CHECK(s.groups_started == 4);
  CHECK(s.groups_finished == 4);
  CHECK(s.later_turns == 12); // every episode took its second turn
  CHECK(s.completions == 24);
  CHECK(s.evaluated + s.format_errors == 24);
  CHECK(s.turns_over_budget == 0);
  CHECK(s.turns_lost == 0);
  REQUIRE(groups->size() == 4);
  for (const auto& g : *groups) {
    REQUIRE(g.multi_turn());
    REQUIRE(g.completions.size() == 6);
    REQUIRE(g.verdicts.size() == 6);
    REQUIRE(g.episodes.size() == 6);
    REQUIRE(g.turns.size() == 6);
    REQUIRE(g.contexts.size() == 6);
    std::map<std::uint32_t, std::set<std::uint32_t>> turns_of;
    for (std::size_t i = 0; i < 6; ++i) {
      turns_of[g.episodes[i]].insert(g.turns[i]);
      // The verdict is the table's for the code of this completion.
      const auto id = g.completions[i].token_ids.at(0);
      CHECK(g.verdicts[i].status == (id == fast ? verdict_status::ok
                                     : id == slow ? verdict_status::incorrect
                                                  : verdict_status::format_error));
      if (g.turns[i] == 0) {
        CHECK(g.contexts[i] == g.prompt_token_ids);
        continue;
      }
      // Turn 1 was sampled after the first prompt, the episode's first answer and the feedback
      // on its verdict, in the chat format.
      std::size_t first = 6;
      for (std::size_t j = 0; j < 6; ++j)
        if (g.episodes[j] == g.episodes[i] && g.turns[j] == 0)
          first = j;
      REQUIRE(first < 6);
      const auto ctx = tok->decode(g.contexts[i], false);
      const auto start_text = prompt_text(g);
      CHECK(ctx.rfind(start_text.substr(0, start_text.find("<|im_start|>assistant")), 0) == 0);
      CHECK(ctx.find("Turn 1: ") != std::string::npos);
      const auto& v0 = g.verdicts[first];
      if (v0.status == verdict_status::ok)
        CHECK(ctx.find("Turn 1: correct, 2.00x faster") != std::string::npos);
      else if (v0.status == verdict_status::incorrect)
        CHECK(ctx.find("Turn 1: incorrect. outputs differ") != std::string::npos);
      CHECK(ctx.find("1 more attempts") != std::string::npos); // turn 2 of 2 is the one more
      CHECK(g.contexts[i].size() > g.prompt_token_ids.size());
    }
    CHECK(turns_of.size() == 3);
    for (const auto& [episode, turns] : turns_of)
      CHECK(turns == std::set<std::uint32_t>{0, 1});
  }
  auto x = xstats();
  CHECK(x.recorded == 24);
  CHECK(x.groups_completed == 4);
  CHECK(x.open_groups == 0);
  CHECK(x.unknown == 0);
  // The store keeps each sample's place in its episode.
  auto store = storage::replay_store::open(dir.path() / "replay.db");
  REQUIRE(store.ok());
  auto rows = store->samples(0);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 24);
  std::map<std::uint64_t, std::set<std::pair<std::uint32_t, std::uint32_t>>> places;
  for (const auto& r : *rows) {
    REQUIRE(r.episode.has_value());
    REQUIRE(r.turn.has_value());
    CHECK(places[r.group_id].insert({*r.episode, *r.turn}).second);
  }
  CHECK(places.size() == 4);
}

TEST_CASE_FIXTURE(fixture, "an episode correct at rollout.turn_stop_speedup ends early, the others take their turns") {
  collaborators(distribution(0.5, 0.5, 0));
  auto opt = options(4, 1, 3);
  opt.turns = 3;
  opt.turn_stop_speedup = 1.5; // the fast code is ok at 2x: its episode ends with it
  auto made = spawn_rollout_actor(sys, episode_deps(*this, 3), opt);
  REQUIRE(made.ok());
  keep(*made);
  sched.run();
  start(*made);
  REQUIRE(groups->size() == 3);
  std::size_t ended_early = 0, full = 0;
  for (const auto& g : *groups) {
    std::map<std::uint32_t, std::vector<std::size_t>> by_episode;
    for (std::size_t i = 0; i < g.completions.size(); ++i)
      by_episode[g.episodes[i]].push_back(i);
    CHECK(by_episode.size() == 4);
    for (auto& [episode, members] : by_episode) {
      std::sort(members.begin(), members.end(), [&](auto a, auto b) { return g.turns[a] < g.turns[b]; });
      // Every turn before the last was not fast enough; an episode shorter than three turns
      // ended on a fast one.
      for (std::size_t k = 0; k < members.size(); ++k) {
        CHECK(g.turns[members[k]] == k);
        if (k + 1 < members.size())
          CHECK(g.verdicts[members[k]].status != verdict_status::ok);
      }
      if (members.size() < 3)
        CHECK(g.verdicts[members.back()].status == verdict_status::ok);
      if (members.size() < 3)
        ++ended_early;
      else
        ++full;
    }
  }
  CHECK(ended_early + full == 12);
  CHECK(ended_early > 0);
  CHECK(xstats().unknown == 0);
}

TEST_CASE_FIXTURE(fixture, "more than one turn without a feedback template is refused, naming it") {
  collaborators(distribution(1, 0, 0));
  auto opt = options(2, 1);
  opt.turns = 2;
  rollout_deps deps{engine, pool, exemplars, tasks, prompts.builder, prompts.parse, cfg.reward};
  auto r = spawn_rollout_actor(sys, deps, opt);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("feedback template") != std::string::npos);
  opt.turns = 17;
  CHECK(spawn_rollout_actor(sys, episode_deps(*this, 2), opt).error().message.find("rollout.turns") != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "a group of episodes left in flight by a crash is reopened and continued at the turn each episode reached") {
  collaborators(distribution(0.5, 0.5, 0));
  table->hold = true;
  auto opt = options(4, 1, 1);
  opt.turns = 3;
  auto deps = episode_deps(*this, 3);
  auto a = spawn_rollout_actor(sys, deps, opt);
  REQUIRE(a.ok());
  keep(*a);
  sched.run();
  start(*a);
  // One real verdict comes in; every other candidate is still being evaluated at the crash.
  REQUIRE_FALSE(table->received.empty());
  const auto first = table->received.front().variant.value;
  release(first, first);
  // The crash: the rollout actor and the exemplar actor are gone; the store keeps what came.
  self->send_exit(*a, caf::exit_reason::kill);
  self->send_exit(exemplars, caf::exit_reason::kill);
  sched.run();
  const auto evaluated_before = table->received.size();
  std::vector<storage::sample_record> before;
  {
    auto store = storage::replay_store::open(dir.path() / "replay.db");
    REQUIRE(store.ok());
    auto rows = store->samples(0);
    REQUIRE(rows.ok());
    before = *rows;
    REQUIRE_FALSE(before.empty());
    auto settled = store->settle_samples(std::nullopt);
    REQUIRE(settled.ok());
    CHECK(*settled == static_cast<std::int64_t>(before.size()));
  }
  // The next process: a new exemplar actor on the store reopens the group.
  auto got = std::make_shared<groups_seen>();
  group_sink_actor learner = sys.spawn(sink, got);
  keep(learner);
  auto xopt = exemplar_actor_options::from(cfg, dir.path() / "replay.db");
  xopt.detached = false;
  auto x2 = spawn_exemplar_actor(sys, xopt, {learner});
  REQUIRE(x2.ok());
  keep(*x2);
  sched.run();
  std::optional<episode_reopening> reopened;
  auto rh = self->request(*x2, caf::infinite, reopen_atom_v, std::uint64_t{0}, std::uint64_t{100}, std::uint64_t{10});
  sched.run();
  REQUIRE_FALSE(self->mailbox().empty());
  rh.receive([&](episode_reopening& x) { reopened = std::move(x); }, [&](caf::error& e) { FAIL(caf::to_string(e)); });
  REQUIRE(reopened.has_value());
  REQUIRE(reopened->groups.size() == 1);
  CHECK(reopened->samples == static_cast<std::int64_t>(before.size()));
  CHECK(reopened->max_group == before.front().group_id);
  const auto& r = reopened->groups.front();
  CHECK(r.group.value == before.front().group_id);
  CHECK(r.episodes == 4);
  CHECK(r.turns == 3);
  CHECK(r.stored.size() == before.size());
  CHECK_FALSE(r.prompt.empty());
  CHECK_FALSE(r.user.empty());
  {
    auto store = storage::replay_store::open(dir.path() / "replay.db");
    REQUIRE(store.ok());
    auto counts = store->count_samples();
    REQUIRE(counts.ok());
    CHECK(counts->pending == static_cast<std::int64_t>(before.size())); // undecided again
    CHECK(counts->unfinished == 0);
  }
  // Where each episode stood.
  std::map<std::uint32_t, std::uint32_t> stored_turns;
  std::map<std::uint32_t, bool> going_on;
  for (const auto& t : r.stored) {
    ++stored_turns[t.episode];
    going_on[t.episode] = t.continues;
  }
  // The crash caught episodes of every kind: one that went on after a stored turn, and one with
  // no stored turn (its evaluation was held).
  CHECK(std::any_of(going_on.begin(), going_on.end(), [](const auto& x) { return x.second; }));
  CHECK(stored_turns.size() < 4);
  // A new rollout actor continues it; it takes no new task (one group at most).
  table->hold = false;
  auto opt2 = options(4, 1, 1);
  opt2.turns = 3;
  opt2.index = 1;
  opt2.resume = reopened->groups;
  deps.exemplars = *x2;
  auto b = spawn_rollout_actor(sys, deps, opt2);
  REQUIRE(b.ok());
  keep(*b);
  sched.run();
  start(*b);
  release(); // what the first process left held goes nowhere now
  auto s = stats(*b);
  CHECK(s.groups_resumed == 1);
  CHECK(s.groups_started == 1);
  CHECK(s.groups_finished == 1);
  REQUIRE(got->size() == 1);
  const auto& g = got->front();
  CHECK(g.group.value == r.group.value);
  REQUIRE(g.multi_turn());
  // Every episode's turns once each, from 0 without a gap; the stored ones as they were.
  std::map<std::uint32_t, std::set<std::uint32_t>> turns_of;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < g.completions.size(); ++i) {
    CHECK(turns_of[g.episodes[i]].insert(g.turns[i]).second);
    for (const auto& t : r.stored)
      if (t.episode == g.episodes[i] && t.turn == g.turns[i]) {
        ++kept;
        CHECK(g.completions[i] == t.sampled);
        CHECK(g.verdicts[i] == t.verdict);
        CHECK(g.contexts[i] == t.context);
      }
  }
  CHECK(kept == r.stored.size());
  CHECK(turns_of.size() == 4);
  for (const auto& [episode, turns] : turns_of) {
    CHECK(*turns.rbegin() + 1 == turns.size());
    // An episode that had ended took no more turns; one that went on, or had none, took more.
    if (stored_turns.count(episode) && !going_on[episode])
      CHECK(turns.size() == stored_turns[episode]);
    else
      CHECK(turns.size() > stored_turns[episode]);
  }
  // A continued episode's next turn was sampled after its stored answers and their feedback.
  for (std::size_t i = 0; i < g.completions.size(); ++i) {
    const auto e = g.episodes[i];
    if (g.turns[i] == 0 || g.turns[i] != stored_turns[e])
      continue;
    const auto ctx = tok->decode(g.contexts[i], false);
    CHECK(ctx.find("Turn " + std::to_string(g.turns[i]) + ": ") != std::string::npos);
    for (const auto& t : r.stored)
      if (t.episode == e)
        CHECK(ctx.find(t.sampled.text.substr(0, 40)) != std::string::npos);
  }
  // Nothing stored was evaluated again: the second process's candidates are its own new turns.
  std::size_t new_candidates = 0;
  for (std::size_t i = evaluated_before; i < table->received.size(); ++i)
    if (table->received[i].variant.value >> rollout_id_shift == 1)
      ++new_candidates;
  std::size_t new_code_turns = 0;
  for (std::size_t i = 0; i < g.completions.size(); ++i)
    if (g.verdicts[i].status != verdict_status::format_error && std::none_of(r.stored.begin(), r.stored.end(), [&](const stored_turn& t) {
          return t.episode == g.episodes[i] && t.turn == g.turns[i];
        }))
      ++new_code_turns;
  CHECK(new_candidates == new_code_turns);
  // The store holds each (episode, turn) of the group once.
  auto store = storage::replay_store::open(dir.path() / "replay.db");
  REQUIRE(store.ok());
  auto rows = store->samples(r.group.value);
  REQUIRE(rows.ok());
  std::set<std::pair<std::uint32_t, std::uint32_t>> places;
  for (const auto& row : *rows)
    CHECK(places.insert({*row.episode, *row.turn}).second);
  CHECK(places.size() == g.completions.size());
}
