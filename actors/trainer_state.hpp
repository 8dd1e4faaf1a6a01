// actors/trainer_state.hpp: inside the trainer actor, not part of its interface: the state the
// actor's messages (trainer.cpp), its step (trainer_step.cpp) and its rollout places
// (trainer_rollouts.cpp) share, and the functions each file offers the ones before it (calls go
// one way: trainer.cpp -> trainer_step.cpp -> trainer_rollouts.cpp). Included by those files only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <caf/duration.hpp>
#include <caf/sec.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include "actors/actor_config.hpp"
#include "actors/exemplar.hpp"
#include "actors/trainer.hpp"
#include "env/prompt/task_sampler.hpp"

namespace crucible::trainer_detail {

inline constexpr std::string_view component = "trainer";

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Samples, the correct ones (ok, correct, with a speedup) and their speedups.
struct sample_counts {
  std::uint64_t samples = 0, correct = 0;
  double speedup_sum = 0;

  double correct_share() const { return samples ? static_cast<double>(correct) / samples : 0.0; }
  double mean_speedup() const { return correct ? speedup_sum / correct : std::numeric_limits<double>::quiet_NaN(); }
};

// One sampling step's tallies, for its train_step record and the stopping rules.
struct sample_tally : sample_counts {
  std::uint64_t format_errors = 0;
  double reward_sum = 0;
  // Multi-turn episodes: the counts of each turn (turns[t]); empty for one-turn groups.
  std::vector<sample_counts> turns;
};

// What spawn_trainer and the actor share: the deps, and the exemplar actor, which is spawned
// after the trainer (the trainer is its sink) and set before the trainer's handle is handed out.
struct trainer_shared {
  trainer_deps deps;
  exemplar_actor exemplars;
};

// The rollouts of the current sampling stage (async) or step (sync), and the groups they sent.
struct trainer_rollouts {
  std::vector<rollout_actor> rollouts;
  std::vector<std::uint64_t> quota;  // sync: groups each rollout takes
  std::vector<std::size_t> place;    // the place each rollout holds (an index into samplers)
  std::vector<std::uint64_t> index;  // each rollout's number: the high bits of its group ids
  bool admission = false;            // async RL's staleness-aware admission (stages.rl.admission)
  std::size_t next_admit = 0;        // the rollout that takes an admission whose group's actor is gone
  // Per rollout place, the task sampler state its next rollout actor continues ("": fresh); a
  // place's state is taken back when its rollout actor stops, or asked for at a checkpoint.
  std::vector<std::string> samplers;
  std::deque<rollout_group> groups;
  std::uint64_t dropped_now = 0; // dropped for staleness since the last report
  // Groups of multi-turn episodes an earlier process left in flight, reopened at the exemplar
  // actor before this process's first sampling step; the next rollout actors spawned continue them.
  bool reopened = false;
  std::vector<episode_resume> resume;
  bool keep_queue = false; // sync: the first step after the reopen keeps the groups already in
};

// The step under way.
struct trainer_step {
  bool busy = false;
  caf::typed_response_promise<stage_report> pending;
  std::vector<std::string> records;
  std::function<void()> on_groups; // called when groups arrive while a step waits for them
  // What the step does next: once the stage under way is done (the task check, the warm start),
  // and with a sampling step's groups once they are here (run_step sets them).
  std::function<void()> then;
  std::function<void(std::vector<rollout_group>)> then_groups;
  std::uint64_t want = 0;          // groups the waiting step needs
  bool timer_armed = false;
  std::uint64_t waits = 0;         // waits for groups so far (matches a stall check to its wait)
  std::uint64_t groups_in = 0;     // groups arrived so far (a stall check sees whether any came)
  // Where the step's wall time went (its train_step record): waiting for groups (the rollouts'
  // generation and evaluation; a sampling step waits from its start) and building SFT examples;
  // the learner reports its own update time.
  std::chrono::steady_clock::time_point began; // the step request's arrival
  double wait_seconds = 0, prep_seconds = 0;
  // Policy versions by which the batch's samples' sampling policy lags the learner's when the
  // step takes them (take_batch): the most and the mean over its samples.
  std::uint64_t staleness_max = 0;
  double staleness_mean = 0;
};

// Warm start: the tasks' references checked, the exemplar store seeded.
struct trainer_warm_start {
  std::vector<std::size_t> queue;
  std::size_t in_flight = 0;
  std::size_t done = 0;
  bool tasks_checked = false;          // every task's reference ran (tasks.check_references), in this process
  std::vector<task_id> check_queue;    // tasks whose reference is still to be run
  std::size_t check_in_flight = 0;
  std::vector<std::pair<task_id, std::string>> broken; // each task whose reference failed, "NAME (FILE): message"
  // tasks.skip_broken: the tasks the run trains on (the catalogue less the skipped ones; null:
  // the whole catalogue) and the names of those it skips, in catalogue order.
  std::shared_ptr<const task_catalog> pool;
  std::vector<std::string> skipped;
};

// SFT example building.
struct trainer_sft {
  std::vector<std::vector<std::int32_t>> prompts, completions;
  std::size_t waiting = 0;
  std::size_t second_turns = 0; // examples of the step that are a second turn (rollout.turns > 1)
};

// The actor's state: what every role shares at the top, each role's own in its part.
struct trainer_state {
  static inline const char* name = "crucible.trainer";

  std::shared_ptr<trainer_shared> shared;
  trainer_deps* deps = nullptr;
  trainer_progress p;
  exemplar_actor exemplars;
  std::string kind;   // hardware kind candidates are evaluated on
  std::string device; // its device model, shown in prompts
  std::chrono::steady_clock::time_point stage_start = std::chrono::steady_clock::now();
  bool settled = false;     // the store's samples were settled against p.fates at this process's start
  bool stage_began = false; // a stage began in this process: its first update may need fresh moments

  // Checkpoints being written, by directory name, with everyone waiting for each: a second
  // save of the same step (a pause right at a periodic checkpoint) waits for the first instead
  // of clearing the temporary directory the first is writing into.
  std::map<std::string, std::vector<caf::typed_response_promise<std::string>>> saving;

  trainer_rollouts roll;
  trainer_step step;
  trainer_warm_start warm;
  trainer_sft sft;
};

using self_pointer = trainer_impl_actor::stateful_pointer<trainer_state>;

// -- helpers every file uses -------------------------------------------------------------------

inline std::uint64_t next_random(trainer_state& st) {
  return splitmix64(st.deps->cfg.run.seed ^ 0x7472616e6572ull ^ splitmix64(++st.p.rng));
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

inline double now_seconds(const trainer_state& st) { return st.p.stage_seconds + seconds_since(st.stage_start); }

inline std::string time_now(const trainer_state& st) { return format_iso8601(st.deps->clk->now()); }

// The tasks the run trains on: the catalogue, less those tasks.skip_broken left out.
inline std::shared_ptr<const task_catalog> tasks_of(const trainer_state& st) {
  return st.warm.pool ? st.warm.pool : st.deps->tasks;
}

inline bool is_skipped(const trainer_state& st, const task_id& t) {
  return st.warm.pool && st.warm.pool->find(t) == st.warm.pool->end();
}

// The learner's data-parallel ranks (learner.devices; at least 1): an update needs a group (RL) or
// an example (SFT) for each.
inline std::size_t learner_ranks(const trainer_state& st) {
  return std::max<std::size_t>(1, st.deps->cfg.learner.devices.size());
}

// run.stall_timeout_s; zero: off.
inline std::chrono::milliseconds stall_limit(const trainer_state& st) {
  const auto s = st.deps->cfg.run.stall_timeout_s;
  return std::chrono::milliseconds{s > 0 ? static_cast<long long>(std::ceil(s * 1000.0)) : 0};
}

// How long a request to the learner may go unanswered (run.stall_timeout_s).
inline caf::duration learner_wait(const trainer_state& st) {
  const auto limit = stall_limit(st);
  return limit.count() > 0 ? caf::duration{limit} : caf::duration{caf::infinite};
}

// "90 s (run.stall_timeout_s)": how long a role was silent, for its error.
inline std::string stall_text(const trainer_state& st) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", st.deps->cfg.run.stall_timeout_s);
  return std::string{secs} + " s (run.stall_timeout_s)";
}

// The learner's error; its silence (the request timed out) named as such.
inline crucible::error learner_error(const trainer_state& st, const caf::error& e, const char* what) {
  if (e != caf::sec::request_timeout)
    return to_error(e);
  return crucible::error{errc::timeout, std::string{"the learner did not answer "} + what + " in " + stall_text(st)
                                            + ": it is stuck or gone (a collective waiting "
                                              "for a peer, a device fault); the run stops, its last checkpoint stays"};
}

// -- trainer_step.cpp: one step of the schedule, and what the actor's messages tell it ------------

// One step (advance_atom), top to bottom; it ends in finish_step or fail_step.
void run_step(self_pointer self);
// A group from the exemplar actor: queued, and the waiting step told.
void group_arrived(self_pointer self, rollout_group g);
// drain_atom: a step that waits for groups ends without training; says what it did.
std::string drain_step(self_pointer self);
// stall_atom: a step's wait `wait` checked for silence (`seen`: the groups in when it was armed).
void stall_check(self_pointer self, std::uint64_t wait, std::uint64_t seen);
// collect_atom: what waits for a retry (task checks, seed variants, a sync step's groups) tries again.
void retry_waiting(self_pointer self);

// Counts (and records) the verdicts of every member of `groups` (a turn of an episode with its turn).
template <class Groups>
void count_groups(trainer_state& st, const Groups& groups, sample_tally* tally) {
  for (const auto& g : groups)
    for (std::size_t i = 0; i < g.verdicts.size() && i < g.completions.size(); ++i)
      count_verdict(st, g.task, g.verdicts[i], g.completions[i].policy_version.value, g.group.value, tally,
                    i < g.turns.size() ? static_cast<int>(g.turns[i]) : -1);
}

// The group ids of `groups`, in order (sample_fates).
template <class Groups>
std::vector<group_id> group_ids(const Groups& groups) {
  std::vector<group_id> ids;
  for (const auto& g : groups)
    ids.push_back(g.group);
  return ids;
}

// -- trainer_records.cpp: what a step writes ---------------------------------------------------

// The step's report: the counters and the records since the last one.
stage_report report_of(trainer_state& st, bool done);
// Counts a scored variant into the run's tallies and writes its verdict record. `turn`: the
// verdict's turn in its episode (multi-turn), -1 for a one-turn group. A seed variant's (`seed`)
// counts among the variants, not in the policy's correct, best and mean.
void count_verdict(trainer_state& st, const task_id& task, const verdict& v, std::uint64_t version, std::uint64_t group,
                   sample_tally* tally, int turn = -1, bool seed = false);
// The current stage's step count and time limit (stages.NAME.steps, max_minutes); nullopt after
// the last stage.
std::optional<std::pair<std::int64_t, double>> stage_limits(const trainer_state& st);
// "step 120/700, 3.41 s a step, 32m58s left" (see trainer_records.cpp).
std::string stage_progress_text(const trainer_state& st);
// The train_step record of an update (`tally`: a sampling step's, null for SFT).
std::string train_record(trainer_state& st, const train_report& r, const sample_tally* tally, std::size_t groups);

// -- trainer_rollouts.cpp: the rollout places and their groups -----------------------------------

// Spawns the rollout actors of a sampling stage (0: async, until stopped) or step (its groups,
// dealt round them as quotas), each continuing its place's sampler, and starts them.
result<void> spawn_rollouts(self_pointer self, std::uint64_t total_groups);
void reopen_groups(self_pointer self, std::uint64_t staleness, std::uint64_t limit, std::function<void()> then);
void send_fates(self_pointer self, std::vector<group_id> ids, std::string_view fate, std::uint64_t step);
void settle_samples(self_pointer self, std::int64_t kept, std::function<void()> then);
void stop_rollouts(self_pointer self, in_flight_policy how, std::function<void()> then);
void collect_samplers(self_pointer self, std::function<void()> then);
void drop_stale(self_pointer self, std::uint64_t max_staleness, std::uint64_t bound);
void drop_oldest(self_pointer self, std::size_t bound);
void discard_groups(self_pointer self);
// Admission: the groups that left the queue (trained, dropped) let as many more start.
void readmit(self_pointer self, const std::vector<group_id>& ids);

} // namespace crucible::trainer_detail
