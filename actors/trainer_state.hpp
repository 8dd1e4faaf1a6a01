// actors/trainer_state.hpp: inside the trainer actor, not part of its interface: the state the
// actor's messages (trainer.cpp) and its stage steps (trainer_steps.cpp) share, and the functions
// each file calls in the other. Included by those two files only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include "actors/exemplar.hpp"
#include "actors/trainer.hpp"
#include "env/task_sampler.hpp"

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
  std::uint64_t want = 0;          // groups the waiting step needs
  bool timer_armed = false;
  std::uint64_t waits = 0;         // waits for groups so far (matches a stall check to its wait)
  std::uint64_t groups_in = 0;     // groups arrived so far (a stall check sees whether any came)
  // Where the step's wall time went (its train_step record): waiting for groups (the rollouts'
  // generation and evaluation; a sampling step waits from its start) and building SFT examples;
  // the learner reports its own update time.
  std::chrono::steady_clock::time_point began; // the step request's arrival
  double wait_seconds = 0, prep_seconds = 0;
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

// -- trainer.cpp ---------------------------------------------------------------------------------

std::uint64_t next_random(trainer_state& st);
double seconds_since(std::chrono::steady_clock::time_point t);
double now_seconds(const trainer_state& st);
std::string time_now(const trainer_state& st);
bool is_skipped(const trainer_state& st, const task_id& t);
// `turn`: the verdict's turn in its episode (multi-turn), -1 for a one-turn group. A seed
// variant's (`seed`) counts among the variants, not in the policy's correct, best and mean.
void count_verdict(trainer_state& st, const task_id& task, const verdict& v, std::uint64_t version, std::uint64_t group,
                   sample_tally* tally, int turn = -1, bool seed = false);
void finish_step(self_pointer self, bool done);
void fail_step(self_pointer self, const crucible::error& err);
caf::duration learner_wait(const trainer_state& st);
// The learner's data-parallel ranks (learner.devices; at least 1): an update needs a group (RL) or
// an example (SFT) for each.
std::size_t learner_ranks(const trainer_state& st);
crucible::error learner_error(const trainer_state& st, const caf::error& e, const char* what);
void arm_stall_check(self_pointer self);
result<void> spawn_rollouts(self_pointer self, std::uint64_t total_groups);
void reopen_groups(self_pointer self, std::uint64_t staleness, std::uint64_t limit, std::function<void()> then);
void send_fates(self_pointer self, std::vector<group_id> ids, std::string_view fate, std::uint64_t step);
void stop_rollouts(self_pointer self, in_flight_policy how, std::function<void()> then);
void drop_stale(self_pointer self, std::uint64_t max_staleness, std::uint64_t bound);
void discard_groups(self_pointer self);

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

// -- trainer_steps.cpp ---------------------------------------------------------------------------

void advance(self_pointer self);
void arm_timer(self_pointer self);
void check_pump(self_pointer self);
void sampling_step(self_pointer self);
void train_on_groups(self_pointer self);
void warm_pump(self_pointer self);
void with_devices(self_pointer self, std::function<void()> then);

} // namespace crucible::trainer_detail
