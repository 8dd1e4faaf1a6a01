// actors/run_roles.hpp: every role of a run in one process, made from the configuration
// (`crucible train` and `crucible resume`): the policy (an existing model directory, or a fresh
// one with a tokenizer trained on the task sources), the task catalogue and seed variants, one
// evaluator per `evaluator.devices` entry behind a pool, the engine, the learner (restored from
// the run's latest checkpoint on resume) and the trainer that runs the stage schedule. Link
// crucible::run (it compiles torch).
#pragma once

#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/evaluator.hpp"
#include "actors/interfaces.hpp"
#include "actors/trainer.hpp"
#include "core/clock.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "policy/runtime.hpp"

namespace crucible {

/// The spawned roles of a run.
struct run_roles {
  trainer_actor trainer;
  evaluator_pool_actor pool;                  ///< every evaluator; nodes that join add theirs
  std::shared_ptr<const task_catalog> catalog; ///< the run's tasks
  std::vector<caf::actor> actors;      ///< every role, for shutdown
  run_status initial;                  ///< the status to start from (resume: the checkpoint's)
  std::filesystem::path checkpoint;    ///< the checkpoint resumed from ("" for a fresh run)
  std::size_t tasks = 0;               ///< tasks in the catalogue
  std::size_t seeds = 0;               ///< seed variants found
};

/// Where a fresh model lives in a run directory, and where the policy's model comes from.
std::filesystem::path model_dir_of(const config& cfg, const std::filesystem::path& run_dir);

/// Makes the fresh model (`model.dir` empty) in RUN/model when it is not there yet: a byte-level
/// BPE tokenizer of model.tokenizer_vocab trained on model.tokenizer_corpus (default: the task
/// suite and its seeds), then random weights of preset model.init. Logs what it did.
result<void> prepare_model(const config& cfg, const std::filesystem::path& run_dir, logger& log);

/// The task catalogue of `tasks:` (names relative to the suite, without .py), filtered by
/// tasks.include (an unknown name is errc::config naming it).
result<std::shared_ptr<const task_catalog>> load_task_catalog(const config& cfg);

/// Checks what a new run reads before its run directory is made, so that a wrong path leaves
/// nothing behind: the task suite (as load_task_catalog) and its seed variants, and with
/// `model.dir` set, that the directory holds a config.json crucible supports, a tokenizer it
/// loads and safetensors weights that open (the weights' shapes are checked when the learner
/// loads them). Errors are errc::config naming the key and the file at fault.
result<void> check_run_inputs(const config& cfg);

/// learner.memory_check: on CUDA, errc::config when the memory plan of `cfg`
/// (policy::plan_memory, as `crucible memory-plan --config`) exceeds the memory of the smallest
/// learner GPU among `devices` (probe_runtime's), naming both figures, the device and what would
/// make it fit. Nothing to check (ok) on the CPU, with the check off, or when the plan cannot be
/// made (loading names that problem).
result<void> check_memory_plan(const config& cfg, std::span<const policy::cuda_device> devices);

/// Spawns the roles. `resume`: the learner, the trainer's position, the rollout places' task
/// samplers and the status come from RUN/checkpoints/latest (errc::not_found when the run has
/// none; load_sampler_states' errors when the task pool no longer fits the saved samplers).
/// Errors name the key, file or device at fault; roles already spawned are told to exit.
result<run_roles> spawn_run_roles(caf::actor_system& sys, const config& cfg, const std::filesystem::path& run_dir,
                                  bool resume, const clock& clk, logger& log);

} // namespace crucible
