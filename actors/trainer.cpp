// actors/trainer.cpp: the trainer actor's messages, its rollout actors and their groups (fates
// included), and its checkpoints. The stage steps (warm start, SFT, sampling steps, stage
// transitions) are in trainer_steps.cpp, the state both share in trainer_state.hpp, and the
// trainer's files (seed variants, trainer.json, samplers.json) in trainer_files.cpp.
#include "actors/trainer.hpp"
#include "actors/trainer_state.hpp"

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
#include "env/device_gate.hpp"
#include "core/file_io.hpp"
#include "core/json.hpp"
#include "env/task_sampler.hpp"
#include "storage/replay_store.hpp"

namespace fs = std::filesystem;

namespace crucible {

namespace trainer_detail {

std::uint64_t next_random(trainer_state& st) {
  return splitmix64(st.deps->cfg.run.seed ^ 0x7472616e6572ull ^ splitmix64(++st.p.rng));
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double now_seconds(const trainer_state& st) { return st.p.stage_seconds + seconds_since(st.stage_start); }

std::string time_now(const trainer_state& st) { return format_iso8601(st.deps->clk->now()); }

// The tasks the run trains on: the catalogue, less those tasks.skip_broken left out.
std::shared_ptr<const task_catalog> tasks_of(const trainer_state& st) { return st.warm.pool ? st.warm.pool : st.deps->tasks; }

bool is_skipped(const trainer_state& st, const task_id& t) {
  return st.warm.pool && st.warm.pool->find(t) == st.warm.pool->end();
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
  r.skipped_tasks = st.warm.skipped;
  for (const auto& u : env::device_uses())
    r.devices.push_back({u.device, u.seconds, u.evaluation_s, u.policy_s, u.evaluator});
  r.records = std::move(st.step.records);
  st.step.records.clear();
  return r;
}

// Counts a scored variant into the run's tallies and writes its verdict record.
void count_verdict(trainer_state& st, const task_id& task, const verdict& v, std::uint64_t version, std::uint64_t group,
                   sample_tally* tally, int turn, bool seed) {
  ++st.p.variants;
  const bool good = v.correct && v.status == verdict_status::ok && v.has_speedup();
  if (good && !seed) { // the run's best and mean are the policy's: a seed variant's speedup is the suite's
    ++st.p.correct;
    st.p.speedup_sum += v.speedup;
    if (std::isnan(st.p.best_speedup) || v.speedup > st.p.best_speedup)
      st.p.best_speedup = v.speedup;
  }
  auto add = [&](sample_counts& c) {
    ++c.samples;
    if (good) {
      ++c.correct;
      c.speedup_sum += v.speedup;
    }
  };
  if (tally) {
    add(*tally);
    tally->reward_sum += v.reward;
    if (v.status == verdict_status::format_error)
      ++tally->format_errors;
    if (turn >= 0) {
      if (tally->turns.size() <= static_cast<std::size_t>(turn))
        tally->turns.resize(static_cast<std::size_t>(turn) + 1);
      add(tally->turns[static_cast<std::size_t>(turn)]);
    }
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
    .field("cache_hit", v.cache_hit);
  if (turn >= 0)
    w.field("turn", static_cast<std::int64_t>(turn));
  w.end_object();
  st.step.records.push_back(std::move(w).take());
}

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

// run.stall_timeout_s; zero: off.
std::chrono::milliseconds stall_limit(const trainer_state& st) {
  const auto s = st.deps->cfg.run.stall_timeout_s;
  return std::chrono::milliseconds{s > 0 ? static_cast<long long>(std::ceil(s * 1000.0)) : 0};
}

// How long a request to the learner may go unanswered (run.stall_timeout_s).
std::size_t learner_ranks(const trainer_state& st) {
  return std::max<std::size_t>(1, st.deps->cfg.learner.devices.size());
}

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
  self->delayed_send(caf::actor_cast<trainer_impl_actor>(self), stall_limit(st), stall_atom_v, wait, st.step.groups_in);
}

// A step starts waiting for groups: its silence is checked after run.stall_timeout_s.
void arm_stall_check(self_pointer self) {
  auto& st = self->state;
  if (stall_limit(st).count() > 0)
    send_stall_check(self, ++st.step.waits);
}


// -- rollouts ----------------------------------------------------------------------------------

result<void> spawn_rollouts(self_pointer self, std::uint64_t total_groups) {
  auto& st = self->state;
  const auto& cfg = st.deps->cfg;
  const auto n = static_cast<std::uint64_t>(std::max<std::int64_t>(1, cfg.rollout.actors));
  rollout_deps rd{st.deps->engine,           st.deps->evaluators,       st.exemplars,      tasks_of(st),
                  st.deps->prompts.builder, st.deps->prompts.parse,    cfg.reward,
                  st.deps->prompts.feedback};
  st.roll.quota.clear();
  auto resume = std::move(st.roll.resume);
  st.roll.resume.clear();
  const std::size_t active = total_groups > 0 ? static_cast<std::size_t>(std::min(n, total_groups)) : n;
  std::size_t spawned = 0;
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
    if (i < st.roll.samplers.size())
      opt.saved_sampler = st.roll.samplers[i];
    // The reopened groups, dealt round the rollout actors as a sync step's quotas are (the
    // exemplar actor reopened at most the step's groups).
    for (std::size_t j = spawned++; j < resume.size(); j += active)
      opt.resume.push_back(std::move(resume[j]));
    auto r = spawn_rollout_actor(self->system(), rd, opt);
    if (!r.ok())
      return r.error();
    self->send(*r, start_atom_v);
    st.roll.rollouts.push_back(*r);
    st.roll.quota.push_back(quota);
    st.roll.place.push_back(static_cast<std::size_t>(i));
  }
  return {};
}

// Once per process, before its first sampling step: has the exemplar actor reopen the groups
// of multi-turn episodes that earlier processes left in flight (a crash, a pause that dropped
// them), sampled at policy versions within `staleness` of the learner's and not after it, at
// most `limit` (0: as many as there are); their samples stop counting as unfinished. The new
// process's rollout actors are numbered above every group id in the store, so that their groups
// never take the id of one reopened. Then calls `then`.
void reopen_groups(self_pointer self, std::uint64_t staleness, std::uint64_t limit, std::function<void()> then) {
  auto& st = self->state;
  st.roll.reopened = true;
  const auto version = st.p.version;
  const auto oldest = version > staleness ? version - staleness : 0;
  if (st.deps->cfg.rollout.turns <= 1 || !st.deps->prompts.feedback)
    limit = 0; // nothing of this process could continue an episode
  else if (limit == 0)
    limit = std::numeric_limits<std::uint64_t>::max();
  self->request(st.exemplars, caf::infinite, reopen_atom_v, oldest, version, limit)
    .then(
      [self, then](episode_reopening& r) {
        auto& st = self->state;
        st.p.generation = std::max<std::uint64_t>(st.p.generation, r.max_group >> rollout_id_shift);
        const auto n = static_cast<std::uint64_t>(std::max<std::int64_t>(0, r.samples));
        st.p.unfinished -= std::min(st.p.unfinished, n);
        if (!r.groups.empty())
          st.deps->log->info(component, "continuing ", r.groups.size(), " group", r.groups.size() == 1 ? "" : "s",
                             " of episodes an earlier process left in flight (", n, " turn", n == 1 ? "" : "s",
                             " already evaluated)");
        st.roll.resume = std::move(r.groups);
        then();
      },
      [self, then](const caf::error& e) {
        self->state.deps->log->warn(component, "episodes left in flight were not reopened: ", to_string(e));
        then();
      });
}

void keep_sampler(trainer_state& st, std::size_t place, const sampler_state& s) {
  if (st.roll.samplers.size() <= place)
    st.roll.samplers.resize(place + 1);
  st.roll.samplers[place] = s.text;
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
  auto rollouts = std::move(st.roll.rollouts);
  auto places = std::move(st.roll.place);
  st.roll.rollouts.clear();
  st.roll.quota.clear();
  st.roll.place.clear();
  if (rollouts.empty()) {
    then();
    return;
  }
  // `drop` is enforced twice: the rollouts drop their groups (and have the engine drop their
  // waiting requests), and what still arrives after the stop is discarded here.
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
  for (std::size_t i = 0; i < rollouts.size(); ++i) {
    auto stopped = [self, done, place = places[i]](const rollout_stats&, const sampler_state& s) {
      keep_sampler(self->state, place, s);
      done();
    };
    // A rollout actor already gone leaves its place's last saved state.
    auto gone = [done](const caf::error&) { done(); };
    // Groups that will be discarded are not waited for: the rollout drops them at once and the
    // engine its waiting requests (stop_atom, cancel_atom), whatever rollout.on_stop says.
    if (how == in_flight_policy::drop)
      self->request(rollouts[i], caf::infinite, stop_atom_v, cancel_atom_v).then(stopped, gone);
    else
      self->request(rollouts[i], caf::infinite, stop_atom_v).then(stopped, gone);
  }
}

// Asks every running rollout actor for its task sampler's state (a checkpoint while they run),
// then calls `then`.
void collect_samplers(self_pointer self, std::function<void()> then) {
  auto& st = self->state;
  if (st.roll.rollouts.empty()) {
    then();
    return;
  }
  auto left = std::make_shared<std::size_t>(st.roll.rollouts.size());
  auto done = [left, then] {
    if (--*left == 0)
      then();
  };
  for (std::size_t i = 0; i < st.roll.rollouts.size(); ++i)
    self->request(st.roll.rollouts[i], caf::infinite, save_atom_v)
      .then(
        [self, done, place = st.roll.place[i]](const sampler_state& s) {
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
  for (const auto& g : st.roll.groups)
    if (stale(g)) {
      dropped += g.completions.size();
      ids.push_back(g.group);
    }
  st.roll.groups.erase(std::remove_if(st.roll.groups.begin(), st.roll.groups.end(), stale), st.roll.groups.end());
  st.p.dropped_stale += dropped;
  st.roll.dropped_now += dropped;
  send_fates(self, std::move(ids), storage::sample_fate::stale, st.p.step);
  drop_oldest(self, bound);
}

// Drops the oldest waiting groups until at most `bound` wait, counting their samples as stale.
void drop_oldest(self_pointer self, std::size_t bound) {
  auto& st = self->state;
  std::vector<group_id> ids;
  while (st.roll.groups.size() > bound) {
    const auto n = st.roll.groups.front().completions.size();
    ids.push_back(st.roll.groups.front().group);
    st.roll.groups.pop_front();
    st.p.dropped_stale += n;
    st.roll.dropped_now += n;
  }
  send_fates(self, std::move(ids), storage::sample_fate::stale, st.p.step);
}

// Empties the queue of groups that arrived and will not be trained on (a stage ended, or a
// pause with run.on_pause drop), counting their samples: the replay store holds them all the same.
void discard_groups(self_pointer self) {
  auto& st = self->state;
  for (const auto& g : st.roll.groups)
    st.p.discarded += g.completions.size();
  send_fates(self, group_ids(st.roll.groups), storage::sample_fate::discarded, st.p.step);
  st.roll.groups.clear();
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
  auto finish = [self, tmp, name, progress, samplers](policy_version) {
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
  };
  if (!st.deps->learner) { // behind an endpoint: the trainer's own files only
    finish(policy_version{st.p.version});
    return;
  }
  self->request(st.deps->learner, learner_wait(st), save_atom_v, (tmp / "learner").string())
    .then(
      finish,
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
    write_checkpoint(self, tmp, name, progress, sampler_checkpoint{self->state.roll.samplers}.to_json());
  });
  return rp;
}

trainer_impl_actor::behavior_type trainer(self_pointer self, std::shared_ptr<trainer_shared> shared) {
  auto& st = self->state;
  st.shared = shared;
  st.deps = &shared->deps;
  st.p = st.deps->progress;
  st.roll.samplers = st.deps->samplers;
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
      if (st.step.busy)
        return make_error(errc::busy, "a step of the schedule is already under way");
      st.step.busy = true;
      st.step.began = std::chrono::steady_clock::now();
      st.step.wait_seconds = st.step.prep_seconds = 0;
      st.step.pending = self->make_response_promise<stage_report>();
      auto rp = st.step.pending;
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
        count_groups(st, st.roll.groups, nullptr);
        send_fates(self, group_ids(st.roll.groups), storage::sample_fate::paused, st.p.step);
        st.roll.groups.clear();
        settle_samples(self, -1, [self, rp]() mutable {
          rp.deliver(report_of(self->state, self->state.p.stage >= stage_done));
        });
      });
      return rp;
    },
    [self](save_atom) -> caf::result<std::string> { return save(self); },
    [self](drain_atom) -> std::string {
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
    },
    [self](rollout_group& g) {
      auto& st = self->state;
      ++st.step.groups_in;
      st.roll.groups.push_back(std::move(g));
      if (st.step.on_groups) {
        auto f = st.step.on_groups;
        f();
      } else {
        drop_oldest(self, 8 * std::max<std::uint64_t>(1, st.step.want)); // nobody is training: keep the queue bounded
      }
    },
    [self](stall_atom, std::uint64_t wait, std::uint64_t seen) {
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
    },
    [self](collect_atom) {
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
      if (st.deps->cfg.run.mode != run_mode::sync || !st.step.on_groups || st.roll.rollouts.empty())
        return;
      // Sync: if every rollout has taken its quota and has nothing in flight, the groups that
      // are missing were abandoned: train on what arrived, or sample the rest.
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
                  sampling_step(self); // every group (or all but too few for the learner ranks) was abandoned: sample again
                  return;
                }
                st.step.want = st.roll.groups.size();
                train_on_groups(self);
              });
            },
            [self](const caf::error&) { arm_timer(self); });
      }
    },
  };
}

} // namespace trainer_detail

result<trainer_actor> spawn_trainer(caf::actor_system& sys, trainer_deps deps) {
  using trainer_detail::trainer;
  using trainer_detail::trainer_shared;
  // Behind an endpoint (policy.backend openai) nothing trains: no learner, and the configuration
  // allows no stage that updates.
  const bool endpoint = deps.cfg.policy.backend == "openai";
  if ((!deps.learner && !endpoint) || !deps.engine || !deps.evaluators)
    return fail(errc::invalid_arg, "trainer: a learner, an engine and an evaluator pool are needed");
  const auto& g = deps.cfg.stages;
  if (!deps.learner && (g.sft.steps > 0 || g.self_supervised.steps > 0 || g.rl.steps > 0))
    return fail(errc::invalid_arg, "trainer: a stage that updates the policy needs a learner");
  if (!deps.tasks || deps.tasks->empty())
    return fail(errc::invalid_arg, "trainer: the task catalogue is empty");
  if ((!deps.tokenizer && !endpoint) || !deps.prompts.builder || deps.clk == nullptr || deps.log == nullptr)
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
