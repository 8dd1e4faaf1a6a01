// tests/actors/deterministic.hpp: actor tests run on CAF's deterministic scheduler.
#pragma once

#include "actors/actor_config.hpp"

namespace crucible::testing {

/// Sets `cfg` up for CAF's test coordinator (`sched.run()`, `sched.advance_time()`), with CAF's
/// own log file off; returns `cfg`.
inline actor_config& deterministic(actor_config& cfg) {
  cfg.set("scheduler.policy", caf::atom("testing"));
  cfg.set("logger.file-verbosity", caf::atom("quiet"));
  return cfg;
}

} // namespace crucible::testing
