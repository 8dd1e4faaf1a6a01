// actors/evaluator.hpp: candidates in, verdicts out. An evaluator owns one device's
// env::device_evaluator and runs `concurrency` evaluations at once on detached runners; the
// pool in front of all evaluators balances by queue length and pushes back when full.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <caf/actor_system.hpp>

#include "actors/interfaces.hpp"
#include "env/evaluator.hpp"
#include "env/task.hpp"
#include "env/verdict.hpp"

namespace crucible {

/// The tasks of a run by id; shared read-only by every evaluator.
using task_catalog = std::map<task_id, env::task>;

/// The verdict message for an env::verdict (the same fields; NaN speedup → has_speedup false).
verdict to_message(const env::verdict& v);

/// What an evaluator actor needs. The device evaluator and the catalogue are shared with its
/// runners (both are thread-safe for this use).
struct evaluator_deps {
  std::shared_ptr<env::device_evaluator> device;
  std::shared_ptr<const task_catalog> tasks;
  device_info info;             ///< reported to the pool: index, name, hardware kind
  std::int64_t concurrency = 1; ///< detached runners, i.e. evaluations in flight
};

/// Spawns an evaluator for one device with its runners. Candidates beyond `concurrency` wait
/// in its mailbox-side queue in arrival order.
evaluator_actor spawn_evaluator(caf::actor_system& sys, evaluator_deps deps);

/// Pool settings.
struct evaluator_pool_options {
  std::int64_t slots_per_evaluator = 2; ///< candidates sent ahead to one evaluator
  std::int64_t max_pending = 64;        ///< waiting in the pool beyond that; more is errc::busy
};

/// Spawns the pool over `evaluators` (it asks each for its device_info and monitors it).
evaluator_pool_actor spawn_evaluator_pool(caf::actor_system& sys, std::vector<evaluator_actor> evaluators,
                                          evaluator_pool_options opt);

} // namespace crucible
