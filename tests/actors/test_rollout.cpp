// tests/actors/test_rollout.cpp: rollout actors on CAF's deterministic scheduler with the real
// engine actor (a scripted model on the CPU: tests/actors/scripted_policy.hpp), the real exemplar
// actor and replay store, the real prompt builder (configs/prompts/contrastive.yaml) and response
// parser, and the project's CPU tasks. Only the evaluator pool is a stand-in
// (`table_evaluator_pool`, the evaluator_pool_actor interface answering from a fixed table of
// verdicts), because the real evaluators run sandboxed processes on their own threads, which the
// deterministic scheduler cannot drive; test_rollout_cpu.cpp runs the real pool.
// Multi-turn episodes: test_rollout_episodes.cpp (the fixture: tests/actors/rollout_fixture.hpp).
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/exit_reason.hpp>

#include "actors/rollout.hpp"
#include "actors/trainer.hpp"
#include "tests/actors/rollout_fixture.hpp"
#include "tests/test_util/read_text.hpp"

using namespace crucible;
using namespace std::chrono_literals;
using namespace crucible::testing::rollout;
using crucible::testing::temp_dir;

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

TEST_CASE_FIXTURE(fixture, "with an admission limit a group starts only on an admission; admit_atom lets more start") {
  table->hold = true;
  collaborators(distribution(0.5, 0.5, 0));
  auto o = options(3, 4);
  o.admitted = 1;
  auto r = spawn(o);
  start(r);
  // One admission: one group, though four may be under way.
  CHECK(stats(r).groups_started == 1);
  release();
  auto s = stats(r);
  CHECK(s.groups_finished == 1);
  CHECK(s.groups_started == 1); // finishing a group admits none: the trainer does, when it leaves its queue
  advance(std::chrono::seconds(60));
  CHECK(stats(r).groups_started == 1);
  self->send(r, admit_atom_v, std::uint64_t{2});
  sched.run();
  s = stats(r);
  CHECK(s.groups_started == 3);
  CHECK(s.in_flight == 2);
  // Admissions past the in-flight bound wait for room.
  self->send(r, admit_atom_v, std::uint64_t{5});
  sched.run();
  CHECK(stats(r).in_flight == 4);
  CHECK(stats(r).groups_started == 5);
  release();
  s = stats(r);
  CHECK(s.groups_finished == 5);
  CHECK(s.groups_started == 8); // the three admissions left
  CHECK(s.in_flight == 3);
}

TEST_CASE_FIXTURE(fixture, "a group abandoned before it reaches the trainer gives its admission back") {
  cfg.prompt.max_tokens = 50; // smaller than any task's reference code: every group is abandoned
  auto small = make_prompt_setup(cfg, tok);
  REQUIRE(small.ok());
  prompts = std::move(*small);
  collaborators(distribution(1, 0, 0));
  auto o = options(2, 1, 3);
  o.admitted = 1;
  auto r = spawn(o);
  start(r);
  CHECK(stats(r).groups_abandoned == 1);
  // The admission came back: the next task follows after retry_s, as without a limit.
  advance(std::chrono::seconds(1));
  advance(std::chrono::seconds(1));
  auto s = stats(r);
  CHECK(s.groups_started == 3);
  CHECK(s.groups_abandoned == 3);
}

TEST_CASE_FIXTURE(fixture, "an admission limit below -1 is refused at spawn") {
  collaborators(distribution(1, 0, 0));
  auto o = options(2, 1);
  o.admitted = -2;
  rollout_deps deps{engine, pool, exemplars, tasks, prompts.builder, prompts.parse, cfg.reward};
  auto r = spawn_rollout_actor(sys, deps, o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("admitted must be -1 (no limit) or at least 0, got -2") != std::string::npos);
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

// A trainer over the fixture's collaborators and `learner`, its run folder in the test's; with
// `on_scheduler`, its exemplar actor runs on the test's deterministic scheduler; `engines` in
// place of the fixture's one.
template <class Learner>
trainer_actor saving_trainer(fixture& f, const Learner& learner, const config& cfg, manual_clock& clk, logger& log,
                             bool on_scheduler = false, std::vector<engine_actor> engines = {}) {
  trainer_deps deps;
  deps.cfg = cfg;
  deps.run_dir = f.dir.path() / "run";
  std::filesystem::create_directories(deps.run_dir);
  deps.learner = caf::actor_cast<learner_actor>(learner);
  deps.engines = engines.empty() ? std::vector<engine_actor>{f.engine} : std::move(engines);
  deps.evaluators = caf::actor_cast<evaluator_pool_actor>(f.pool);
  deps.tasks = f.tasks;
  deps.prompts = f.prompts;
  deps.tokenizer = f.tok;
  deps.clk = &clk;
  deps.log = &log;
  deps.exemplar_detached = !on_scheduler;
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

namespace {

// RL updates a learner holds until it is sent put_atom; each answer first has the engine serve
// the next version (the scripted model's weights again), as a real learner's publication does.
struct held_updates {
  std::vector<caf::typed_response_promise<train_report>> answers;
  std::uint64_t version = 0;
};

using holding_learner_actor = learner_actor::extend<caf::reacts_to<caf::put_atom>>;

holding_learner_actor::behavior_type holding_learner(holding_learner_actor::pointer self,
                                                     std::shared_ptr<held_updates> h, engine_actor engine,
                                                     std::string model_dir) {
  auto none = [] { return caf::make_error(caf::sec::unexpected_message); };
  return {
    [=](caf::put_atom) {
      auto answers = std::move(h->answers);
      h->answers.clear();
      for (auto& rp : answers) {
        const auto v = ++h->version;
        self->request(engine, caf::infinite, weight_update{model_dir, policy_version{v}})
          .then(
            [rp, v](policy_version) mutable {
              train_report r;
              r.policy_version = policy_version{v};
              r.step = v;
              rp.deliver(r);
            },
            [](caf::error& e) { FAIL(caf::to_string(e)); });
      }
    },
    [](rollout_group&) {},
    [none](train_atom) -> caf::result<train_report> { return none(); },
    [=](learner_batch&) -> caf::result<train_report> {
      auto rp = self->make_response_promise<train_report>();
      h->answers.push_back(rp);
      return rp;
    },
    [none](sft_batch&) -> caf::result<train_report> { return none(); },
    [](reset_atom) {},
    [h](save_atom, std::string& dir) -> caf::result<policy_version> {
      std::filesystem::create_directories(dir);
      return policy_version{h->version};
    },
  };
}

// `base` for `steps` asynchronous RL steps of one group with max_staleness 1 (one group admitted
// ahead of the learner), two rollout actors of three groups in flight each, no warm start.
config admission_config(const config& base, std::int64_t steps) {
  auto c = base;
  c.run.mode = run_mode::async;
  c.tasks.warm_start = false;
  c.tasks.check_references = false;
  c.stages.rl.steps = steps;
  c.stages.rl.groups = 1;
  c.stages.rl.max_staleness = 1;
  c.rollout.actors = 2;
  c.rollout.max_groups_in_flight = 3;
  c.rollout.group_size = 2;
  c.rollout.max_new_tokens = 1;
  return c;
}

// A step's report, once the learner is told to answer its update (and the evaluators theirs, up
// to four times, while the step waits for a group that is not stale).
template <class Step>
stage_report finish_step(fixture& f, held_updates& h, const holding_learner_actor& learner, Step& step) {
  for (int i = 0; i < 4 && h.answers.empty(); ++i)
    f.release();
  REQUIRE(h.answers.size() == 1);
  f.self->send(learner, caf::put_atom_v);
  f.sched.run();
  std::optional<stage_report> got;
  step.receive([&](stage_report& r) { got = r; }, [&](caf::error& e) { FAIL(caf::to_string(e)); });
  REQUIRE(got.has_value());
  return *got;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "async RL admits max(1, max_staleness) x groups ahead of the learner: none is sampled to be dropped") {
  // Three RL steps of one group with max_staleness 1, two rollout actors of three groups in flight
  // each, the evaluators answering when told and the learner holding each update until told.
  table->hold = true;
  collaborators(distribution(0.5, 0.25, 0.25));
  auto h = std::make_shared<held_updates>();
  manual_clock clk;
  logger log{clk, log_level::off};
  auto c = admission_config(cfg, 3);
  std::string admission = "staleness";
  SUBCASE("staleness") {}
  SUBCASE("open") { admission = "open"; }
  CAPTURE(admission);
  c.stages.rl.admission = admission;
  const bool open = admission == "open";
  auto learner = sys.spawn(holding_learner, h, engine, (dir.path() / "model").string());
  keep(learner);
  auto trainer = saving_trainer(*this, learner, c, clk, log, true);

  auto finish = [&](auto& step) { return finish_step(*this, *h, learner, step); };

  auto step1 = self->request(trainer, caf::infinite, advance_atom_v);
  sched.run();
  if (!self->mailbox().empty())
    step1.receive([&](stage_report& r) { FAIL("a report before any group: " << r.stage); },
                  [&](caf::error& e) { FAIL(caf::to_string(e)); });
  // One group admitted (1 x 1); open, every slot of both actors (six, and one more for a group
  // whose completions were all format errors: it finished without the evaluators).
  if (open)
    CHECK(estats().requests >= 6u);
  else
    CHECK(estats().requests == 1u);
  release();
  // The first group went to the learner, and its leaving the queue admitted one more.
  REQUIRE(h->answers.size() == 1);
  if (!open) {
    CHECK(estats().requests == 2u);
    release();
    CHECK(estats().requests == 2u); // the queue holds one step's group: none more starts
  } else {
    const auto before = estats().requests;
    release();
    CHECK(estats().requests > before); // groups go on starting whatever the queue holds
  }
  auto r1 = finish(step1);
  if (!open)
    CHECK(r1.dropped_stale == 0);

  auto step2 = self->request(trainer, caf::infinite, advance_atom_v);
  sched.run();
  auto r2 = finish(step2);
  auto step3 = self->request(trainer, caf::infinite, advance_atom_v);
  sched.run();
  auto r3 = finish(step3);
  CHECK(r3.stage_step == 3);
  if (open) {
    // Groups past the queue's bound, or sampled at version 0 and waiting past version 1: dropped,
    // samples and all (sampled and evaluated for nothing).
    CHECK(r3.dropped_stale > 0);
  } else {
    CHECK(r2.dropped_stale == 0);
    CHECK(r3.dropped_stale == 0);
    CHECK(estats().requests <= 4u); // three trained, one admitted ahead
  }
  self->send_exit(trainer, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "with two engines (engine.devices) rollout actor i samples from engine i mod 2") {
  table->hold = true;
  collaborators(distribution(0.5, 0.25, 0.25));
  // A second engine over the same scripted model, as a second entry of engine.devices makes.
  auto loaded = policy::engine::load(dir.path() / "model", {});
  REQUIRE(loaded.ok());
  engine_actor_options eopt;
  eopt.detached = false;
  auto second = spawn_engine_actor(sys, engine_deps{std::shared_ptr<policy::engine>(std::move(*loaded)), tok, {}}, eopt);
  REQUIRE(second.ok());
  keep(*second);
  auto h = std::make_shared<held_updates>();
  manual_clock clk;
  logger log{clk, log_level::off};
  auto c = admission_config(cfg, 1);
  c.run.mode = run_mode::sync;
  c.stages.rl.groups = 4; // two a rollout actor
  c.engine.devices = {"cpu", "cpu"};
  auto learner = sys.spawn(holding_learner, h, engine, (dir.path() / "model").string());
  keep(learner);
  auto trainer = saving_trainer(*this, learner, c, clk, log, true, {engine, *second});
  auto step = self->request(trainer, caf::infinite, advance_atom_v);
  sched.run();
  // Each rollout actor's two groups went to its own engine.
  CHECK(estats().requests == 2u);
  CHECK(ask<engine_status>(*second, caf::get_atom_v).requests == 2u);
  CHECK(finish_step(*this, *h, learner, step).stage_step == 1);
  self->send_exit(trainer, caf::exit_reason::user_shutdown);
  sched.run();

  // A trainer without an engine is refused.
  trainer_deps none;
  none.cfg = c;
  none.learner = caf::actor_cast<learner_actor>(learner);
  none.engines = {engine, engine_actor{}};
  none.evaluators = caf::actor_cast<evaluator_pool_actor>(pool);
  none.tasks = tasks;
  auto refused = spawn_trainer(sys, std::move(none));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message == "trainer: a learner, an engine and an evaluator pool are needed");
}

TEST_CASE_FIXTURE(fixture, "a group the exemplar actor drops at its straggler timeout is admitted again in its place") {
  // One group admitted (max_staleness 1, one group a step); the evaluators never answer it.
  table->hold = true;
  collaborators(distribution(0.5, 0.25, 0.25));
  auto h = std::make_shared<held_updates>();
  manual_clock clk;
  logger log{clk, log_level::off};
  auto c = admission_config(cfg, 1);
  c.exemplar.straggler_timeout_s = 30;
  c.exemplar.straggler = straggler_policy::drop;
  c.run.stall_timeout_s = 3600;
  auto learner = sys.spawn(holding_learner, h, engine, (dir.path() / "model").string());
  keep(learner);
  auto trainer = saving_trainer(*this, learner, c, clk, log, true);
  auto step = self->request(trainer, caf::infinite, advance_atom_v);
  sched.run();
  const auto first = estats().requests;
  CHECK(first >= 1u);
  advance(std::chrono::seconds(20));
  CHECK(estats().requests == first); // nothing left the queue: no admission
  // Past the timeout the exemplar actor drops the group(s) waiting on the evaluators and tells
  // the trainer, which admits as many again.
  advance(std::chrono::seconds(15));
  CHECK(estats().requests > first);
  self->send_exit(trainer, caf::exit_reason::user_shutdown);
  sched.run();
}
