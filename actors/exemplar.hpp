// actors/exemplar.hpp: scored variants come in from rollouts and go into the run's replay store;
// exemplars for contrastive prompts go back out to rollouts, and complete GRPO groups go on to
// the learners (DESIGN §1.1, §1.4).
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include <caf/actor_system.hpp>

#include "actors/interfaces.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "storage/exemplar_select.hpp"

namespace crucible {

/// Settings of the exemplar actor. Value type; check with validate(). The `exemplar:` config
/// section converts into it (the keys in validate()'s messages name that section).
struct exemplar_actor_options {
  std::filesystem::path store;         ///< the run's replay.db; created when missing
  /// How exemplars are drawn; `selection.n` is also the count of a request that asks for 0.
  storage::exemplar_options selection;
  double straggler_timeout_s = 600;    ///< from a group's announce until drop or fill (> 0)
  straggler_policy on_straggler = straggler_policy::fill;
  double fill_reward = 0.0;            ///< reward of a filled verdict (finite)
  std::uint64_t max_open_groups = 256; ///< announces beyond it get errc::busy (≥ 1)
  std::uint64_t seed = 0;              ///< seeds the actor's own exemplar RNG
  bool seeds_only = false;             ///< draw exemplars among the seed variants (group 0) only
  /// On its own thread (the store fsyncs every record, which would stall a scheduler
  /// thread). Tests on the deterministic scheduler set this to false.
  bool detached = true;

  /// The `exemplar:` section of `cfg` for the store at `store`: its selection and straggler
  /// settings, `reward.failed` as the fill reward, `run.seed` as the seed.
  static exemplar_actor_options from(const config& cfg, std::filesystem::path store);

  /// errc::config naming the first bad key ("exemplar.store", "exemplar.straggler_timeout_s",
  /// "exemplar.fill_reward", "exemplar.max_open_groups", or the selection's keys).
  result<void> validate() const;
};

/// Opens the replay store at `opt.store` and spawns the exemplar actor, which owns it from
/// then on. Complete groups go to `learners` in turn (round robin), one group each.
///
/// Every scored variant is recorded with code_hash = sha256(env::normalize_source(code)),
/// except a second verdict for a member of an open group (a duplicate, counted and ignored).
/// A verdict whose group is not open (never announced, refused, or already sent or dropped)
/// is still recorded (it is a real measurement) and counted as unknown; it joins no group.
///
/// errc::config from validate(), errc::invalid_arg without a valid learner handle, errc::io
/// when the store cannot be opened.
result<exemplar_actor> spawn_exemplar_actor(caf::actor_system& sys, exemplar_actor_options opt,
                                            std::vector<group_sink_actor> learners);

} // namespace crucible
