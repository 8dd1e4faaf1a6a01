// actors/evaluator.hpp: candidates in, verdicts out. An evaluator owns one device's
// env::device_evaluator and runs `concurrency` evaluations at once on detached runners; the
// pool in front of all evaluators balances by queue length, pushes back when full and has a
// large speedup re-measured on a second device of the same kind.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <caf/actor_system.hpp>

#include "actors/interfaces.hpp"
#include "core/device.hpp"
#include "core/config.hpp"
#include "env/eval/evaluator.hpp"
#include "env/eval/recheck.hpp"
#include "env/task.hpp"
#include "env/verdict.hpp"

namespace crucible {

/// The tasks of a run by id; shared read-only by every evaluator.
using task_catalog = std::map<task_id, env::task>;

/// What an evaluator actor needs. The device evaluator and the catalogue are shared with its
/// runners (both are thread-safe for this use).
struct evaluator_deps {
  std::shared_ptr<env::device_evaluator> device;
  std::shared_ptr<const task_catalog> tasks;
  device_info info;             ///< reported to the pool: index, name, hardware kind
  std::int64_t concurrency = 1; ///< detached runners, i.e. evaluations in flight
};

/// Spawns an evaluator for one device with its runners. Candidates beyond `concurrency` wait
/// in its mailbox-side queue in arrival order. A candidate with `recheck` set is evaluated
/// without reading the verdict cache.
evaluator_actor spawn_evaluator(caf::actor_system& sys, evaluator_deps deps);

/// What the pool learns about the device behind `dev` (index `index`, e.g. N of cuda:N): its
/// model name as the workers report it and its hardware kind (core/device.hpp's hardware_kind_of,
/// so two GPUs of one model share a kind whether they are the run's own or a joined node's).
device_info device_info_of(const env::device_evaluator& dev, std::uint32_t index);

/// Pool settings.
struct evaluator_pool_options {
  std::int64_t slots_per_evaluator = 2; ///< candidates sent ahead to one evaluator
  std::int64_t max_pending = 64;        ///< waiting in the pool beyond that; more is errc::busy
  /// When an ok speedup is re-measured on a second device of the same kind, how far the two
  /// may differ, and the reward of a rejected one (evaluator.recheck_*, reward:).
  env::recheck_options recheck;

  /// The defaults, with `recheck` taken from the config's `evaluator:` and `reward:` sections.
  static evaluator_pool_options from(const config& cfg) noexcept {
    evaluator_pool_options out;
    out.recheck = env::recheck_options::from(cfg.evaluator, cfg.reward);
    return out;
  }
};

/// Spawns the pool over `evaluators` (it asks each for its device_info and monitors it). More
/// join later with (add_atom, handles), local or on other nodes (actors/membership.hpp), and
/// leave with (delete_atom, handles) or by going down; either way their candidates in flight
/// are sent to another evaluator. While the pool holds no evaluator at all (none yet, or the
/// last one left), candidates wait for one, up to `max_pending` (then errc::busy); once it
/// holds some, a candidate for a hardware kind none of them has is errc::not_found.
///
/// An ok verdict with a speedup above `opt.recheck.above` is measured again on another ready
/// evaluator whose device reports the same hardware kind, when there is one, bypassing the
/// verdict cache; the client gets one verdict, env::reconcile_recheck of the two. If that
/// evaluator dies (or fails) during the recheck, the first verdict stands with a message
/// saying so. With no second device of the kind, the first verdict is delivered as it is
/// (env::device_evaluator has already re-measured it on its own device).
evaluator_pool_actor spawn_evaluator_pool(caf::actor_system& sys, std::vector<evaluator_actor> evaluators,
                                          evaluator_pool_options opt);

} // namespace crucible
