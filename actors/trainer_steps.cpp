// actors/trainer_steps.cpp: the trainer's stage steps: warm start, SFT, the sampling steps of
// the self-supervised and RL stages, the stage transitions and the task check before the first
// step. The actor's messages and checkpoints are in trainer.cpp; their shared state in
// trainer_state.hpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <utility>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include "actors/actor_config.hpp"
#include "actors/trainer_state.hpp"
#include "core/file_io.hpp"
#include "core/json.hpp"
#include "core/progress.hpp"
#include "storage/replay_store.hpp"

namespace fs = std::filesystem;

namespace crucible::trainer_detail {

// -- the steps ---------------------------------------------------------------------------------

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

void advance(self_pointer self);
void check_tasks(self_pointer self);

// Moves to the next stage (stopping the rollouts of a sampling stage first) and runs its step.
void next_stage(self_pointer self) {
  stop_rollouts(self, in_flight_policy::drop, [self] {
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
    advance(self);
  });
}

// The current stage's step count and time limit (stages.NAME.steps, max_minutes); nullopt after
// the last stage.
std::optional<std::pair<std::int64_t, double>> stage_limits(const trainer_state& st) {
  const auto& g = st.deps->cfg.stages;
  switch (st.p.stage) {
    case stage_sft: return std::pair{g.sft.steps, g.sft.max_minutes};
    case stage_self: return std::pair{g.self_supervised.steps, g.self_supervised.max_minutes};
    case stage_rl: return std::pair{g.rl.steps, g.rl.max_minutes};
    case stage_search: return std::pair{g.search.steps, g.search.max_minutes};
    default: return std::nullopt;
  }
}

bool stage_over(trainer_state& st) {
  const auto limits = stage_limits(st);
  if (!limits)
    return true;
  const auto [steps, minutes] = *limits;
  if (st.p.stage_step >= static_cast<std::uint64_t>(steps))
    return true;
  return minutes > 0 && now_seconds(st) >= minutes * 60.0 && st.p.stage_step > 0;
}

// "step 120/700, 3.41 s a step, 32m58s left": the stage's count, its rate so far (the stage's
// seconds across resumes) and the time left at that rate (or to stages.NAME.max_minutes, if
// sooner).
std::string stage_progress_text(const trainer_state& st) {
  const auto limits = stage_limits(st);
  if (!limits || st.p.stage_step == 0)
    return {};
  const auto [steps, minutes] = *limits;
  const double elapsed = now_seconds(st);
  const double per_step = elapsed / static_cast<double>(st.p.stage_step);
  double left = per_step * static_cast<double>(std::max<std::int64_t>(0, steps - static_cast<std::int64_t>(st.p.stage_step)));
  if (minutes > 0)
    left = std::min(left, std::max(0.0, minutes * 60.0 - elapsed));
  char buf[96];
  std::snprintf(buf, sizeof buf, "step %llu/%lld, %.2f s a step, ", static_cast<unsigned long long>(st.p.stage_step),
                static_cast<long long>(steps), per_step);
  return buf + duration_text(left) + " left";
}

// The train_step record of an update.
std::string train_record(trainer_state& st, const train_report& r, const sample_tally* tally, std::size_t groups) {
  json_writer w;
  w.begin_object()
    .field("event", "train_step")
    .field("time", time_now(st))
    .field("stage", stage_name(st.p.stage))
    .field("step", st.p.step)
    .field("stage_step", st.p.stage_step)
    .field("policy_version", r.policy_version.value)
    .field("loss", r.loss)
    .field("grad_norm", r.grad_norm)
    .field("lr", r.lr)
    .field("tokens", r.tokens)
    .field("sequences", r.sequences)
    .field("zero_advantage", r.zero_advantage)
    .field("seconds", r.seconds)
    .field("publish_seconds", r.publish_seconds)
    .field("step_seconds", seconds_since(st.step.began))
    .field("wait_seconds", st.step.wait_seconds)
    .field("prep_seconds", st.step.prep_seconds)
    .field("skipped", r.skipped)
    .field("groups", static_cast<std::uint64_t>(groups));
  if (tally) {
    w.field("mean_reward", tally->samples ? tally->reward_sum / tally->samples : 0.0)
      .field("samples", tally->samples)
      .field("correct_share", tally->correct_share())
      .field("format_error_share", tally->samples ? static_cast<double>(tally->format_errors) / tally->samples : 0.0)
      .field("mean_speedup", tally->mean_speedup())
      .field("best_speedup", st.p.best_speedup)
      .field("dropped_stale", st.roll.dropped_now);
    if (!tally->turns.empty()) { // multi-turn episodes: the same by turn (from 0)
      w.key("turns").begin_array();
      for (std::size_t t = 0; t < tally->turns.size(); ++t) {
        const auto& c = tally->turns[t];
        w.begin_object()
          .field("turn", static_cast<std::uint64_t>(t))
          .field("samples", c.samples)
          .field("correct_share", c.correct_share())
          .field("mean_speedup", c.mean_speedup())
          .end_object();
      }
      w.end_array();
    }
  }
  w.end_object();
  return std::move(w).take();
}

void after_update(self_pointer self, const train_report& r, const sample_tally* tally, std::size_t groups,
                  bool updated = true) {
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
  finish_step(self, false);
}

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

// Warm start: every seed variant through the evaluator pool into the exemplar store.
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
    .then([self](const exemplar_stats&) { finish_step(self, false); },
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

void warm_start(self_pointer self) {
  auto& st = self->state;
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
// the task allows it.
void sft_step(self_pointer self) {
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
        [self, k, i, eos](const exemplar_set& set) {
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
          const auto n = b.prompts.size();
          before_update(self);
          self->request(st.deps->learner, learner_wait(st), std::move(b))
            .then([self, n](const train_report& r) { after_update(self, r, nullptr, n); },
                  [self](const caf::error& e) { fail_step(self, learner_error(self->state, e, "an SFT update")); });
        },
        [self](const caf::error& e) { fail_step(self, to_error(e)); });
  }
}

// A sampling step (self-supervised or RL) once its groups are here.
void train_on_groups(self_pointer self) {
  auto& st = self->state;
  st.step.wait_seconds = seconds_since(st.step.began);
  const bool rl = st.p.stage == stage_rl;
  std::vector<rollout_group> batch;
  const auto want = st.step.want;
  while (!st.roll.groups.empty() && batch.size() < want) {
    batch.push_back(std::move(st.roll.groups.front()));
    st.roll.groups.pop_front();
  }
  sample_tally tally;
  count_groups(st, batch, &tally);
  const auto n = batch.size();
  const bool search = st.p.stage == stage_search;
  send_fates(self, group_ids(batch), search ? storage::sample_fate::searched : storage::sample_fate::trained,
             st.p.step + 1);
  if (search) {
    // Contrastive search: the groups' variants are in the exemplar store already; a round is a
    // run step (checkpoints count them) without an update.
    train_report r;
    r.policy_version = policy_version{st.p.version};
    r.step = st.p.step + 1;
    after_update(self, r, &tally, n);
    return;
  }
  if (rl) {
    learner_batch b{std::move(batch), st.deps->cfg.rollout.temperature};
    before_update(self);
    self->request(st.deps->learner, learner_wait(st), std::move(b))
      .then([self, tally, n](const train_report& r) { after_update(self, r, &tally, n); },
            [self](const caf::error& e) { fail_step(self, learner_error(self->state, e, "an RL update")); });
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
    after_update(self, r, &tally, n, false);
    return;
  }
  before_update(self);
  self->request(st.deps->learner, learner_wait(st), std::move(b))
    .then([self, tally, n](const train_report& r) { after_update(self, r, &tally, n); },
          [self](const caf::error& e) { fail_step(self, learner_error(self->state, e, "a self-supervised update")); });
}

void sampling_step(self_pointer self) {
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
      sampling_step(self);
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
      stop_rollouts(self, in_flight_policy::finish, [self] { train_on_groups(self); });
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
    train_on_groups(self);
  };
  arm_stall_check(self);
  st.step.on_groups();
}

void advance(self_pointer self) {
  auto& st = self->state;
  if (!st.warm.tasks_checked && st.deps->cfg.tasks.check_references && st.p.stage < stage_done) {
    check_tasks(self);
    return;
  }
  if (st.p.stage >= stage_done) {
    finish_step(self, true);
    return;
  }
  if (st.p.stage == stage_warm) {
    if (!st.deps->cfg.tasks.warm_start || st.deps->seeds.empty()) {
      ++st.p.stage;
      advance(self);
      return;
    }
    warm_start(self);
    return;
  }
  if (stage_over(st)) {
    next_stage(self);
    return;
  }
  if (st.p.stage == stage_sft)
    sft_step(self);
  else
    sampling_step(self);
}

// Before the first step of this process: every task's reference built and run once through the
// evaluator pool (tasks.check_references). Any failure stops the run, naming each broken task.
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
      advance(self);
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
      advance(self);
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

void check_tasks(self_pointer self) {
  auto& st = self->state;
  if (st.warm.check_in_flight > 0 || !st.warm.check_queue.empty())
    return; // under way
  st.warm.broken.clear();
  for (const auto& [id, t] : *st.deps->tasks)
    st.warm.check_queue.push_back(id);
  std::reverse(st.warm.check_queue.begin(), st.warm.check_queue.end()); // popped from the back: catalogue order
  st.deps->log->info(component, "tasks: running the reference of each of ", st.warm.check_queue.size(), " tasks once");
  check_pump(self);
}

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

} // namespace crucible::trainer_detail
