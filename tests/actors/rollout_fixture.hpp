// tests/actors/rollout_fixture.hpp: what test_rollout.cpp and test_rollout_episodes.cpp share: a
// fixture on CAF's deterministic scheduler with the real engine actor (a scripted model), the real
// exemplar actor and replay store, the project's CPU tasks, and `table_evaluator_pool`, a stand-in
// with the evaluator_pool_actor interface that answers from a fixed table of verdicts.
#pragma once

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

namespace crucible::testing::rollout {

inline const std::string fast_code = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x  # fast\n";
inline const std::string slow_code = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x  # slow\n";

inline const std::vector<std::string>& responses() {
  static const std::vector<std::string> r{scripted_response(fast_code), scripted_response(slow_code),
                                          "I would rather not write code today."};
  return r;
}
inline const std::int32_t fast = response_id(0), slow = response_id(1), bad = response_id(2);

inline std::map<std::int32_t, double> distribution(double p_fast, double p_slow, double p_bad) {
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
inline verdict table_verdict(const candidate& c) {
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

inline table_pool_actor::behavior_type table_evaluator_pool(table_pool_actor::stateful_pointer<table_state> self,
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

inline group_sink_actor::behavior_type sink(group_sink_actor::pointer, std::shared_ptr<groups_seen> got) {
  return {[=](rollout_group& g) { got->push_back(std::move(g)); }, [](group_dropped&) {}};
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

} // namespace crucible::testing::rollout
