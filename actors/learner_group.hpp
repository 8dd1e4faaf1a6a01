// actors/learner_group.hpp: the data-parallel learner ranks of one run behind one learner handle.
// Requests come from the trainer (or the exemplar actor's groups); each goes on to every rank (or,
// for a lone group, to one), and one reply, rank 0's, goes back once every rank has answered.
#pragma once

#include <vector>

#include <caf/actor_system.hpp>

#include "actors/interfaces.hpp"
#include "core/error.hpp"

namespace crucible {

/// Spawns an actor with the learner_actor interface in front of `ranks` (rank 0 first; every rank
/// a learner actor of the same data-parallel group, actors/learner.hpp), so that the trainer drives
/// W ranks as it drives one learner:
/// - train_atom, learner_batch, sft_batch, reset_atom and save_atom go to every rank, in the order
///   they arrive (each rank takes its own share, and save is collective); the reply is rank 0's,
///   sent once every rank has replied. If any rank fails, the reply is the first failure to
///   arrive, its code kept and its message naming the rank ("learner rank 1 of 2: ...");
/// - a rollout_group goes to one rank, dealt in turn (rank 0, 1, ..., W-1, 0, ...), as the exemplar
///   actor deals groups to the ranks: each rank then trains on its queue at the next train_atom.
/// No request is served by rank 0 alone: every one is either collective or a share of the data.
/// The actor holds the ranks' handles but does not own their lifetime (the caller tells them to
/// quit). errc::invalid_arg without ranks or with an invalid handle.
result<learner_actor> spawn_learner_group(caf::actor_system& sys, std::vector<learner_actor> ranks);

} // namespace crucible
