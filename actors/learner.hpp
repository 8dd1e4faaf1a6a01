// actors/learner.hpp: one data-parallel learner rank as an actor (DESIGN §1.4, §5). The actor
// runs detached (an update blocks for seconds and its collectives block until every rank
// joins), owns a policy::learner and the rank's communicator, turns complete GRPO groups into
// updates, replies with the step's metrics, and after each update rank 0 publishes the new
// weights to the engines. Link crucible::learner_actor.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "actors/interfaces.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

// Declared only: this header stays free of torch (actors/ does not compile it); the actor's own
// source, in the crucible::learner_actor library, does.
namespace crucible::policy {
class learner;
class inproc_group;
} // namespace crucible::policy

namespace crucible {

/// Which communicator a learner rank joins, and what it does around its updates. Value type;
/// check with validate().
struct learner_actor_spec {
  /// "inproc" (ranks are threads of this process; `group` is the shared group) or "nccl" (one
  /// rank per GPU, possibly on several nodes, joined through `nccl_id_hex`).
  std::string backend = "inproc";
  int rank = 0;
  int world_size = 1;
  int device = 0;               ///< nccl: the CUDA device ordinal of this rank
  std::string nccl_id_hex;      ///< nccl: policy::nccl_id::to_hex() of the id the coordinator made
  double timeout_s = 600;       ///< nccl: creation and collective timeout (> 0)
  /// inproc with world_size > 1: the group every rank joins (its own timeout applies);
  /// world_size 1 needs none (the learner then trains alone).
  std::shared_ptr<policy::inproc_group> group;
  /// Rank 0: each update's weights are written to publish_dir/v<version> (an HF directory) and
  /// sent to every engine as weight_update; empty: nothing is published.
  std::filesystem::path publish_dir;
  /// A model directory whose tokenizer files go beside the weights of every published version
  /// and checkpoint (policy::save_options::tokenizer_from); empty: none.
  std::filesystem::path tokenizer_dir;
  /// Published directories kept (older ones are removed once a newer one is written); 0: all.
  std::uint64_t keep_published = 2;
  /// train_atom: groups sampled more than this many versions before the learner's are dropped
  /// (and counted); 0: none is dropped.
  std::uint64_t max_staleness = 0;
  double temperature = 1.0;     ///< train_atom: the sampling temperature of the queued groups
  /// This rank's device ("cuda:N"): where an evaluator of this process times verdicts on it too,
  /// each update holds the device as host work (env::device_gate), so that no measured round
  /// overlaps it. Empty or "cpu": none.
  std::string device_name;

  /// errc::config naming the bad field ("learner_actor.backend", ".rank", ".world_size",
  /// ".nccl_id_hex", ".timeout_s", ".group", ".temperature").
  result<void> validate() const;
};

/// What a learner actor owns.
struct learner_actor_deps {
  /// The learner; from now on used only by the actor's thread. Every rank's learner has the same
  /// options and model shape (rank 0's weights are broadcast when the group forms). A learner that
  /// already joined its data-parallel group (policy::learner::join_data_parallel, as
  /// spawn_run_roles does to restore a checkpoint on every rank before the engine is built) is
  /// used with its communicator as it is; its rank and size must be the spec's.
  std::shared_ptr<policy::learner> learner;
  /// Rank 0's subscribers: engines that get each new version as a weight_update.
  std::vector<engine_actor> engines;
  /// Rank 0, with engines in this process (policy::weight_handoff): stages the new version in
  /// memory after an update, after which every engine gets weights_published instead of a
  /// weight_update, and nothing is written to publish_dir. Empty: the published directory.
  std::function<result<void>(std::uint64_t version)> stage_weights;
  /// Where a checkpoint's save shows its progress (a terminal's progress line); null: nowhere.
  logger* log = nullptr;
};

/// Spawns rank spec.rank's learner actor on a thread of its own (caf::detached).
///
/// The communicator is made, and the learner joins the data-parallel group
/// (policy::learner::join_data_parallel), on the actor's thread when its first request comes:
/// every rank's first request forms the group. A rank whose peers do not join fails that request
/// with errc::timeout after the communicator's timeout, and fails every later one with the same
/// error. Updates: rank r of W trains on groups r, r + W, ... of a learner_batch (examples of an
/// sft_batch alike) or on the groups queued since its last train_atom; a share without groups is
/// refused, which fails every rank's update at once (so a global batch needs at least W groups).
/// Refused batches and collective failures come back as errors carrying the learner's message.
/// After an update that changed the weights, rank 0 publishes them (see publish_dir) before it
/// replies; a failed publication is an errc::io reply (the update itself stands).
///
/// errc::config from validate(); errc::invalid_arg without a learner or with an invalid engine
/// handle.
result<learner_actor> spawn_learner_actor(caf::actor_system& sys, learner_actor_deps deps, learner_actor_spec spec);

} // namespace crucible
