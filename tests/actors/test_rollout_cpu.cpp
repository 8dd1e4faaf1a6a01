// tests/actors/test_rollout_cpu.cpp: a rollout actor on CAF's threaded scheduler with every
// collaborator real: the engine actor on its own thread (scripted tokenizer and model:
// tests/actors/scripted_policy.hpp), the CPU evaluator pool with sandboxed Python workers and a
// verdict cache, the exemplar actor with its replay store, and complete groups arriving at a
// learner. Task: env/tasks/cpu/01_relu_scale; the scripted responses carry its seed variants.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/engine.hpp"
#include "actors/evaluator.hpp"
#include "actors/exemplar.hpp"
#include "actors/rollout.hpp"
#include "core/clock.hpp"
#include "core/log.hpp"
#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "env/eval/verdict_cache.hpp"
#include "tests/actors/scripted_policy.hpp"
#include "tests/test_util/read_text.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using crucible::testing::read_text;
using crucible::testing::response_id;
using crucible::testing::scripted_response;
using crucible::testing::temp_dir;

namespace {

const fs::path source_dir{CRUCIBLE_SOURCE_DIR};

// Sends every actor it holds an exit on destruction, so that a failed check does not leave the
// actor system waiting for them forever.
struct stopper {
  caf::scoped_actor& self;
  std::vector<caf::actor> actors;
  ~stopper() {
    for (const auto& a : actors)
      self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  template <class Handle>
  void add(const Handle& h) {
    actors.push_back(caf::actor_cast<caf::actor>(h));
  }
};

// Forwards every group to `to` (the test's scoped actor).
group_sink_actor::behavior_type forwarder(group_sink_actor::pointer self, caf::actor to) {
  return {[=](rollout_group& g) { caf::anon_send(to, std::move(g)); }, [](group_dropped&) {}};
}

} // namespace

TEST_CASE("groups of real verdicts on the CPU: engine, evaluator pool, exemplar actor and replay store") {
  temp_dir dir;
  config cfg;
  cfg.reward.format_error = -1.0;
  const auto variants = source_dir / "env/tasks/cpu/variants/01_relu_scale";
  const auto fast_code = read_text(variants / "fast_inplace.py");
  const auto wrong_code = read_text(variants / "wrong_clamp_before_shift.py");
  REQUIRE_FALSE(fast_code.empty());
  REQUIRE_FALSE(wrong_code.empty());
  const std::vector<std::string> responses{scripted_response(fast_code), scripted_response(wrong_code),
                                           "Sorry, no code this time."};
  auto tok = crucible::testing::scripted_tokenizer(responses);
  const std::map<std::int32_t, double> thirds{{response_id(0), 30.0}, {response_id(1), 30.0}, {response_id(2), 30.0}};
  crucible::testing::write_scripted_model(dir.path() / "model", static_cast<std::int64_t>(tok->vocab_size()), thirds);
  cfg.run.seed = 3; // sampling is seeded: with this seed the nine draws hold all three responses


  auto task = env::load_task(source_dir / "env/tasks/cpu/01_relu_scale.py", "cpu/01_relu_scale");
  REQUIRE(task.ok());
  auto tasks = std::make_shared<task_catalog>();
  tasks->emplace(task_id{task->name}, *task);

  // The CPU evaluator with the integration suite's settings, and a verdict cache of its own, so
  // each distinct candidate is measured once.
  system_clock clk;
  logger log{clk, log_level::warn};
  evaluator_options eo;
  eo.warm_workers = 1;
  eo.flush_bytes = 16ull << 20;
  eo.rounds = 20;
  eo.max_rounds = 60;
  eo.run_timeout_s = 60;
  auto where = env::locate_harness(eo);
  REQUIRE_MESSAGE(where.ok(), (where.ok() ? "" : where.error().message));
  auto vcache = env::verdict_cache::open(dir.path() / "verdicts.db");
  REQUIRE(vcache.ok());
  auto device = env::device_evaluator::create(eo, cfg.reward, *where, "cpu", log,
                                              std::shared_ptr<env::verdict_cache>(std::move(*vcache)));
  REQUIRE_MESSAGE(device.ok(), (device.ok() ? "" : device.error().message));
  std::shared_ptr<env::device_evaluator> dev(std::move(*device));

  actor_config acfg;
  acfg.set("logger.file-verbosity", caf::atom("quiet"));
  caf::actor_system sys{acfg};
  caf::scoped_actor self{sys};

  stopper stop{self, {}};
  auto evaluator = spawn_evaluator(sys, evaluator_deps{dev, tasks, device_info{0, dev->hardware(), "cpu", 0}, 1});
  stop.add(evaluator);
  auto pool = spawn_evaluator_pool(sys, {evaluator}, evaluator_pool_options::from(cfg));
  stop.add(pool);
  group_sink_actor learner = sys.spawn(forwarder, caf::actor_cast<caf::actor>(self));
  stop.add(learner);
  auto xopt = exemplar_actor_options::from(cfg, dir.path() / "replay.db");
  auto exemplars = spawn_exemplar_actor(sys, xopt, {learner});
  REQUIRE(exemplars.ok());
  stop.add(*exemplars);
  auto eng = policy::engine::load(dir.path() / "model", {});
  REQUIRE(eng.ok());
  auto engine = spawn_engine_actor(sys, engine_deps{std::shared_ptr<policy::engine>(std::move(*eng)), tok, {}},
                                   engine_actor_options::from(cfg));
  REQUIRE(engine.ok());
  stop.add(*engine);
  auto setup = make_prompt_setup(cfg, tok);
  REQUIRE(setup.ok());

  auto opt = rollout_actor_options::from(cfg, 0);
  opt.group_size = 3;
  opt.max_groups_in_flight = 2;
  opt.max_groups = 3;
  opt.sampling.max_new_tokens = 1;
  opt.add_special_tokens = setup->add_special_tokens;
  auto rollout = spawn_rollout_actor(
    sys, rollout_deps{*engine, pool, *exemplars, tasks, setup->builder, setup->parse, cfg.reward}, opt);
  REQUIRE(rollout.ok());
  stop.add(*rollout);

  const auto t0 = std::chrono::steady_clock::now();
  self->send(*rollout, start_atom_v);
  std::vector<rollout_group> got;
  bool timed_out = false;
  while (got.size() < 3 && !timed_out)
    self->receive([&](rollout_group& g) { got.push_back(std::move(g)); },
                  caf::after(std::chrono::seconds(300)) >> [&] { timed_out = true; });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_FALSE(timed_out);

  std::optional<rollout_stats> stats;
  sampler_state sampler;
  self->request(*rollout, std::chrono::seconds(60), stop_atom_v)
    .receive([&](rollout_stats& s, sampler_state& x) { stats = s, sampler = x; },
             [&](caf::error& e) { FAIL(caf::to_string(e)); });
  REQUIRE(stats.has_value());
  // The sampler saw every reported verdict (real ones and format errors) of its one task.
  auto seen = env::task_sampler::create({"cpu/01_relu_scale"}, task_sampling::uniform, 0, 0);
  REQUIRE(seen.ok());
  REQUIRE(seen->restore(sampler.text).ok());
  CHECK(seen->records()[0].attempts == stats->evaluated + stats->format_errors);

  std::map<verdict_status, int> statuses;
  for (const auto& g : got) {
    REQUIRE(g.completions.size() == 3);
    REQUIRE(g.verdicts.size() == 3);
    CHECK(g.task == task_id{"cpu/01_relu_scale"});
    for (std::size_t i = 0; i < 3; ++i) {
      const auto token = g.completions[i].token_ids.at(0);
      const auto& v = g.verdicts[i];
      ++statuses[v.status];
      INFO("verdict: " << to_string(v.status) << " " << v.message);
      if (token == response_id(0)) {
        // Correct, and ok; or, where the machine's other load moved between the verdict's rounds and
        // the reference's timing alone (CI's two cores running other tests beside this one), refused
        // by that one statistical check: this test is about the pipeline, not the clock's noise.
        const bool noisy = v.status == verdict_status::rejected
                           && v.checks_failed == std::vector<std::string>{"runtime:slow_reference"};
        CHECK((v.status == verdict_status::ok || noisy));
        CHECK(v.correct);
        CHECK(v.hardware == dev->hardware());
      } else if (token == response_id(1)) {
        CHECK(v.status == verdict_status::incorrect);
      } else {
        CHECK(v.status == verdict_status::format_error);
        CHECK(v.reward == -1.0);
      }
    }
  }
  MESSAGE("3 groups of 3 in " << seconds << " s: " << statuses[verdict_status::ok] << " ok, "
                             << statuses[verdict_status::incorrect] << " incorrect, "
                             << statuses[verdict_status::format_error] << " format errors; evaluator workers started: "
                             << dev->workers_started());
  CHECK(statuses[verdict_status::ok] + statuses[verdict_status::rejected] > 0);
  CHECK(statuses[verdict_status::incorrect] > 0);
  CHECK(statuses[verdict_status::format_error] > 0);
  CHECK(stats->groups_finished == 3);
  CHECK(stats->completions == 9);
  CHECK(stats->evaluated + stats->format_errors == 9);
  CHECK(stats->eval_errors == 0);
  CHECK(stats->in_flight == 0);

  auto xs = self->request(*exemplars, std::chrono::seconds(60), caf::get_atom_v);
  xs.receive(
    [&](exemplar_stats& s) {
      CHECK(s.recorded == 9);
      CHECK(s.groups_completed == 3);
    },
    [&](caf::error& e) { FAIL(caf::to_string(e)); });
}
