// actors/trainer_step.cpp: one step of the trainer's schedule, from the coordinator's advance_atom
// to its stage_report, read top to bottom in run_step: the devices, the replay store settled and
// the tasks checked (once per process), the stage reached, the stage's work (the warm start, SFT
// examples, or a sampling step's groups from the rollout places), the update and the report.
// Below run_step, its stages in that order, then the step's end and what the actor's messages
// (trainer.cpp) tell a waiting step. The rollout places are in trainer_rollouts.cpp.
#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include "actors/actor_config.hpp"
#include "actors/trainer_state.hpp"
#include "storage/replay_store.hpp"

namespace crucible::trainer_detail {

namespace {

using then_fn = std::function<void()>;
using groups_fn = std::function<void(std::vector<rollout_group>)>;
using report_fn = std::function<void(const train_report&)>;

void with_devices(self_pointer self, then_fn then);
void settle_once(self_pointer self);
void check_tasks_once(self_pointer self, then_fn then);
void reach_stage(self_pointer self, then_fn then);
void warm_start(self_pointer self, then_fn then);
void sft_examples(self_pointer self, std::function<void(sft_batch)> then);
void sample_groups(self_pointer self, groups_fn then);
sample_tally count_batch(self_pointer self, const std::vector<rollout_group>& batch);
void learn_from(self_pointer self, std::vector<rollout_group> batch, std::function<void(const train_report&, bool)> then);
template <class Batch>
void update(self_pointer self, Batch batch, const char* what, report_fn then);
void after_update(self_pointer self, const train_report& r, const sample_tally* tally, std::size_t groups,
                  bool updated = true);
void finish_step(self_pointer self, bool done);
void fail_step(self_pointer self, const crucible::error& err);

} // namespace

// -- the step ------------------------------------------------------------------------------------

// Every stage is asynchronous: it calls the next with what that one needs, or ends the step
// itself with fail_step (naming what failed). The step's other ends are the two finish_step
// calls below (and drain_step, stall_check: a pause, or silence, while it waits for groups).
void run_step(self_pointer self) {
  // 1. The hardware kind candidates go to, and its device model (asked once per process).
  with_devices(self, [self] {
    // 2. What earlier processes left undecided in the replay store settled (once per process).
    settle_once(self);
    // 3. Every task's reference built and run once (tasks.check_references; once per process).
    check_tasks_once(self, [self] {
      // 4. The stage the step is in: stages whose steps or time are over are left behind.
      reach_stage(self, [self] {
        auto& st = self->state;
        if (st.p.stage >= stage_done) {
          finish_step(self, true); // the schedule is complete
        } else if (st.p.stage == stage_warm) {
          // 5a. The seed variants evaluated into the exemplar store: a step without an update.
          warm_start(self, [self] { finish_step(self, false); });
        } else if (st.p.stage == stage_sft) {
          // 5b. SFT examples from the seed variants, 6. the update, 7. its record and the report.
          sft_examples(self, [self](sft_batch b) {
            const auto n = b.prompts.size();
            update(self, std::move(b), "an SFT update", [self, n](const train_report& r) {
              after_update(self, r, nullptr, n);
              finish_step(self, false);
            });
          });
        } else {
          // 5c. The groups of a sampling step (self-supervised, RL, search), counted and their
          // fates told to the store, 6. the update they make, 7. its record and the report.
          sample_groups(self, [self](std::vector<rollout_group> groups) {
            const auto n = groups.size();
            const auto tally = count_batch(self, groups);
            learn_from(self, std::move(groups), [self, tally, n](const train_report& r, bool updated) {
              after_update(self, r, &tally, n, updated);
              finish_step(self, false);
            });
          });
        }
      });
    });
  });
}

namespace {

// Sends the trainer a collect_atom after rollout.retry_s, unless one is on its way.
void arm_timer(self_pointer self) {
  auto& st = self->state;
  if (st.step.timer_armed)
    return;
  st.step.timer_armed = true;
  self->delayed_send(caf::actor_cast<trainer_impl_actor>(self),
                     std::chrono::milliseconds(static_cast<long long>(st.deps->cfg.rollout.retry_s * 1000)),
                     collect_atom_v);
}

// A step starts waiting for groups: its silence is checked after run.stall_timeout_s, against
// the groups in by now.
void send_stall_check(self_pointer self, std::uint64_t wait) {
  auto& st = self->state;
  self->delayed_send(caf::actor_cast<trainer_impl_actor>(self), stall_limit(st), stall_atom_v, wait, st.step.groups_in);
}

void arm_stall_check(self_pointer self) {
  auto& st = self->state;
  if (stall_limit(st).count() > 0)
    send_stall_check(self, ++st.step.waits);
}

// -- 1. devices ----------------------------------------------------------------------------------

// The hardware kind and device model candidates go to (as the rollout actors choose them).
void with_devices(self_pointer self, std::function<void()> then) {
  auto& st = self->state;
  if (!st.kind.empty()) {
    then();
    return;
  }
  self->request(st.deps->evaluators, caf::infinite, caf::get_atom_v)
    .then(
      [self, then](const std::vector<device_info>& devices) {
        auto& st = self->state;
        const auto& want = st.deps->cfg.rollout.hardware;
        auto it = std::find_if(devices.begin(), devices.end(), [&](const device_info& d) {
          return want.empty() || d.hardware == want || d.name == want;
        });
        if (it == devices.end()) {
          fail_step(self, fail(errc::not_found, "no evaluator device",
                               want.empty() ? std::string{} : " of hardware kind '" + want + "' (rollout.hardware)"));
          return;
        }
        st.kind = it->hardware;
        st.device = it->name;
        then();
      },
      [self](const caf::error& e) { fail_step(self, to_error(e)); });
}

// -- 2. the replay store settled -----------------------------------------------------------------

// This process's first step: what an earlier process left undecided in the store, or decided
// after the checkpoint this one resumed from, is unfinished (a crash's samples). The step need
// not wait for the answer: the exemplar actor takes the settle before any fate this process sends
// it (one sender, in order) and before any sample of its rollouts, which start after it was sent.
void settle_once(self_pointer self) {
  auto& st = self->state;
  if (st.settled)
    return;
  st.settled = true;
  settle_samples(self, static_cast<std::int64_t>(st.p.fates), [] {});
}

// -- 3. the tasks checked ------------------------------------------------------------------------

// Before the first step of this process: every task's reference built and run once through the
// evaluator pool (tasks.check_references). Any failure stops the run, naming each broken task;
// with tasks.skip_broken the broken tasks are left out of the run instead. Then `then`.
void check_pump(self_pointer self);

void check_tasks_once(self_pointer self, then_fn then) {
  auto& st = self->state;
  if (st.warm.tasks_checked || !st.deps->cfg.tasks.check_references || st.p.stage >= stage_done) {
    then();
    return;
  }
  st.step.then = std::move(then);
  if (st.warm.check_in_flight > 0 || !st.warm.check_queue.empty())
    return; // under way
  st.warm.broken.clear();
  for (const auto& [id, t] : *st.deps->tasks)
    st.warm.check_queue.push_back(id);
  std::reverse(st.warm.check_queue.begin(), st.warm.check_queue.end()); // popped from the back: catalogue order
  st.deps->log->info(component, "tasks: running the reference of each of ", st.warm.check_queue.size(), " tasks once");
  check_pump(self);
}

void check_pump(self_pointer self) {
  auto& st = self->state;
  constexpr std::size_t max_in_flight = 8;
  auto done = [self]() {
    auto& st = self->state;
    if (!st.warm.check_queue.empty() || st.warm.check_in_flight > 0)
      return;
    if (st.warm.broken.empty()) {
      st.warm.tasks_checked = true;
      st.deps->log->info(component, "tasks: the reference of each of ", st.deps->tasks->size(), " tasks ran");
      auto then = st.step.then;
      then();
      return;
    }
    std::string what;
    for (const auto& [id, b] : st.warm.broken)
      what += "\n  " + b;
    auto n = st.warm.broken.size();
    const auto all = st.deps->tasks->size();
    if (st.deps->cfg.tasks.skip_broken && n < all) {
      // Left out of this process's run, by name, in the log and in status.
      auto pool = std::make_shared<task_catalog>(*st.deps->tasks);
      for (const auto& [id, b] : st.warm.broken)
        pool->erase(id);
      st.warm.skipped.clear();
      for (const auto& [id, t] : *st.deps->tasks)
        if (pool->find(id) == pool->end())
          st.warm.skipped.push_back(id.value);
      st.warm.pool = std::move(pool);
      st.deps->log->warn(component, "tasks: skipping ", n, " of ", all, " tasks whose reference cannot run (tasks.skip_broken):",
                         what);
      if (!st.roll.samplers.empty()) {
        st.deps->log->info(component, "tasks: the task samplers start fresh over the ", all - n, " tasks left");
        st.roll.samplers.clear();
      }
      st.warm.broken.clear();
      st.warm.tasks_checked = true;
      auto then = st.step.then;
      then();
      return;
    }
    st.warm.broken.clear();
    st.warm.check_queue.clear();
    fail_step(self, fail(errc::invalid_arg, std::to_string(n), " of ", std::to_string(all),
                         " tasks cannot run their reference:", what,
                         n < all ? "\nfix them, leave them out with tasks.include or tasks.skip_broken: true, or import the "
                                   "suite with `crucible tasks import --skip-broken` (tasks.check_references: false skips "
                                   "this check)"
                                 : "\nfix them (tasks.check_references: false skips this check)"));
  };
  while (st.warm.check_in_flight < max_in_flight && !st.warm.check_queue.empty()) {
    auto t = st.warm.check_queue.back();
    st.warm.check_queue.pop_back();
    ++st.warm.check_in_flight;
    candidate c{variant_id{0}, t, "", st.kind, false, true};
    self->request(st.deps->evaluators, caf::infinite, std::move(c))
      .then(
        [self, t, done](const verdict& v) {
          auto& st = self->state;
          --st.warm.check_in_flight;
          if (v.status != verdict_status::ok) {
            auto it = st.deps->tasks->find(t);
            st.warm.broken.emplace_back(t, t.value + (it != st.deps->tasks->end() ? " (" + it->second.path.string() + ")" : "")
                                          + ": " + v.message);
          }
          done();
          check_pump(self);
        },
        [self, t, done](const caf::error& e) {
          auto& st = self->state;
          --st.warm.check_in_flight;
          auto err = to_error(e);
          if (err.code == errc::busy) {
            st.warm.check_queue.push_back(t);
            arm_timer(self);
            return;
          }
          st.warm.broken.emplace_back(t, t.value + ": the evaluators failed: " + err.message);
          done();
          check_pump(self);
        });
  }
}

// -- 4. the stage reached ------------------------------------------------------------------------

bool stage_over(trainer_state& st) {
  const auto limits = stage_limits(st);
  if (!limits)
    return true;
  const auto [steps, minutes] = *limits;
  if (st.p.stage_step >= static_cast<std::uint64_t>(steps))
    return true;
  return minutes > 0 && now_seconds(st) >= minutes * 60.0 && st.p.stage_step > 0;
}

// Moves to the next stage (stopping the rollouts of a sampling stage first, discarding their
// groups), then `then`.
void next_stage(self_pointer self, then_fn then) {
  stop_rollouts(self, in_flight_policy::drop, [self, then] {
    auto& st = self->state;
    discard_groups(self);
    ++st.p.stage;
    st.p.stage_step = 0;
    st.p.stage_seconds = 0;
    st.stage_began = true;
    st.stage_start = std::chrono::steady_clock::now();
    st.deps->log->end_progress();
    if (st.p.stage < stage_done)
      st.deps->log->info(component, "stage ", stage_name(st.p.stage));
    then();
  });
}

// Leaves each stage that has nothing to do (a warm start not wanted; a stage whose steps or
// max_minutes are spent, or that its stopping rule ended), then `then` in the stage that has
// work, or after the last.
void reach_stage(self_pointer self, then_fn then) {
  auto& st = self->state;
  if (st.p.stage == stage_warm && (!st.deps->cfg.tasks.warm_start || st.deps->seeds.empty())) {
    ++st.p.stage;
    reach_stage(self, std::move(then));
  } else if (st.p.stage == stage_warm || st.p.stage >= stage_done || !stage_over(st)) {
    then();
  } else {
    next_stage(self, [self, then] { reach_stage(self, then); });
  }
}

// -- 5a. the warm start --------------------------------------------------------------------------

// Every seed variant through the evaluator pool into the exemplar store, then the next stage
// and `then`.
void warm_pump(self_pointer self);

void warm_finished(self_pointer self) {
  auto& st = self->state;
  st.deps->log->info(component, "warm start: ", st.warm.done, " seed variants evaluated");
  ++st.p.stage;
  st.p.stage_step = 0;
  st.p.stage_seconds = 0;
  st.stage_start = std::chrono::steady_clock::now();
  // The store must hold the seed variants before the next stage asks for exemplars: a request to
  // the exemplar actor comes back after the variants we sent it.
  self->request(st.exemplars, caf::infinite, caf::get_atom_v)
    .then(
      [self](const exemplar_stats&) {
        auto then = self->state.step.then;
        then();
      },
      [self](const caf::error& e) { fail_step(self, to_error(e)); });
}

void warm_pump(self_pointer self) {
  auto& st = self->state;
  constexpr std::size_t max_in_flight = 8;
  while (st.warm.in_flight < max_in_flight && !st.warm.queue.empty()) {
    const auto i = st.warm.queue.back();
    st.warm.queue.pop_back();
    ++st.warm.in_flight;
    const auto& s = st.deps->seeds[i];
    candidate c{variant_id{i + 1}, s.task, s.code, st.kind, false};
    self->request(st.deps->evaluators, caf::infinite, std::move(c))
      .then(
        [self, i](verdict& v) {
          auto& st = self->state;
          --st.warm.in_flight;
          ++st.warm.done;
          const auto& s = st.deps->seeds[i];
          if (!s.wrong && !v.correct)
            st.deps->log->warn(component, "seed variant ", s.task.value, "/", s.name, " is not correct: ", v.message);
          count_verdict(st, s.task, v, 0, 0, nullptr, -1, true);
          self->send(st.exemplars, scored_variant{variant_id{i + 1}, group_id{0}, s.task, s.code, v, st.kind,
                                                  policy_version{0}, {}});
          if (st.warm.queue.empty() && st.warm.in_flight == 0)
            warm_finished(self);
          else
            warm_pump(self);
        },
        [self, i](const caf::error& e) {
          auto& st = self->state;
          --st.warm.in_flight;
          auto err = to_error(e);
          if (err.code == errc::busy) {
            st.warm.queue.push_back(i);
            arm_timer(self);
            return;
          }
          fail_step(self, fail(err.code, "warm start: seed variant ", st.deps->seeds[i].task.value, "/",
                               st.deps->seeds[i].name, ": ", err.message));
        });
  }
}

void warm_start(self_pointer self, then_fn then) {
  auto& st = self->state;
  st.step.then = std::move(then);
  // Popped from the back: filled last seed first, so the first seed goes first.
  st.warm.queue.clear();
  for (std::size_t i = st.deps->seeds.size(); i-- > 0;)
    if (!is_skipped(st, st.deps->seeds[i].task))
      st.warm.queue.push_back(i);
  st.warm.done = 0;
  if (st.warm.queue.empty()) {
    warm_finished(self);
    return;
  }
  st.deps->log->info(component, "warm start: evaluating ", st.warm.queue.size(), " seed variants");
  warm_pump(self);
}

// -- 5b. SFT examples ----------------------------------------------------------------------------

// With rollout.turns above 1, a two-turn SFT example of `first`'s task from the measured
// exemplars its prompt was built with: the slowest correct one as the first answer, the feedback
// on its verdict, and the fastest as the second answer; the prompt text of that second turn and
// the response it teaches. Nothing where those exemplars hold no two correct seed variants of
// different speed (exemplar.n of at least 2; their responses are written from the seed files),
// or where the second turn's prompt is over the budget.
std::optional<std::pair<std::string, std::string>> second_turn_example(const trainer_state& st,
                                                                       const env::built_prompt& first,
                                                                       const exemplar_set& set) {
  const auto& p = st.deps->prompts;
  if (st.deps->cfg.rollout.turns < 2 || !p.feedback)
    return std::nullopt;
  const scored_variant *slow = nullptr, *fast = nullptr;
  for (const auto& x : set.exemplars) {
    if (x.verdict.status != verdict_status::ok || !x.verdict.correct || !x.verdict.has_speedup())
      continue;
    if (slow == nullptr || x.verdict.speedup < slow->verdict.speedup)
      slow = &x;
    if (fast == nullptr || x.verdict.speedup > fast->verdict.speedup)
      fast = &x;
  }
  if (slow == nullptr || fast == nullptr || !(fast->verdict.speedup > slow->verdict.speedup))
    return std::nullopt;
  auto seed_of = [&](const scored_variant& x) -> const seed_variant* {
    for (const auto& s : st.deps->seeds)
      if (s.task == set.task && !s.wrong && s.code == x.code)
        return &s;
    return nullptr;
  };
  const auto *a = seed_of(*slow), *b = seed_of(*fast);
  if (a == nullptr || b == nullptr)
    return std::nullopt;
  auto v = slow->verdict;
  v.hardware = st.device;
  const auto answer = seed_response(p.parse.sections, *a);
  const std::vector<env::episode_turn> turns{
    {answer, env::render_feedback(*p.feedback, v, 1, static_cast<std::size_t>(st.deps->cfg.rollout.turns) - 1)}};
  auto next = p.builder->continue_episode(first, turns);
  if (!next.ok())
    return std::nullopt;
  return std::pair{std::move(next->text), seed_response(p.parse.sections, *b)};
}
// SFT: `batch` correct seed variants, each as the response to its task's contrastive prompt;
// with rollout.turns above 1, every second example a second turn (second_turn_example) where
// the task allows it. Then `then` with the batch.
void sft_examples(self_pointer self, std::function<void(sft_batch)> then) {
  auto& st = self->state;
  std::vector<std::size_t> good;
  for (std::size_t i = 0; i < st.deps->seeds.size(); ++i)
    if (!st.deps->seeds[i].wrong && !is_skipped(st, st.deps->seeds[i].task))
      good.push_back(i);
  if (good.empty()) {
    fail_step(self, fail(errc::config, "stages.sft: no correct seed variants under tasks.seeds for the run's tasks"));
    return;
  }
  const auto batch = static_cast<std::size_t>(st.deps->cfg.stages.sft.batch);
  st.sft.prompts.assign(batch, {});
  st.sft.completions.assign(batch, {});
  st.sft.waiting = batch;
  st.sft.second_turns = 0;
  const auto eos = st.deps->tokenizer->eos_id();
  for (std::size_t k = 0; k < batch; ++k) {
    const auto i = good[next_random(st) % good.size()];
    const auto& s = st.deps->seeds[i];
    self->request(st.exemplars, caf::infinite, exemplar_request{s.task, st.kind, 0})
      .then(
        [self, k, i, eos, then](const exemplar_set& set) {
          auto& st = self->state;
          if (!st.step.busy)
            return;
          const auto began = std::chrono::steady_clock::now();
          const auto& s = st.deps->seeds[i];
          auto task = st.deps->tasks->find(s.task);
          env::prompt_request pr;
          pr.task_name = s.task.value;
          pr.reference_code = task->second.source;
          pr.hardware = st.device;
          for (const auto& x : set.exemplars)
            pr.exemplars.push_back({x.code, x.verdict.has_speedup() ? x.verdict.speedup : 1.0, st.device});
          auto built = st.deps->prompts.builder->build(pr);
          if (!built.ok()) {
            fail_step(self, built.error());
            return;
          }
          auto text = std::move(built->text);
          auto response = seed_response(st.deps->prompts.parse.sections, s);
          if (k % 2 == 1)
            if (auto second = second_turn_example(st, *built, set)) {
              text = std::move(second->first);
              response = std::move(second->second);
              ++st.sft.second_turns;
            }
          st.sft.prompts[k] = st.deps->tokenizer->encode(text, st.deps->prompts.add_special_tokens);
          auto completion = st.deps->tokenizer->encode(response, false);
          if (eos)
            completion.push_back(*eos);
          st.sft.completions[k] = std::move(completion);
          st.step.prep_seconds += seconds_since(began);
          if (--st.sft.waiting > 0)
            return;
          if (st.deps->cfg.rollout.turns > 1)
            st.deps->log->debug(component, "sft step ", st.p.stage_step + 1, ": ", st.sft.second_turns, " of ",
                                st.sft.prompts.size(), " examples are the second turn of an episode");
          sft_batch b{std::move(st.sft.prompts), std::move(st.sft.completions)};
          st.sft.prompts.clear();
          st.sft.completions.clear();
          then(std::move(b));
        },
        [self](const caf::error& e) { fail_step(self, to_error(e)); });
  }
}

// -- 5c. a sampling step's groups ----------------------------------------------------------------

void start_sampling(self_pointer self);

// The groups of a sampling step (the stage's `groups`; fewer when a sync step's rollouts
// abandoned some), then `then` with them. The rollout places run from the stage's first step to
// its last (async: groups sampled more than max_staleness versions ago are dropped) or for this
// step alone (sync); the first sampling step of a process reopens the episodes earlier processes
// left in flight.
void sample_groups(self_pointer self, groups_fn then) {
  self->state.step.then_groups = std::move(then);
  start_sampling(self);
}

// The step's waiting is over: up to `want` groups from the queue go on to the step.
void take_batch(self_pointer self) {
  auto& st = self->state;
  st.step.wait_seconds = seconds_since(st.step.began);
  std::vector<rollout_group> batch;
  const auto want = st.step.want;
  std::vector<group_id> taken;
  while (!st.roll.groups.empty() && batch.size() < want) {
    taken.push_back(st.roll.groups.front().group);
    batch.push_back(std::move(st.roll.groups.front()));
    st.roll.groups.pop_front();
  }
  readmit(self, taken); // the groups of the next steps start while this one trains
  std::uint64_t lag_max = 0, lag_sum = 0, samples = 0;
  for (const auto& g : batch)
    for (const auto& c : g.completions) {
      const auto lag = st.p.version > c.policy_version.value ? st.p.version - c.policy_version.value : 0;
      lag_max = std::max(lag_max, lag);
      lag_sum += lag;
      ++samples;
    }
  st.step.staleness_max = lag_max;
  st.step.staleness_mean = samples > 0 ? static_cast<double>(lag_sum) / static_cast<double>(samples) : 0.0;
  auto then = st.step.then_groups;
  then(std::move(batch));
}

void start_sampling(self_pointer self) {
  auto& st = self->state;
  const auto& g = st.deps->cfg.stages;
  const bool rl = st.p.stage == stage_rl;
  st.step.want = static_cast<std::uint64_t>(rl                            ? g.rl.groups
                                            : st.p.stage == stage_search ? g.search.groups
                                                                         : g.self_supervised.groups);
  const auto staleness = rl ? static_cast<std::uint64_t>(g.rl.max_staleness) : 0;
  const bool sync = st.deps->cfg.run.mode == run_mode::sync;
  if (!st.roll.reopened) {
    // The step waits for the exemplar actor's answer (a silent one is a stall like silent
    // rollouts); groups it sends on at once (reopened with nothing left to sample) are kept.
    st.step.on_groups = [] {};
    arm_stall_check(self);
    reopen_groups(self, staleness, sync ? st.step.want : 0, [self] {
      auto& st = self->state;
      if (!st.step.busy || !st.step.on_groups)
        return; // the step ended meanwhile; the next one spawns the rollouts with them
      st.step.on_groups = nullptr;
      st.roll.keep_queue = true;
      start_sampling(self);
    });
    return;
  }
  if (sync) {
    if (!std::exchange(st.roll.keep_queue, false))
      discard_groups(self);
    if (auto r = spawn_rollouts(self, st.step.want); !r) {
      fail_step(self, r.error());
      return;
    }
    st.step.on_groups = [self] {
      auto& st = self->state;
      if (st.roll.groups.size() < st.step.want)
        return;
      st.step.on_groups = nullptr;
      stop_rollouts(self, in_flight_policy::finish, [self] { take_batch(self); });
    };
    arm_timer(self); // notices rollouts that finished short (abandoned groups)
    arm_stall_check(self);
    return;
  }
  if (st.roll.rollouts.empty())
    if (auto r = spawn_rollouts(self, 0); !r) {
      fail_step(self, r.error());
      return;
    }
  st.step.on_groups = [self, staleness] {
    auto& st = self->state;
    drop_stale(self, staleness, 4 * st.step.want);
    if (st.roll.groups.size() < st.step.want)
      return;
    st.step.on_groups = nullptr;
    take_batch(self);
  };
  arm_stall_check(self);
  st.step.on_groups();
}

// Sync: if every rollout has taken its quota and has nothing in flight, the groups that are
// missing were abandoned: the step goes on with what arrived, or samples the rest.
void check_abandoned(self_pointer self) {
  auto& st = self->state;
  auto left = std::make_shared<std::size_t>(st.roll.rollouts.size());
  auto idle = std::make_shared<bool>(true);
  for (std::size_t i = 0; i < st.roll.rollouts.size(); ++i) {
    const auto quota = st.roll.quota[i];
    self->request(st.roll.rollouts[i], caf::infinite, caf::get_atom_v)
      .then(
        [self, left, idle, quota](const rollout_stats& s) {
          if (s.in_flight > 0 || s.groups_started < quota)
            *idle = false;
          if (--*left > 0)
            return;
          auto& st = self->state;
          if (!*idle || !st.step.on_groups) {
            arm_timer(self);
            return;
          }
          st.step.on_groups = nullptr;
          stop_rollouts(self, in_flight_policy::finish, [self] {
            auto& st = self->state;
            if (st.roll.groups.size() < learner_ranks(st)) {
              start_sampling(self); // every group (or all but too few for the learner ranks) was abandoned: sample again
              return;
            }
            st.step.want = st.roll.groups.size();
            take_batch(self);
          });
        },
        [self](const caf::error&) { arm_timer(self); });
  }
}

// -- 6. the update -------------------------------------------------------------------------------

// A sampling step's verdicts counted and recorded, and the batch's fates told to the store.
sample_tally count_batch(self_pointer self, const std::vector<rollout_group>& batch) {
  auto& st = self->state;
  sample_tally tally;
  count_groups(st, batch, &tally);
  const bool search = st.p.stage == stage_search;
  send_fates(self, group_ids(batch), search ? storage::sample_fate::searched : storage::sample_fate::trained,
             st.p.step + 1);
  return tally;
}

// Before a stage's first update: fresh optimiser moments when an earlier stage trained
// (learner.reset_moments). The learner handles it before the batch that follows.
void before_update(self_pointer self) {
  auto& st = self->state;
  if (!st.stage_began)
    return;
  st.stage_began = false;
  if (st.p.step > 0 && st.deps->cfg.learner.reset_moments) {
    self->send(st.deps->learner, reset_atom_v);
    st.deps->log->info(component, stage_name(st.p.stage), ": fresh optimiser moments after ", st.p.step, " updates");
  }
}

// The learner's update on `batch` (an sft_batch or a learner_batch), then `then` with its
// report; `what` names the update when the learner fails or is silent.
template <class Batch>
void update(self_pointer self, Batch batch, const char* what, report_fn then) {
  before_update(self);
  auto& st = self->state;
  self->request(st.deps->learner, learner_wait(st), std::move(batch))
    .then([then](const train_report& r) { then(r); },
          [self, what](const caf::error& e) { fail_step(self, learner_error(self->state, e, what)); });
}

// What a sampling step's groups make: a GRPO update (RL), SFT on their correct samples
// (self-supervised), or no update (search: the variants are in the exemplar store already; a
// self-supervised step with too few correct samples for the learner ranks: the weights stay).
// Then `then` with the report, and whether it counts as an update of the run.
void learn_from(self_pointer self, std::vector<rollout_group> batch, std::function<void(const train_report&, bool)> then) {
  auto& st = self->state;
  if (st.p.stage == stage_search) {
    // Contrastive search: a round is a run step (checkpoints count them) without an update.
    train_report r;
    r.policy_version = policy_version{st.p.version};
    r.step = st.p.step + 1;
    then(r, true);
    return;
  }
  if (st.p.stage == stage_rl) {
    learner_batch b{std::move(batch), st.deps->cfg.rollout.temperature};
    update(self, std::move(b), "an RL update", [then](const train_report& r) { then(r, true); });
    return;
  }
  // Self-supervised: the correct samples as SFT examples.
  sft_batch b;
  for (const auto& g : batch)
    for (std::size_t i = 0; i < g.verdicts.size() && i < g.completions.size(); ++i)
      if (g.verdicts[i].correct && g.verdicts[i].status == verdict_status::ok) {
        // A later turn of an episode after its own context (the earlier turns and their feedback).
        b.prompts.push_back(i < g.contexts.size() ? g.contexts[i] : g.prompt_token_ids);
        b.completions.push_back(g.completions[i].token_ids);
      }
  // Each learner rank needs an example of its own (learner.devices; a share without one is refused).
  if (b.prompts.size() < learner_ranks(st)) {
    // Nothing to learn from this step (or too little for every rank): it counts against the
    // budget, the weights stay.
    train_report r;
    r.policy_version = policy_version{st.p.version};
    r.step = st.p.step;
    r.skipped = true;
    then(r, false);
    return;
  }
  update(self, std::move(b), "a self-supervised update", [then](const train_report& r) { then(r, true); });
}

// -- 7. the record and the report ----------------------------------------------------------------

// The update counted (the run's step and version, the stage's step), its train_step record and
// progress line, and the stage's stopping rules.
void after_update(self_pointer self, const train_report& r, const sample_tally* tally, std::size_t groups,
                  bool updated) {
  auto& st = self->state;
  if (updated)
    ++st.p.step;
  ++st.p.stage_step;
  st.p.version = r.policy_version.value;
  st.step.records.push_back(train_record(st, r, tally, groups));
  st.roll.dropped_now = 0;
  // One line per step in events.log; on a terminal, one progress line redrawn in place.
  std::ostringstream line;
  line << stage_name(st.p.stage) << " " << stage_progress_text(st) << " (run step " << st.p.step << "): ";
  if (tally)
    line << tally->samples << " samples, " << tally->correct << " correct, mean speedup "
         << (tally->correct ? std::to_string(tally->mean_speedup()) : std::string{"-"})
         << (st.p.stage == stage_search ? std::string{} : ", loss " + std::to_string(r.loss));
  else
    line << "loss " << r.loss;
  st.deps->log->progress(component, line.str());
  // Stopping rules.
  const auto& g = st.deps->cfg.stages;
  bool stop = false;
  if (st.p.stage == stage_sft && g.sft.stop_loss > 0 && r.loss <= g.sft.stop_loss)
    stop = true;
  if (st.p.stage == stage_self && tally && g.self_supervised.stop_correct > 0
      && tally->correct_share() >= g.self_supervised.stop_correct)
    stop = true;
  const double speedup_target = st.p.stage == stage_rl       ? g.rl.stop_mean_speedup
                                : st.p.stage == stage_search ? g.search.stop_mean_speedup
                                                             : 0.0;
  if (tally && speedup_target > 0 && tally->correct && tally->mean_speedup() >= speedup_target)
    stop = true;
  if (stop) {
    st.deps->log->info(component, stage_name(st.p.stage), ": stopping rule met after ", st.p.stage_step, " steps");
    st.p.stage_step = std::numeric_limits<std::uint64_t>::max() / 2; // over any budget
  }
}

// -- the step's end ------------------------------------------------------------------------------

void finish_step(self_pointer self, bool done) {
  auto& st = self->state;
  st.step.busy = false;
  st.step.on_groups = nullptr;
  auto rp = st.step.pending;
  rp.deliver(report_of(st, done));
}

void fail_step(self_pointer self, const crucible::error& err) {
  auto& st = self->state;
  st.deps->log->error(component, stage_name(st.p.stage), " step ", st.p.stage_step + 1, " failed: ", err.to_string());
  st.step.busy = false;
  st.step.on_groups = nullptr;
  auto rp = st.step.pending;
  rp.deliver(make_error(err));
}

} // namespace

// -- what the actor's messages tell a step -------------------------------------------------------

void group_arrived(self_pointer self, rollout_group g) {
  auto& st = self->state;
  ++st.step.groups_in;
  st.roll.groups.push_back(std::move(g));
  if (st.step.on_groups) {
    auto f = st.step.on_groups;
    f();
  } else {
    drop_oldest(self, 8 * std::max<std::uint64_t>(1, st.step.want)); // nobody is training: keep the queue bounded
  }
}

std::string drain_step(self_pointer self) {
  auto& st = self->state;
  if (!st.step.busy)
    return "no step under way";
  if (!st.step.on_groups)
    return std::string{stage_name(st.p.stage)} + " step " + std::to_string(st.p.stage_step + 1)
           + " is past waiting for groups (an update, evaluations or a checkpoint under way): the pause waits for it";
  const auto have = st.roll.groups.size();
  st.step.on_groups = nullptr;
  const auto what = std::string{stage_name(st.p.stage)} + " step " + std::to_string(st.p.stage_step + 1)
                    + " waited for groups (" + std::to_string(have) + " of " + std::to_string(st.step.want)
                    + " in); ended without training, the run pauses at step " + std::to_string(st.p.step);
  st.deps->log->info(component, what);
  finish_step(self, false);
  return what;
}

void stall_check(self_pointer self, std::uint64_t wait, std::uint64_t seen) {
  auto& st = self->state;
  if (!st.step.busy || !st.step.on_groups || wait != st.step.waits)
    return; // that wait is over
  if (st.step.groups_in != seen) { // groups came: check the next period
    send_stall_check(self, wait);
    return;
  }
  st.step.on_groups = nullptr;
  fail_step(self, crucible::error{errc::timeout,
                                  "no rollout group arrived in " + stall_text(st) + " while "
                                      + stage_name(st.p.stage) + " step " + std::to_string(st.p.stage_step + 1)
                                      + " waited for them (" + std::to_string(st.roll.groups.size()) + " of "
                                      + std::to_string(st.step.want) + " in, " + std::to_string(st.roll.rollouts.size())
                                      + " rollout actors): the policy engine or the evaluators are silent; the run "
                                        "stops, its last checkpoint stays"});
}

void retry_waiting(self_pointer self) {
  auto& st = self->state;
  st.step.timer_armed = false;
  if (!st.step.busy)
    return;
  if (!st.warm.tasks_checked && !st.warm.check_queue.empty()) {
    check_pump(self);
    return;
  }
  if (st.p.stage == stage_warm) {
    warm_pump(self);
    return;
  }
  if (st.deps->cfg.run.mode == run_mode::sync && st.step.on_groups && !st.roll.rollouts.empty())
    check_abandoned(self);
}

} // namespace crucible::trainer_detail
