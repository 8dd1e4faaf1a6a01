// storage/pace.hpp: the run's pace plan from its metrics records: of each process's RL steps,
// how long they waited for evaluated groups and how long the learner trained, the verdicts per
// minute each evaluator GPU gave, and the evaluator GPUs that would supply samples as fast as the
// learner trains on them (docs/report.md, "Pace"). `crucible report` prints it and puts it in
// report.html.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace crucible::storage {

/// The RL steps of one process of the run (between a run_started or run_resumed record and the
/// next), plain value.
struct pace_segment {
  std::int64_t first_step = 0, last_step = 0; ///< the RL steps' numbers
  std::int64_t steps = 0;                     ///< RL train_step records
  std::int64_t samples = 0;                   ///< samples they trained on
  double step_s = 0;                          ///< their steps' wall time, summed
  double wait_s = 0;                          ///< of it, waiting for evaluated groups
  double update_s = 0;                        ///< of it, the learner's updates
  std::int64_t verdicts = 0;                  ///< verdict records of the RL stage in the segment
  /// Evaluator GPUs of the trainer's process (the `devices` entries with `evaluator` of the
  /// segment's last lifecycle record; evaluator nodes that join are not counted); 0: none known.
  int evaluator_gpus = 0;
  /// The policy's own time on its busiest GPU (generation and updates: the largest `policy_s` of
  /// the same record's devices; on one GPU, that GPU's), where the segment's process ran RL steps
  /// only (a process that also ran SFT counts its SFT updates there too); nullopt otherwise, or on
  /// the CPU. The asynchronous loop's policy works at this pace.
  std::optional<double> policy_s;
  /// The policy's time one part after the other, as the synchronous loop spends it: where an
  /// engine has a GPU without a learner rank (`engine` and not `learner` in the record), the
  /// busiest such GPU's time plus the busiest GPU's with a learner rank and no engine (engines
  /// generate at once, ranks update at once), or the busiest GPU's where that is more (a GPU with
  /// both does its parts one after the other); else as policy_s. With engines both beside a rank
  /// and apart it is a lower bound: a GPU's time is not split into generation and updates.
  std::optional<double> policy_serial_s;
  /// The time evaluations held the process's evaluator GPUs (`evaluation_s` of the same record,
  /// summed over them: references, trials, timed rounds, worker starts); 0: not known. It says
  /// what judging a step's samples costs where the evaluators wait for samples: the verdicts a
  /// minute of such a run say only how fast samples came. Like policy_s, not known (0) where the
  /// process also trained another stage; the check of the tasks' references when a process
  /// begins is counted in it.
  double evaluation_s = 0;
  bool other_stages = false; ///< the process also trained another stage
  /// Policy versions by which the trained samples' sampling policy lagged the learner's
  /// (train_step's staleness_max and staleness_mean, where the records carry them).
  std::int64_t staleness_max = 0;
  double staleness_sum = 0;        ///< staleness_mean summed over the steps that carry it
  std::int64_t staleness_steps = 0; ///< those steps

  double wait_share() const { return step_s > 0 ? wait_s / step_s : 0; }
  /// Verdicts per minute of RL steps, over all evaluators.
  double verdicts_per_min() const { return step_s > 0 ? 60.0 * static_cast<double>(verdicts) / step_s : 0; }
  /// The policy's time a step: policy_s where known, else the learner's updates alone.
  double policy_step_s() const {
    return steps > 0 ? (policy_s && *policy_s > 0 ? *policy_s : update_s) / static_cast<double>(steps) : 0;
  }
  /// The policy's time a step one part after the other (policy_serial_s where known, else
  /// policy_step_s()).
  double policy_serial_step_s() const {
    return steps > 0 && policy_serial_s && *policy_serial_s > 0 ? *policy_serial_s / static_cast<double>(steps)
                                                                : policy_step_s();
  }
  /// Verdicts a minute that would keep the policy from waiting: a step's samples every
  /// policy_step_s(), in verdicts per minute.
  double verdicts_needed_per_min() const {
    const double t = policy_step_s();
    return t > 0 ? 60.0 * static_cast<double>(samples) / static_cast<double>(steps) / t : 0;
  }
  /// GPU-seconds of evaluation a step: evaluation_s over the steps where it is known; else, from
  /// the verdicts a minute per evaluator GPU (which counts their idle time as work); 0 where
  /// neither is.
  double evaluation_gpu_s_per_step() const;
  /// Evaluator GPUs that would judge a step's samples within the policy's time a step
  /// (evaluation_gpu_s_per_step() against policy_step_s()); nullopt where either is unknown.
  std::optional<std::int64_t> evaluator_gpus_needed() const;
  double staleness_mean() const { return staleness_steps > 0 ? staleness_sum / static_cast<double>(staleness_steps) : 0; }
};

/// What a segment's rates say of a split with `gpus` evaluator GPUs, from its evaluation time a step
/// (evaluation_gpu_s_per_step) and its policy's time a step: how long the evaluators take to judge a
/// step's samples; a step's time in the asynchronous loop, where the policy and the evaluators work
/// at once and the slower sets the pace, and in the synchronous loop, where a step's samples are
/// judged after they are generated and trained after they are judged (an upper bound: the first
/// verdicts begin while the last samples are generated); and the staleness bound under which the
/// asynchronous loop drops no group: a sample spans its generation and its evaluation before the
/// update that trains on it, in steps of the asynchronous loop. Plain value.
struct pace_plan {
  std::int64_t gpus = 0;
  double evaluation_s = 0;
  double async_step_s = 0, sync_step_s = 0;
  std::int64_t staleness = 0;
};

/// The plan for `gpus` evaluator GPUs (at least 1); nullopt where the segment has no rate per
/// GPU or no policy time (evaluator_gpus_needed's conditions).
std::optional<pace_plan> plan_for(const pace_segment& s, std::int64_t gpus);

/// The RL segments of a run's metrics.jsonl lines (records that do not parse are skipped: the
/// report reads them strictly elsewhere). Segments without RL steps are left out.
std::vector<pace_segment> pace_segments(const std::vector<std::string>& lines);

/// One segment in a line: "RL steps 301-306: 6 steps, 18.5 s a step, 97% waiting for evaluated
/// groups, 2.1% in updates; 21.0 verdicts/min on 2 evaluator GPUs (10.5 each); the policy
/// (generation and updates, 1.2 s a step) would take 827 verdicts/min: about 79 evaluator GPUs at
/// this rate", then the plan for those GPUs and for the segment's own ("plan: on 79 evaluator
/// GPUs a step takes 1.20 s asynchronous, up to 2.40 s synchronous (2.00x), max_staleness 2 keeps
/// every group; on this run's 2: 18.40 s asynchronous, up to 19.60 s synchronous, 18.50 s measured;
/// trained samples up to 3 versions old (mean 1.40)").
std::string to_string(const pace_segment& s);

} // namespace crucible::storage
