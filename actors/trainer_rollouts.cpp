// actors/trainer_rollouts.cpp: the trainer's rollout places: the rollout actors of a sampling
// stage (async) or step (sync), spawned and stopped with their task samplers kept per place; the
// queue of groups they sent, with the groups dropped for staleness or discarded and each group's
// fate told to the replay store (through the exemplar actor); the reopening of episodes earlier
// processes left in flight. Called by the step (trainer_step.cpp) and the actor's messages
// (trainer.cpp); it calls neither.
#include "actors/trainer_state.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <utility>

#include <caf/send.hpp>

#include "storage/replay_store.hpp"

namespace crucible::trainer_detail {

result<void> spawn_rollouts(self_pointer self, std::uint64_t total_groups) {
  auto& st = self->state;
  const auto& cfg = st.deps->cfg;
  const auto n = static_cast<std::uint64_t>(std::max<std::int64_t>(1, cfg.rollout.actors));
  rollout_deps rd{{},                       st.deps->evaluators,       st.exemplars,      tasks_of(st),
                  st.deps->prompts.builder, st.deps->prompts.parse,    cfg.reward,
                  st.deps->prompts.feedback};
  st.roll.quota.clear();
  st.roll.index.clear();
  auto resume = std::move(st.roll.resume);
  st.roll.resume.clear();
  const std::size_t active = total_groups > 0 ? static_cast<std::size_t>(std::min(n, total_groups)) : n;
  // Async RL's staleness-aware admission: at most max(1, max_staleness) steps' groups ahead of the
  // learner. A group started while an update runs is trained at the earliest one version later,
  // and one more for each step's worth of groups ahead of it: past that many it would arrive stale.
  st.roll.admission = total_groups == 0 && st.p.stage == stage_rl && cfg.run.mode == run_mode::async
                      && cfg.stages.rl.admission == "staleness";
  std::uint64_t admit = 0;
  if (st.roll.admission) {
    const auto ahead = static_cast<std::uint64_t>(std::max<std::int64_t>(1, cfg.stages.rl.max_staleness)) * st.step.want;
    admit = ahead > st.roll.groups.size() ? ahead - st.roll.groups.size() : 0;
  }
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
    if (st.roll.admission)
      opt.admitted = static_cast<std::int64_t>(admit / n + (i < admit % n ? 1 : 0));
    if (!st.kind.empty() && opt.hardware.empty())
      opt.hardware = st.kind;
    if (i < st.roll.samplers.size())
      opt.saved_sampler = st.roll.samplers[i];
    // The reopened groups, dealt round the rollout actors as a sync step's quotas are (the
    // exemplar actor reopened at most the step's groups).
    for (std::size_t j = spawned++; j < resume.size(); j += active)
      opt.resume.push_back(std::move(resume[j]));
    // Each rollout place samples from one engine, the same one across pauses and resumes.
    rd.engine = st.deps->engines[i % st.deps->engines.size()];
    auto r = spawn_rollout_actor(self->system(), rd, opt);
    if (!r.ok())
      return r.error();
    self->send(*r, start_atom_v);
    st.roll.rollouts.push_back(*r);
    st.roll.quota.push_back(quota);
    st.roll.place.push_back(static_cast<std::size_t>(i));
    st.roll.index.push_back(opt.index);
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
void stop_rollouts(self_pointer self, in_flight_policy how, std::function<void()> then) {
  auto& st = self->state;
  auto rollouts = std::move(st.roll.rollouts);
  auto places = std::move(st.roll.place);
  st.roll.rollouts.clear();
  st.roll.quota.clear();
  st.roll.place.clear();
  st.roll.index.clear();
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
  readmit(self, ids);
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
  readmit(self, ids);
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

void readmit(self_pointer self, const std::vector<group_id>& ids) {
  auto& st = self->state;
  if (!st.roll.admission || st.roll.rollouts.empty())
    return;
  for (const auto& id : ids) {
    // To the actor that sampled it while it runs (its share stays its own); else round the others.
    const auto at = std::find(st.roll.index.begin(), st.roll.index.end(), id.value >> rollout_id_shift);
    std::size_t i = 0;
    if (at != st.roll.index.end()) {
      i = static_cast<std::size_t>(at - st.roll.index.begin());
    } else {
      i = st.roll.next_admit++ % st.roll.rollouts.size();
    }
    self->send(st.roll.rollouts[i], admit_atom_v, std::uint64_t{1});
  }
}

} // namespace crucible::trainer_detail
