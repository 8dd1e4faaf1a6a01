// actors/coordinator.hpp: the coordinator owns the run's lifecycle. Commands come from `main`
// (train, pause, stop); the run's state goes to status.json, metrics.jsonl and the log.
//
// With a publisher (run.publish), the same records go out live on a ZeroMQ PUB socket, plus a
// periodic heartbeat, for `crucible watch`; publishing never blocks the coordinator.
//
// Lifecycle: start -> running -> (advance through the stage schedule) -> finished, with
// pause/resume in between and stop as the graceful end. Every transition rewrites
// status.json atomically and appends one metrics record {"event":"run_...", "time":...}.
//
// The stage schedule (warm start -> SFT -> self-supervised -> contrastive RL, DESIGN §1.5) is run
// by a trainer (actors/trainer.hpp), one step per request: after each step the coordinator
// records the step's metrics, updates the status, checkpoints every run.checkpoint_every steps,
// and serves status, pause and stop between steps. Pausing waits for the step under way
// (state `pausing`), stops the rollouts (run.on_pause), writes a checkpoint, then reports
// `paused`. Without a trainer the schedule is empty: a started run finishes at once.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>

#include <caf/actor_system.hpp>

#include "actors/interfaces.hpp"
#include "core/clock.hpp"
#include "core/log.hpp"
#include "storage/event_publisher.hpp"
#include "storage/metrics_log.hpp"

namespace crucible {

/// What the coordinator needs from outside. The metrics log is moved in and owned by the
/// actor; the logger and clock are borrowed and must outlive it (both are thread-safe).
struct coordinator_deps {
  std::filesystem::path status_file; ///< runs/NAME/status.json; its directory must exist
  storage::metrics_log metrics;      ///< runs/NAME/metrics.jsonl, opened by the caller
  logger& log;                       ///< borrowed; events.log and stderr
  const clock& clk;                  ///< borrowed; stamps metrics records
  /// Owned; when set, every metrics record is also published (topic = its `event`), a
  /// `heartbeat` record with the status goes out every `heartbeat` while the run is running or
  /// paused, and status.json carries the bound endpoint as `publish`.
  std::unique_ptr<storage::event_publisher> publisher = nullptr;
  std::chrono::milliseconds heartbeat{1000};
  /// Runs the stage schedule; null: the schedule is empty.
  trainer_actor trainer;
  /// The status to start from (a resumed run: the checkpoint's step, version and counters). Its
  /// state is ignored.
  run_status initial;
  bool resumed = false;                 ///< start records `run_resumed` instead of `run_started`
  std::uint64_t checkpoint_every = 0;   ///< steps between checkpoints; 0: only at pause and at the end
  std::uint64_t pause_after = 0;        ///< pause once this many steps are done (0: never)
  /// A pause that has waited this long for the step under way asks the trainer to end it
  /// without training if it only waits for groups (run.pause_grace_s); 0: the pause waits.
  std::chrono::milliseconds pause_grace{60000};
  /// The process running the run, written to status.json as `pid` (`crucible pause` signals it);
  /// 0: not written.
  std::int64_t pid = 0;
  /// Where evaluator nodes join this run ("HOST:PORT", what `crucible evaluator --join` takes),
  /// written to status.json as `join` while the run is running or pausing, and left out once it
  /// is paused, finished or crashed; "": the run takes no nodes.
  std::string join;
};

/// Spawns the coordinator of one run (one per actor system). Nothing is written until it
/// receives start.
coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_deps deps);

} // namespace crucible
