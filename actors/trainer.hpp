// actors/trainer.hpp: the stage schedule of a run (DESIGN §1.5), one step at a time for the
// coordinator: warm start (the seed variants evaluated into the exemplar store), SFT on the
// verified seed variants, self-supervised (the policy's own correct samples as SFT data) and
// contrastive RL (GRPO on groups from the rollout actors). The trainer owns the exemplar actor
// and the rollout actors (it is their groups' sink), asks the learner for updates, and writes
// checkpoints of the learner and of its own position (docs/training.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "actors/evaluator.hpp"
#include "actors/interfaces.hpp"
#include "actors/rollout.hpp"
#include "core/clock.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "text/tokenizer.hpp"

namespace crucible {

/// One seed variant of a task: SEEDS/<task>/<name>.py.
struct seed_variant {
  task_id task;
  std::string name;    ///< file stem, e.g. "fast_inplace"
  std::string code;
  bool wrong = false;  ///< wrong_*.py: known to be incorrect (evaluated for the store, never trained on)
  std::string summary; ///< the first line of the module docstring ("" when none)
};

/// The seed variants of every task of `tasks` found under `dir` (dir/<task name>/*.py), ordered by
/// task and file name, leaving out files whose names match a pattern of `exclude` (fnmatch: `*`,
/// `?`, `[...]`). A task without a folder has none. errc::io for an unreadable file; errc::config
/// for a pattern that is empty or holds a '/'.
result<std::vector<seed_variant>> load_seed_variants(const std::filesystem::path& dir, const task_catalog& tasks,
                                                     const std::vector<std::string>& exclude = {});

/// The response an SFT example teaches for `v`: every section heading of `sections` in order,
/// the summary under each but the last, and the code in a ```python block under the last.
/// env::parse_response accepts it and gives back v.code.
std::string seed_response(const std::vector<std::string>& sections, const seed_variant& v);

/// The schedule position and the run's counters: what a checkpoint's trainer.json holds.
struct trainer_progress {
  /// 0 warm start, 1 SFT, 2 self-supervised, 3 contrastive RL, 4 complete.
  int stage = 0;
  std::uint64_t stage_step = 0;   ///< updates of the current stage
  double stage_seconds = 0;       ///< wall time spent in the current stage by earlier processes
  std::uint64_t step = 0;         ///< learner updates of the run
  std::uint64_t version = 0;      ///< policy version the learner holds
  std::uint64_t variants = 0;     ///< scored variants (warm start included)
  std::uint64_t correct = 0;      ///< of the policy's samples among them, correct with a speedup (seed variants not counted)
  double best_speedup = std::numeric_limits<double>::quiet_NaN(); ///< the best of those (a seed variant's never)
  double speedup_sum = 0;         ///< over the correct ones
  std::uint64_t dropped_stale = 0; ///< samples dropped for staleness
  std::uint64_t discarded = 0;     ///< samples of groups never trained on (left when a stage ended)
  std::uint64_t unfinished = 0;    ///< samples whose group never reached the trainer (in flight at a stop or crash), or whose fate a crashed process decided after the checkpoint
  std::uint64_t fates = 0;         ///< fate decisions sent to the replay store (sample_fates::seq)
  std::uint64_t rng = 0;          ///< draws taken from the trainer's random stream
  std::uint64_t generation = 0;   ///< processes that ran this run before this one (ids stay unique)

  std::string to_json() const;
  /// errc::corrupt naming `origin` and the key.
  static result<trainer_progress> from_json(std::string_view text, const std::string& origin);
  friend bool operator==(const trainer_progress&, const trainer_progress&) = default;
};

/// The task samplers of a run's rollout places: what a checkpoint's samplers.json holds. Place k
/// is the k-th rollout actor of a sampling stage (of rollout.actors); each rollout actor that
/// takes place k (the next sync step, the next stage, a resumed run) continues its sampler.
struct sampler_checkpoint {
  /// env::task_sampler::save text per place; "" for a place whose sampler has not run yet.
  std::vector<std::string> states;

  /// {"format":"crucible-samplers-1","samplers":[{"place":k,"state":TEXT},...]}, places with a
  /// state only.
  std::string to_json() const;
  /// errc::corrupt naming `origin` and the key (a place given twice, a place >= 2^23 included).
  static result<sampler_checkpoint> from_json(std::string_view text, const std::string& origin);
  friend bool operator==(const sampler_checkpoint&, const sampler_checkpoint&) = default;
};

/// The task sampler states to continue from checkpoint directory `dir` over the run's pool
/// `tasks`, from its samplers.json. A checkpoint without that file (written before samplers were
/// checkpointed) gives none, and a warning says that the samplers start fresh. errc::config
/// naming the file, the place and the tasks that differ when the pool changed since the
/// checkpoint (the message says how to start the samplers fresh instead); errc::corrupt for a
/// malformed file or state; errc::io when it cannot be read.
result<std::vector<std::string>> load_sampler_states(const std::filesystem::path& dir, const task_catalog& tasks,
                                                     logger& log);

/// "warm_start", "sft", "self_supervised", "rl", "" (complete).
/// The stages of the schedule, as trainer_progress::stage counts them.
inline constexpr int stage_warm = 0, stage_sft = 1, stage_self = 2, stage_rl = 3, stage_search = 4, stage_done = 5;

const char* stage_name(int stage) noexcept;

/// What the trainer works with. Handles must be valid; `clk` and `log` are borrowed and must outlive
/// the actor.
struct trainer_deps {
  config cfg;
  std::filesystem::path run_dir;
  learner_actor learner;
  /// The policy's engines (engine.devices; behind an endpoint its one engine actor): rollout
  /// actor i samples from engines[i mod N].
  std::vector<engine_actor> engines;
  evaluator_pool_actor evaluators;
  std::shared_ptr<const task_catalog> tasks;
  std::vector<seed_variant> seeds;
  prompt_setup prompts;
  std::shared_ptr<const policy::tokenizer> tokenizer;
  const clock* clk = nullptr;
  logger* log = nullptr;
  trainer_progress progress; ///< where to start (a fresh run: the defaults)
  /// The task sampler state each rollout place continues (load_sampler_states); a place without
  /// one (or with "") starts a fresh sampler.
  std::vector<std::string> samplers;
  /// The exemplar actor on a thread of its own (its store calls block); false: on the actor
  /// system's scheduler, for tests on CAF's deterministic one.
  bool exemplar_detached = true;
};

/// Spawns the trainer. It opens the exemplar actor over RUN/replay.db with itself as the sink of
/// complete groups; rollout actors are spawned when a sampling stage begins.
///
/// advance: runs the next step of the schedule and replies with a stage_report whose records are
/// `verdict` records (warm start, and the samples of a sampling step) and one `train_step` record
/// per update. A stage ends after its steps, its max_minutes, or its stopping rule; the reply
/// after the last stage has done = true. In async mode (run.mode) the rollouts of a sampling stage
/// run from its first step to its last, and a step takes the groups that arrived (groups sampled
/// more than max_staleness versions ago are dropped and counted; at most 4 x groups are kept);
/// in sync mode each step samples exactly its groups, then trains.
///
/// stop: stops the rollouts, finishing or dropping their groups (run.on_pause), and replies with a
/// report of the verdicts that arrived meanwhile (they are in the store; no update is made).
/// save: writes RUN/checkpoints/step-N (the learner's checkpoint in learner/, trainer.json, and
/// samplers.json with the task samplers of the rollout places: asked of the rollout actors that
/// run, as their last stop left them for the others) atomically, points RUN/checkpoints/latest
/// at it, keeps run.keep_checkpoints, replies with the path.
///
/// The trainer keeps each place's sampler state when it stops the place's rollout actor and
/// hands it to the next one, so a place's sampler goes on across sync steps, stages and resumes.
///
/// errc::invalid_arg for a missing collaborator or an empty task catalogue.
result<trainer_actor> spawn_trainer(caf::actor_system& sys, trainer_deps deps);

/// The newest complete checkpoint of a run: RUN/checkpoints/latest names it. errc::not_found when
/// the run has none; errc::corrupt when `latest` names a missing directory.
result<std::filesystem::path> latest_checkpoint(const std::filesystem::path& run_dir);

} // namespace crucible
