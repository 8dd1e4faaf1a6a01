// actors/trainer.cpp: the trainer actor: the stage schedule (warm start, SFT, self-supervised,
// contrastive RL), its rollout actors and groups, the updates it asks the learner for, and its
// checkpoints. Its files (seed variants, trainer.json, samplers.json) are in trainer_files.cpp.
// Above 1,000 lines: the stage steps and the actor's messages share one state and call each
// other; parting them (issue 42) needs that state in a header of its own.
#include "actors/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include "actors/actor_config.hpp"
#include "actors/exemplar.hpp"
#include "core/file_io.hpp"
#include "core/json.hpp"
#include "env/task_sampler.hpp"
#include "storage/replay_store.hpp"

namespace fs = std::filesystem;

namespace crucible {

namespace {

constexpr std::string_view component = "trainer";

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One sampling step's tallies, for its train_step record and the stopping rules.
struct sample_tally {
  std::uint64_t samples = 0, correct = 0, format_errors = 0;
  double speedup_sum = 0;
  double reward_sum = 0;

  double correct_share() const { return samples ? static_cast<double>(correct) / samples : 0.0; }
  double mean_speedup() const { return correct ? speedup_sum / correct : std::numeric_limits<double>::quiet_NaN(); }
};

// What spawn_trainer and the actor share: the deps, and the exemplar actor, which is spawned
// after the trainer (the trainer is its sink) and set before the trainer's handle is handed out.
struct trainer_shared {
  trainer_deps deps;
  exemplar_actor exemplars;
};

struct trainer_state {
  static inline const char* name = "crucible.trainer";

  std::shared_ptr<trainer_shared> shared;
  trainer_deps* deps = nullptr;
  trainer_progress p;
  exemplar_actor exemplars;
  std::string kind;   // hardware kind candidates are evaluated on
  std::string device; // its device model, shown in prompts
  std::chrono::steady_clock::time_point stage_start = std::chrono::steady_clock::now();

  // The rollouts of the current sampling stage (async) or step (sync), and the groups they sent.
  std::vector<rollout_actor> rollouts;
  std::vector<std::uint64_t> rollout_quota; // sync: groups each rollout takes
  std::vector<std::size_t> rollout_place;   // the place each rollout holds (an index into samplers)
  // Per rollout place, the task sampler state its next rollout actor continues ("": fresh); a
  // place's state is taken back when its rollout actor stops, or asked for at a checkpoint.
  std::vector<std::string> samplers;
  std::deque<rollout_group> groups;
  std::uint64_t dropped_now = 0; // dropped for staleness since the last report

  // Checkpoints being written, by directory name, with everyone waiting for each: a second
  // save of the same step (a pause right at a periodic checkpoint) waits for the first instead
  // of clearing the temporary directory the first is writing into.
  std::map<std::string, std::vector<caf::typed_response_promise<std::string>>> saving;

  // The step under way.
  bool busy = false;
  caf::typed_response_promise<stage_report> pending;
  std::vector<std::string> records;
  std::function<void()> on_groups; // called when groups arrive while a step waits for them
  std::uint64_t want = 0;          // groups the waiting step needs
  bool timer_armed = false;
  std::uint64_t waits = 0;         // waits for groups so far (matches a stall check to its wait)
  std::uint64_t groups_in = 0;     // groups arrived so far (a stall check sees whether any came)
  bool settled = false;            // the store's samples were settled against p.fates at this process's start
  bool stage_began = false;        // a stage began in this process: its first update may need fresh moments
  // Where the step's wall time went (its train_step record): waiting for groups (the rollouts'
  // generation and evaluation; a sampling step waits from its start) and building SFT examples;
  // the learner reports its own update time.
  std::chrono::steady_clock::time_point step_began; // the step request's arrival
  double wait_seconds = 0, prep_seconds = 0;

  // Warm start.
  std::vector<std::size_t> warm_queue;
  bool tasks_checked = false;          // every task's reference ran (tasks.check_references), in this process
  std::vector<task_id> check_queue;    // tasks whose reference is still to be run
  std::size_t check_in_flight = 0;
  std::vector<std::pair<task_id, std::string>> broken; // each task whose reference failed, "NAME (FILE): message"
  // tasks.skip_broken: the tasks the run trains on (the catalogue less the skipped ones; null:
  // the whole catalogue) and the names of those it skips, in catalogue order.
  std::shared_ptr<const task_catalog> pool;
  std::vector<std::string> skipped;
  std::size_t warm_in_flight = 0;
  std::size_t warm_done = 0;

  // SFT example building.
  std::vector<std::vector<std::int32_t>> sft_prompts, sft_completions;
  std::size_t sft_waiting = 0;
};

using self_pointer = trainer_impl_actor::stateful_pointer<trainer_state>;

std::uint64_t next_random(trainer_state& st) {
  return splitmix64(st.deps->cfg.run.seed ^ 0x7472616e6572ull ^ splitmix64(++st.p.rng));
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double now_seconds(const trainer_state& st) { return st.p.stage_seconds + seconds_since(st.stage_start); }

std::string time_now(const trainer_state& st) { return format_iso8601(st.deps->clk->now()); }

// The tasks the run trains on: the catalogue, less those tasks.skip_broken left out.
std::shared_ptr<const task_catalog> tasks_of(const trainer_state& st) { return st.pool ? st.pool : st.deps->tasks; }

bool is_skipped(const trainer_state& st, const task_id& t) {
  return st.pool && st.pool->find(t) == st.pool->end();
}

stage_report report_of(trainer_state& st, bool done) {
  stage_report r;
  r.stage = stage_name(st.p.stage);
  r.stage_step = st.p.stage_step;
  r.step = st.p.step;
  r.done = done;
  r.policy_version = policy_version{st.p.version};
  r.variants = st.p.variants;
  r.best_speedup = st.p.best_speedup;
  r.mean_speedup = st.p.correct ? st.p.speedup_sum / st.p.correct : std::numeric_limits<double>::quiet_NaN();
  r.dropped_stale = st.p.dropped_stale;
  r.discarded = st.p.discarded;
  r.unfinished = st.p.unfinished;
  r.skipped_tasks = st.skipped;
  r.records = std::move(st.records);
  st.records.clear();
  return r;
}

// Counts a scored variant into the run's tallies and writes its verdict record.
void count_verdict(trainer_state& st, const task_id& task, const verdict& v, std::uint64_t version, std::uint64_t group,
                   sample_tally* tally) {
  ++st.p.variants;
  const bool good = v.correct && v.status == verdict_status::ok && v.has_speedup();
  if (good) {
    ++st.p.correct;
    st.p.speedup_sum += v.speedup;
    if (std::isnan(st.p.best_speedup) || v.speedup > st.p.best_speedup)
      st.p.best_speedup = v.speedup;
  }
  if (tally) {
    ++tally->samples;
    tally->reward_sum += v.reward;
    if (good) {
      ++tally->correct;
      tally->speedup_sum += v.speedup;
    }
    if (v.status == verdict_status::format_error)
      ++tally->format_errors;
  }
  json_writer w;
  w.begin_object()
    .field("event", "verdict")
    .field("time", time_now(st))
    .field("stage", stage_name(st.p.stage))
    .field("step", st.p.step)
    .field("task", task.value)
    .field("status", to_string(v.status))
    .field("correct", v.correct)
    .field("speedup", v.speedup)
    .field("reward", v.reward)
    .field("hardware", st.kind)
    .field("policy_version", version)
    .field("group", group)
    .field("cache_hit", v.cache_hit)
    .end_object();
  st.records.push_back(std::move(w).take());
}

void finish_step(self_pointer self, bool done) {
  auto& st = self->state;
  st.busy = false;
  st.on_groups = nullptr;
  auto rp = st.pending;
  rp.deliver(report_of(st, done));
}

void fail_step(self_pointer self, const crucible::error& err) {
  auto& st = self->state;
  st.deps->log->error(component, stage_name(st.p.stage), " step ", st.p.stage_step + 1, " failed: ", err.to_string());
  st.busy = false;
  st.on_groups = nullptr;
  auto rp = st.pending;
  rp.deliver(make_error(err));
}

// run.stall_timeout_s; zero: off.
std::chrono::milliseconds stall_limit(const trainer_state& st) {
  const auto s = st.deps->cfg.run.stall_timeout_s;
  return std::chrono::milliseconds{s > 0 ? static_cast<long long>(std::ceil(s * 1000.0)) : 0};
}

// How long a request to the learner may go unanswered (run.stall_timeout_s).
caf::duration learner_wait(const trainer_state& st) {
  const auto limit = stall_limit(st);
  return limit.count() > 0 ? caf::duration{limit} : caf::duration{caf::infinite};
}

// "90 s (run.stall_timeout_s)": how long a role was silent, for its error.
std::string stall_text(const trainer_state& st) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", st.deps->cfg.run.stall_timeout_s);
  return std::string{secs} + " s (run.stall_timeout_s)";
}

// The learner's error; its silence (the request timed out) named as such.
crucible::error learner_error(const trainer_state& st, const caf::error& e, const char* what) {
  if (e != caf::sec::request_timeout)
    return to_error(e);
  return crucible::error{errc::timeout, std::string{"the learner did not answer "} + what + " in " + stall_text(st)
                                            + ": it is stuck or gone (a collective waiting "
                                              "for a peer, a device fault); the run stops, its last checkpoint stays"};
}

// Checks wait `wait` for silence after run.stall_timeout_s, against the groups in by now.
void send_stall_check(self_pointer self, std::uint64_t wait) {
  auto& st = self->state;
  self->delayed_send(caf::actor_cast<trainer_impl_actor>(self), stall_limit(st), stall_atom_v, wait, st.groups_in);
}

// A step starts waiting for groups: its silence is checked after run.stall_timeout_s.
void arm_stall_check(self_pointer self) {
  auto& st = self->state;
  if (stall_limit(st).count() > 0)
    send_stall_check(self, ++st.waits);
}

// Counts (and records) the verdicts of every member of `groups`.
template <class Groups>
void count_groups(trainer_state& st, const Groups& groups, sample_tally* tally) {
  for (const auto& g : groups)
    for (std::size_t i = 0; i < g.verdicts.size() && i < g.completions.size(); ++i)
      count_verdict(st, g.task, g.verdicts[i], g.completions[i].policy_version.value, g.group.value, tally);
}

// -- rollouts ----------------------------------------------------------------------------------

result<void> spawn_rollouts(self_pointer self, std::uint64_t total_groups) {
  auto& st = self->state;
  const auto& cfg = st.deps->cfg;
  const auto n = static_cast<std::uint64_t>(std::max<std::int64_t>(1, cfg.rollout.actors));
  rollout_deps rd{st.deps->engine,           st.deps->evaluators,       st.exemplars,      tasks_of(st),
                  st.deps->prompts.builder, st.deps->prompts.parse,    cfg.reward};
  st.rollout_quota.clear();
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t quota = 0;
    if (total_groups > 0) {
      quota = total_groups / n + (i < total_groups % n ? 1 : 0);
      if (quota == 0)
        continue;
    }
    auto opt = rollout_actor_options::from(cfg, 1 + st.p.generation++);
    opt.add_special_tokens = st.deps->prompts.add_special_tokens;
    opt.max_groups = quota;
    if (!st.kind.empty() && opt.hardware.empty())
      opt.hardware = st.kind;
    if (i < st.samplers.size())
      opt.saved_sampler = st.samplers[i];
    auto r = spawn_rollout_actor(self->system(), rd, opt);
    if (!r.ok())
      return r.error();
    self->send(*r, start_atom_v);
    st.rollouts.push_back(*r);
    st.rollout_quota.push_back(quota);
    st.rollout_place.push_back(static_cast<std::size_t>(i));
  }
  return {};
}

void keep_sampler(trainer_state& st, std::size_t place, const sampler_state& s) {
  if (st.samplers.size() <= place)
    st.samplers.resize(place + 1);
  st.samplers[place] = s.text;
}

// Tells the replay store (through the exemplar actor) the fate of the samples of `ids`, counted
// as the run's decision number p.fates (docs/replay.md, Samples and their fates).
void send_fates(self_pointer self, std::vector<group_id> ids, std::string_view fate, std::uint64_t step) {
  auto& st = self->state;
  if (ids.empty())
    return;
  ++st.p.fates;
  self->send(st.exemplars, sample_fates{std::move(ids), std::string(fate), static_cast<std::int64_t>(step),
                                        static_cast<std::int64_t>(st.p.fates)});
}

// Has the exemplar actor settle the store's samples (those of groups that will not come, and,
// with `kept` >= 0, those whose fates came after decision `kept`), counts them as unfinished, and
// calls `then`. A store that fails is logged, and the run goes on (as a failed record does).
void settle_samples(self_pointer self, std::int64_t kept, std::function<void()> then) {
  auto& st = self->state;
  self->request(st.exemplars, caf::infinite, settle_atom_v, kept)
    .then(
      [self, then](std::int64_t n) {
        auto& st = self->state;
        st.p.unfinished += static_cast<std::uint64_t>(std::max<std::int64_t>(0, n));
        if (n > 0)
          st.deps->log->info(component, n, " sample", n == 1 ? "" : "s",
                             " of groups that never reached training counted as unfinished (replay store)");
        then();
      },
      [self, then](const caf::error& e) {
        self->state.deps->log->warn(component, "the replay store's samples were not settled: ", to_string(e));
        then();
      });
}

// Stops every rollout actor (in_flight_policy as given) and calls `then` once all have replied.
void discard_groups(self_pointer self);
void drop_oldest(self_pointer self, std::size_t bound);

void stop_rollouts(self_pointer self, in_flight_policy how, std::function<void()> then) {
  auto& st = self->state;
  auto rollouts = std::move(st.rollouts);
  auto places = std::move(st.rollout_place);
  st.rollouts.clear();
  st.rollout_quota.clear();
  st.rollout_place.clear();
  if (rollouts.empty()) {
    then();
    return;
  }
  // A rollout actor's on_stop is fixed at spawn (rollout.on_stop); `drop` is enforced here by
  // discarding what arrives after the stop.
  auto left = std::make_shared<std::size_t>(rollouts.size());
  auto done = [self, left, how, then] {
    if (--*left > 0)
      return;
    // Groups whose last verdict reached the exemplar actor before the stop replies are on their
    // way to us: a request to the exemplar actor comes back after them (same sender, in order).
    self->request(self->state.exemplars, caf::infinite, caf::get_atom_v)
      .then([self, how, then](const exemplar_stats&) {
              if (how != in_flight_policy::drop) {
                then();
                return;
              }
              // Nothing in flight will be trained on: the queue is discarded, and the groups
              // still open at the exemplar actor will not come.
              discard_groups(self);
              settle_samples(self, -1, then);
            },
            [then](const caf::error&) { then(); });
  };
  for (std::size_t i = 0; i < rollouts.size(); ++i)
    self->request(rollouts[i], caf::infinite, stop_atom_v)
      .then(
        [self, done, place = places[i]](const rollout_stats&, const sampler_state& s) {
          keep_sampler(self->state, place, s);
          done();
        },
        // A rollout actor already gone leaves its place's last saved state.
        [done](const caf::error&) { done(); });
}

// Asks every running rollout actor for its task sampler's state (a checkpoint while they run),
// then calls `then`.
void collect_samplers(self_pointer self, std::function<void()> then) {
  auto& st = self->state;
  if (st.rollouts.empty()) {
    then();
    return;
  }
  auto left = std::make_shared<std::size_t>(st.rollouts.size());
  auto done = [left, then] {
    if (--*left == 0)
      then();
  };
  for (std::size_t i = 0; i < st.rollouts.size(); ++i)
    self->request(st.rollouts[i], caf::infinite, save_atom_v)
      .then(
        [self, done, place = st.rollout_place[i]](const sampler_state& s) {
          keep_sampler(self->state, place, s);
          done();
        },
        [done](const caf::error&) { done(); });
}

// Drops groups sampled more than max_staleness versions before the learner's, and the oldest
// beyond the queue bound.
void drop_stale(self_pointer self, std::uint64_t max_staleness, std::uint64_t bound) {
  auto& st = self->state;
  auto stale = [&](const rollout_group& g) {
    std::uint64_t oldest = st.p.version;
    for (const auto& c : g.completions)
      oldest = std::min(oldest, c.policy_version.value);
    return st.p.version > oldest && st.p.version - oldest > max_staleness;
  };
  std::uint64_t dropped = 0; // samples
  std::vector<group_id> ids;
  for (const auto& g : st.groups)
    if (stale(g)) {
      dropped += g.completions.size();
      ids.push_back(g.group);
    }
  st.groups.erase(std::remove_if(st.groups.begin(), st.groups.end(), stale), st.groups.end());
  st.p.dropped_stale += dropped;
  st.dropped_now += dropped;
  send_fates(self, std::move(ids), storage::sample_fate::stale, st.p.step);
  drop_oldest(self, bound);
}

// Drops the oldest waiting groups until at most `bound` wait, counting their samples as stale.
void drop_oldest(self_pointer self, std::size_t bound) {
  auto& st = self->state;
  std::vector<group_id> ids;
  while (st.groups.size() > bound) {
    const auto n = st.groups.front().completions.size();
    ids.push_back(st.groups.front().group);
    st.groups.pop_front();
    st.p.dropped_stale += n;
    st.dropped_now += n;
  }
  send_fates(self, std::move(ids), storage::sample_fate::stale, st.p.step);
}

// Empties the queue of groups that arrived and will not be trained on (a stage ended, or a
// pause with run.on_pause drop), counting their samples: the replay store holds them all the same.
void discard_groups(self_pointer self) {
  auto& st = self->state;
  std::vector<group_id> ids;
  for (const auto& g : st.groups) {
    st.p.discarded += g.completions.size();
    ids.push_back(g.group);
  }
  st.groups.clear();
  send_fates(self, std::move(ids), storage::sample_fate::discarded, st.p.step);
}

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
    if (st.p.stage < stage_done)
      st.deps->log->info(component, "stage ", stage_name(st.p.stage));
    advance(self);
  });
}

bool stage_over(trainer_state& st) {
  const auto& g = st.deps->cfg.stages;
  std::int64_t steps = 0;
  double minutes = 0;
  switch (st.p.stage) {
    case stage_sft:
      steps = g.sft.steps, minutes = g.sft.max_minutes;
      break;
    case stage_self:
      steps = g.self_supervised.steps, minutes = g.self_supervised.max_minutes;
      break;
    case stage_rl:
      steps = g.rl.steps, minutes = g.rl.max_minutes;
      break;
    default:
      return true;
  }
  if (st.p.stage_step >= static_cast<std::uint64_t>(steps))
    return true;
  return minutes > 0 && now_seconds(st) >= minutes * 60.0 && st.p.stage_step > 0;
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
    .field("seconds", r.seconds)
    .field("publish_seconds", r.publish_seconds)
    .field("step_seconds", seconds_since(st.step_began))
    .field("wait_seconds", st.wait_seconds)
    .field("prep_seconds", st.prep_seconds)
    .field("skipped", r.skipped)
    .field("groups", static_cast<std::uint64_t>(groups));
  if (tally) {
    w.field("mean_reward", tally->samples ? tally->reward_sum / tally->samples : 0.0)
      .field("samples", tally->samples)
      .field("correct_share", tally->correct_share())
      .field("format_error_share", tally->samples ? static_cast<double>(tally->format_errors) / tally->samples : 0.0)
      .field("mean_speedup", tally->mean_speedup())
      .field("best_speedup", st.p.best_speedup)
      .field("dropped_stale", st.dropped_now);
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
  st.records.push_back(train_record(st, r, tally, groups));
  st.dropped_now = 0;
  if (tally)
    st.deps->log->info(component, stage_name(st.p.stage), " step ", st.p.stage_step, " (run step ", st.p.step,
                       "): ", tally->samples, " samples, ", tally->correct, " correct, mean speedup ",
                       tally->correct ? std::to_string(tally->mean_speedup()) : std::string{"-"}, ", loss ", r.loss);
  else
    st.deps->log->info(component, stage_name(st.p.stage), " step ", st.p.stage_step, " (run step ", st.p.step,
                       "): loss ", r.loss);
  // Stopping rules.
  const auto& g = st.deps->cfg.stages;
  bool stop = false;
  if (st.p.stage == stage_sft && g.sft.stop_loss > 0 && r.loss <= g.sft.stop_loss)
    stop = true;
  if (st.p.stage == stage_self && tally && g.self_supervised.stop_correct > 0
      && tally->correct_share() >= g.self_supervised.stop_correct)
    stop = true;
  if (st.p.stage == stage_rl && tally && g.rl.stop_mean_speedup > 0 && tally->correct
      && tally->mean_speedup() >= g.rl.stop_mean_speedup)
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
  if (st.timer_armed)
    return;
  st.timer_armed = true;
  self->delayed_send(caf::actor_cast<trainer_impl_actor>(self),
                     std::chrono::milliseconds(static_cast<long long>(st.deps->cfg.rollout.retry_s * 1000)),
                     collect_atom_v);
}

// Warm start: every seed variant through the evaluator pool into the exemplar store.
void warm_pump(self_pointer self);

void warm_finished(self_pointer self) {
  auto& st = self->state;
  st.deps->log->info(component, "warm start: ", st.warm_done, " seed variants evaluated");
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
  while (st.warm_in_flight < max_in_flight && !st.warm_queue.empty()) {
    const auto i = st.warm_queue.back();
    st.warm_queue.pop_back();
    ++st.warm_in_flight;
    const auto& s = st.deps->seeds[i];
    candidate c{variant_id{i + 1}, s.task, s.code, st.kind, false};
    self->request(st.deps->evaluators, caf::infinite, std::move(c))
      .then(
        [self, i](verdict& v) {
          auto& st = self->state;
          --st.warm_in_flight;
          ++st.warm_done;
          const auto& s = st.deps->seeds[i];
          if (!s.wrong && !v.correct)
            st.deps->log->warn(component, "seed variant ", s.task.value, "/", s.name, " is not correct: ", v.message);
          count_verdict(st, s.task, v, 0, 0, nullptr);
          self->send(st.exemplars, scored_variant{variant_id{i + 1}, group_id{0}, s.task, s.code, v, st.kind,
                                                  policy_version{0}, {}});
          if (st.warm_queue.empty() && st.warm_in_flight == 0)
            warm_finished(self);
          else
            warm_pump(self);
        },
        [self, i](const caf::error& e) {
          auto& st = self->state;
          --st.warm_in_flight;
          auto err = to_error(e);
          if (err.code == errc::busy) {
            st.warm_queue.push_back(i);
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
  st.warm_queue.clear();
  for (std::size_t i = st.deps->seeds.size(); i-- > 0;)
    if (!is_skipped(st, st.deps->seeds[i].task))
      st.warm_queue.push_back(i);
  st.warm_done = 0;
  if (st.warm_queue.empty()) {
    warm_finished(self);
    return;
  }
  st.deps->log->info(component, "warm start: evaluating ", st.warm_queue.size(), " seed variants");
  warm_pump(self);
}

// SFT: `batch` correct seed variants, each as the response to its task's contrastive prompt.
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
  st.sft_prompts.assign(batch, {});
  st.sft_completions.assign(batch, {});
  st.sft_waiting = batch;
  const auto eos = st.deps->tokenizer->eos_id();
  for (std::size_t k = 0; k < batch; ++k) {
    const auto i = good[next_random(st) % good.size()];
    const auto& s = st.deps->seeds[i];
    self->request(st.exemplars, caf::infinite, exemplar_request{s.task, st.kind, 0})
      .then(
        [self, k, i, eos](const exemplar_set& set) {
          auto& st = self->state;
          if (!st.busy)
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
          st.sft_prompts[k] = st.deps->tokenizer->encode(built->text, st.deps->prompts.add_special_tokens);
          auto completion = st.deps->tokenizer->encode(seed_response(st.deps->prompts.parse.sections, s), false);
          if (eos)
            completion.push_back(*eos);
          st.sft_completions[k] = std::move(completion);
          st.prep_seconds += seconds_since(began);
          if (--st.sft_waiting > 0)
            return;
          sft_batch b{std::move(st.sft_prompts), std::move(st.sft_completions)};
          st.sft_prompts.clear();
          st.sft_completions.clear();
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
  st.wait_seconds = seconds_since(st.step_began);
  const bool rl = st.p.stage == stage_rl;
  std::vector<rollout_group> batch;
  const auto want = st.want;
  while (!st.groups.empty() && batch.size() < want) {
    batch.push_back(std::move(st.groups.front()));
    st.groups.pop_front();
  }
  sample_tally tally;
  count_groups(st, batch, &tally);
  const auto n = batch.size();
  std::vector<group_id> ids;
  for (const auto& g : batch)
    ids.push_back(g.group);
  send_fates(self, std::move(ids), storage::sample_fate::trained, st.p.step + 1);
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
        b.prompts.push_back(g.prompt_token_ids);
        b.completions.push_back(g.completions[i].token_ids);
      }
  if (b.prompts.empty()) {
    // Nothing to learn from this step: it counts against the budget, the weights stay.
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
  st.want = static_cast<std::uint64_t>(rl ? g.rl.groups : g.self_supervised.groups);
  const auto staleness = rl ? static_cast<std::uint64_t>(g.rl.max_staleness) : 0;
  const bool sync = st.deps->cfg.run.mode == run_mode::sync;
  if (sync) {
    discard_groups(self);
    if (auto r = spawn_rollouts(self, st.want); !r) {
      fail_step(self, r.error());
      return;
    }
    st.on_groups = [self] {
      auto& st = self->state;
      if (st.groups.size() < st.want)
        return;
      st.on_groups = nullptr;
      stop_rollouts(self, in_flight_policy::finish, [self] { train_on_groups(self); });
    };
    arm_timer(self); // notices rollouts that finished short (abandoned groups)
    arm_stall_check(self);
    return;
  }
  if (st.rollouts.empty())
    if (auto r = spawn_rollouts(self, 0); !r) {
      fail_step(self, r.error());
      return;
    }
  st.on_groups = [self, staleness] {
    auto& st = self->state;
    drop_stale(self, staleness, 4 * st.want);
    if (st.groups.size() < st.want)
      return;
    st.on_groups = nullptr;
    train_on_groups(self);
  };
  arm_stall_check(self);
  st.on_groups();
}

void advance(self_pointer self) {
  auto& st = self->state;
  if (!st.tasks_checked && st.deps->cfg.tasks.check_references && st.p.stage < stage_done) {
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
    if (!st.check_queue.empty() || st.check_in_flight > 0)
      return;
    if (st.broken.empty()) {
      st.tasks_checked = true;
      st.deps->log->info(component, "tasks: the reference of each of ", st.deps->tasks->size(), " tasks ran");
      advance(self);
      return;
    }
    std::string what;
    for (const auto& [id, b] : st.broken)
      what += "\n  " + b;
    auto n = st.broken.size();
    const auto all = st.deps->tasks->size();
    if (st.deps->cfg.tasks.skip_broken && n < all) {
      // Left out of this process's run, by name, in the log and in status.
      auto pool = std::make_shared<task_catalog>(*st.deps->tasks);
      for (const auto& [id, b] : st.broken)
        pool->erase(id);
      st.skipped.clear();
      for (const auto& [id, t] : *st.deps->tasks)
        if (pool->find(id) == pool->end())
          st.skipped.push_back(id.value);
      st.pool = std::move(pool);
      st.deps->log->warn(component, "tasks: skipping ", n, " of ", all, " tasks whose reference cannot run (tasks.skip_broken):",
                         what);
      if (!st.samplers.empty()) {
        st.deps->log->info(component, "tasks: the task samplers start fresh over the ", all - n, " tasks left");
        st.samplers.clear();
      }
      st.broken.clear();
      st.tasks_checked = true;
      advance(self);
      return;
    }
    st.broken.clear();
    st.check_queue.clear();
    fail_step(self, fail(errc::invalid_arg, std::to_string(n), " of ", std::to_string(all),
                         " tasks cannot run their reference:", what,
                         n < all ? "\nfix them, leave them out with tasks.include or tasks.skip_broken: true, or import the "
                                   "suite with `crucible tasks import --skip-broken` (tasks.check_references: false skips "
                                   "this check)"
                                 : "\nfix them (tasks.check_references: false skips this check)"));
  };
  while (st.check_in_flight < max_in_flight && !st.check_queue.empty()) {
    auto t = st.check_queue.back();
    st.check_queue.pop_back();
    ++st.check_in_flight;
    candidate c{variant_id{0}, t, "", st.kind, false, true};
    self->request(st.deps->evaluators, caf::infinite, std::move(c))
      .then(
        [self, t, done](const verdict& v) {
          auto& st = self->state;
          --st.check_in_flight;
          if (v.status != verdict_status::ok) {
            auto it = st.deps->tasks->find(t);
            st.broken.emplace_back(t, t.value + (it != st.deps->tasks->end() ? " (" + it->second.path.string() + ")" : "")
                                          + ": " + v.message);
          }
          done();
          check_pump(self);
        },
        [self, t, done](const caf::error& e) {
          auto& st = self->state;
          --st.check_in_flight;
          auto err = to_error(e);
          if (err.code == errc::busy) {
            st.check_queue.push_back(t);
            arm_timer(self);
            return;
          }
          st.broken.emplace_back(t, t.value + ": the evaluators failed: " + err.message);
          done();
          check_pump(self);
        });
  }
}

void check_tasks(self_pointer self) {
  auto& st = self->state;
  if (st.check_in_flight > 0 || !st.check_queue.empty())
    return; // under way
  st.broken.clear();
  for (const auto& [id, t] : *st.deps->tasks)
    st.check_queue.push_back(id);
  std::reverse(st.check_queue.begin(), st.check_queue.end()); // popped from the back: catalogue order
  st.deps->log->info(component, "tasks: running the reference of each of ", st.check_queue.size(), " tasks once");
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

// -- checkpoints -------------------------------------------------------------------------------

void prune_checkpoints(trainer_state& st, const fs::path& root, const std::string& keep_name) {
  std::vector<std::pair<std::uint64_t, fs::path>> all;
  std::error_code ec;
  for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (it->is_directory() && name.rfind("step-", 0) == 0 && name != keep_name) {
      try {
        all.emplace_back(std::stoull(name.substr(5)), it->path());
      } catch (...) {
      }
    }
  }
  std::sort(all.begin(), all.end());
  const auto keep = static_cast<std::size_t>(std::max<std::int64_t>(1, st.deps->cfg.run.keep_checkpoints)) - 1;
  while (all.size() > keep) {
    fs::remove_all(all.front().second, ec);
    all.erase(all.begin());
  }
}

// Answers everyone waiting for the checkpoint `name` (trainer_state::saving) with `what`, the
// directory written or an error.
template <class T>
void finish_save(self_pointer self, const std::string& name, const T& what) {
  auto node = self->state.saving.extract(name);
  if (node.empty())
    return;
  for (auto& rp : node.mapped())
    rp.deliver(what);
}

// The learner's checkpoint into `tmp`, then trainer.json and samplers.json beside it; `tmp`
// becomes `root/name` and `latest` names it. Answers through finish_save.
void write_checkpoint(self_pointer self, fs::path tmp, std::string name, trainer_progress progress,
                      std::string samplers) {
  auto& st = self->state;
  self->request(st.deps->learner, learner_wait(st), save_atom_v, (tmp / "learner").string())
    .then(
      [self, tmp, name, progress, samplers](policy_version) {
        auto& st = self->state;
        const auto root = tmp.parent_path();
        const auto dir = root / name;
        for (auto [file, text] : {std::pair{"trainer.json", progress.to_json()}, std::pair{"samplers.json", samplers}})
          if (auto r = write_file_atomic(tmp / file, text); !r) {
            finish_save(self, name, make_error(r.error()));
            return;
          }
        std::error_code ec;
        fs::rename(tmp, dir, ec);
        if (ec) {
          finish_save(self, name,
                      make_error(errc::io, "cannot rename " + tmp.string() + " to " + dir.string() + ": " + ec.message()));
          return;
        }
        if (auto r = fsync_directory(root); !r) {
          finish_save(self, name, make_error(r.error()));
          return;
        }
        if (auto r = write_file_atomic(root / "latest", name + "\n"); !r) {
          finish_save(self, name, make_error(r.error()));
          return;
        }
        prune_checkpoints(st, root, name);
        st.deps->log->info(component, "checkpoint ", dir.string());
        finish_save(self, name, dir.string());
      },
      [self, name](const caf::error& e) {
        if (e == caf::sec::request_timeout)
          finish_save(self, name, make_error(learner_error(self->state, e, "a checkpoint save")));
        else
          finish_save(self, name, e);
      });
}

caf::result<std::string> save(self_pointer self) {
  auto& st = self->state;
  const auto root = st.deps->run_dir / "checkpoints";
  const auto name = "step-" + std::to_string(st.p.step);
  const auto dir = root / name;
  std::error_code ec;
  if (fs::exists(dir / "trainer.json", ec))
    return dir.string(); // this step is saved already
  if (auto writing = st.saving.find(name); writing != st.saving.end()) {
    auto rp = self->make_response_promise<std::string>();
    writing->second.push_back(rp); // being saved: answered when that save ends
    return rp;
  }
  const auto tmp = root / ("." + name + ".tmp");
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec)
    return make_error(errc::io, "cannot create " + tmp.string() + ": " + ec.message());
  auto progress = st.p;
  progress.stage_seconds = st.p.stage >= stage_sft && st.p.stage < stage_done ? now_seconds(st) : 0.0;
  auto rp = self->make_response_promise<std::string>();
  st.saving[name].push_back(rp);
  // Rollout actors that run (async) are asked for their samplers; stopped places keep theirs.
  collect_samplers(self, [self, tmp, name, progress] {
    write_checkpoint(self, tmp, name, progress, sampler_checkpoint{self->state.samplers}.to_json());
  });
  return rp;
}

trainer_impl_actor::behavior_type trainer(self_pointer self, std::shared_ptr<trainer_shared> shared) {
  auto& st = self->state;
  st.shared = shared;
  st.deps = &shared->deps;
  st.p = st.deps->progress;
  st.samplers = st.deps->samplers;
  st.stage_start = std::chrono::steady_clock::now();
  // The exemplar actor goes down with the trainer; the rollout actors follow it (they quit when
  // a collaborator goes down).
  self->attach_functor([shared](const caf::error&) {
    if (shared->exemplars)
      caf::anon_send_exit(shared->exemplars, caf::exit_reason::user_shutdown);
  });
  return {
    [self](advance_atom) -> caf::result<stage_report> {
      auto& st = self->state;
      st.exemplars = st.shared->exemplars;
      if (st.busy)
        return make_error(errc::busy, "a step of the schedule is already under way");
      st.busy = true;
      st.step_began = std::chrono::steady_clock::now();
      st.wait_seconds = st.prep_seconds = 0;
      st.pending = self->make_response_promise<stage_report>();
      auto rp = st.pending;
      with_devices(self, [self] {
        auto& st = self->state;
        if (st.settled) {
          advance(self);
          return;
        }
        // This process's first step: what an earlier process left undecided in the store, or
        // decided after the checkpoint this one resumed from, is unfinished (a crash's samples).
        // The step need not wait for the answer: the exemplar actor takes the settle before any
        // fate this process sends it (one sender, in order) and before any sample of its
        // rollouts, which start after it was sent.
        st.settled = true;
        settle_samples(self, static_cast<std::int64_t>(st.p.fates), [] {});
        advance(self);
      });
      return rp;
    },
    [self](stop_atom) -> caf::result<stage_report> {
      auto& st = self->state;
      st.exemplars = st.shared->exemplars;
      auto rp = self->make_response_promise<stage_report>();
      const auto how = st.deps->cfg.run.on_pause;
      stop_rollouts(self, how, [self, rp]() mutable {
        auto& st = self->state;
        // Groups that finished are in the store; their verdicts are reported, not trained on
        // (the next process samples its own).
        count_groups(st, st.groups, nullptr);
        std::vector<group_id> ids;
        for (const auto& g : st.groups)
          ids.push_back(g.group);
        st.groups.clear();
        send_fates(self, std::move(ids), storage::sample_fate::paused, st.p.step);
        settle_samples(self, -1, [self, rp]() mutable {
          rp.deliver(report_of(self->state, self->state.p.stage >= stage_done));
        });
      });
      return rp;
    },
    [self](save_atom) -> caf::result<std::string> { return save(self); },
    [self](drain_atom) -> std::string {
      auto& st = self->state;
      if (!st.busy)
        return "no step under way";
      if (!st.on_groups)
        return std::string{stage_name(st.p.stage)} + " step " + std::to_string(st.p.stage_step + 1)
               + " is past waiting for groups (an update, evaluations or a checkpoint under way): the pause waits for it";
      const auto have = st.groups.size();
      st.on_groups = nullptr;
      const auto what = std::string{stage_name(st.p.stage)} + " step " + std::to_string(st.p.stage_step + 1)
                        + " waited for groups (" + std::to_string(have) + " of " + std::to_string(st.want)
                        + " in); ended without training, the run pauses at step " + std::to_string(st.p.step);
      st.deps->log->info(component, what);
      finish_step(self, false);
      return what;
    },
    [self](rollout_group& g) {
      auto& st = self->state;
      ++st.groups_in;
      st.groups.push_back(std::move(g));
      if (st.on_groups) {
        auto f = st.on_groups;
        f();
      } else {
        drop_oldest(self, 8 * std::max<std::uint64_t>(1, st.want)); // nobody is training: keep the queue bounded
      }
    },
    [self](stall_atom, std::uint64_t wait, std::uint64_t seen) {
      auto& st = self->state;
      if (!st.busy || !st.on_groups || wait != st.waits)
        return; // that wait is over
      if (st.groups_in != seen) { // groups came: check the next period
        send_stall_check(self, wait);
        return;
      }
      st.on_groups = nullptr;
      fail_step(self, crucible::error{errc::timeout,
                                      "no rollout group arrived in " + stall_text(st) + " while "
                                          + stage_name(st.p.stage) + " step " + std::to_string(st.p.stage_step + 1)
                                          + " waited for them (" + std::to_string(st.groups.size()) + " of "
                                          + std::to_string(st.want) + " in, " + std::to_string(st.rollouts.size())
                                          + " rollout actors): the policy engine or the evaluators are silent; the run "
                                            "stops, its last checkpoint stays"});
    },
    [self](collect_atom) {
      auto& st = self->state;
      st.timer_armed = false;
      if (!st.busy)
        return;
      if (!st.tasks_checked && !st.check_queue.empty()) {
        check_pump(self);
        return;
      }
      if (st.p.stage == stage_warm) {
        warm_pump(self);
        return;
      }
      if (st.deps->cfg.run.mode != run_mode::sync || !st.on_groups || st.rollouts.empty())
        return;
      // Sync: if every rollout has taken its quota and has nothing in flight, the groups that
      // are missing were abandoned: train on what arrived, or sample the rest.
      auto left = std::make_shared<std::size_t>(st.rollouts.size());
      auto idle = std::make_shared<bool>(true);
      for (std::size_t i = 0; i < st.rollouts.size(); ++i) {
        const auto quota = st.rollout_quota[i];
        self->request(st.rollouts[i], caf::infinite, caf::get_atom_v)
          .then(
            [self, left, idle, quota](const rollout_stats& s) {
              if (s.in_flight > 0 || s.groups_started < quota)
                *idle = false;
              if (--*left > 0)
                return;
              auto& st = self->state;
              if (!*idle || !st.on_groups) {
                arm_timer(self);
                return;
              }
              st.on_groups = nullptr;
              stop_rollouts(self, in_flight_policy::finish, [self] {
                auto& st = self->state;
                if (st.groups.empty()) {
                  sampling_step(self); // every group was abandoned: sample again
                  return;
                }
                st.want = st.groups.size();
                train_on_groups(self);
              });
            },
            [self](const caf::error&) { arm_timer(self); });
      }
    },
  };
}

} // namespace

result<trainer_actor> spawn_trainer(caf::actor_system& sys, trainer_deps deps) {
  if (!deps.learner || !deps.engine || !deps.evaluators)
    return fail(errc::invalid_arg, "trainer: a learner, an engine and an evaluator pool are needed");
  if (!deps.tasks || deps.tasks->empty())
    return fail(errc::invalid_arg, "trainer: the task catalogue is empty");
  if (!deps.tokenizer || !deps.prompts.builder || deps.clk == nullptr || deps.log == nullptr)
    return fail(errc::invalid_arg, "trainer: a tokenizer, a prompt builder, a clock and a logger are needed");
  auto xopt = exemplar_actor_options::from(deps.cfg, deps.run_dir / "replay.db");
  auto shared = std::make_shared<trainer_shared>();
  shared->deps = std::move(deps);
  auto handle = sys.spawn(trainer, shared);
  auto exemplars = spawn_exemplar_actor(sys, xopt, {caf::actor_cast<group_sink_actor>(handle)});
  if (!exemplars.ok()) {
    caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
    return exemplars.error();
  }
  // Set before the handle is handed out, so before any message can reach the trainer (the
  // exemplar actor sends nothing before rollouts run).
  shared->exemplars = *exemplars;
  return caf::actor_cast<trainer_actor>(handle);
}

} // namespace crucible
