// actors/engine.hpp: generation requests from rollout actors in, completions with behaviour
// log-probs and the policy version out (DESIGN §1.2). A scheduled front actor keeps a bounded
// queue and batches waiting requests; a runner on its own thread owns the policy::engine and
// the tokenizer and makes the blocking engine calls; new weights are installed between calls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include <caf/actor_system.hpp>

#include "actors/interfaces.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "policy/model/engine.hpp"
#include "text/tokenizer.hpp"

namespace crucible {

/// Settings of an engine actor. Value type; check with validate(). The `engine:` config
/// section converts into it.
struct engine_actor_options {
  std::uint64_t max_queued = 64;        ///< requests waiting; more are errc::busy (≥ 1)
  std::uint64_t max_batch_prompts = 8;  ///< requests per engine call (≥ 1)
  /// Completions (sum of the requests' G) per engine call (≥ 1); a larger request runs alone.
  std::uint64_t max_batch_samples = 64;
  std::uint64_t max_prompt_tokens = 0;  ///< longer prompts are errc::invalid_arg; 0: no limit
  /// Weight-update messages waiting; more are errc::busy (≥ 1). A learner sends one per step.
  std::uint64_t max_queued_updates = 4;
  /// Device and dtype of models loaded by weight_update (the served model's device, usually).
  policy::engine_options load;
  /// The runner on its own thread (an engine call blocks for seconds). Tests on the
  /// deterministic scheduler set this to false.
  bool detached = true;

  /// The `engine:` section of `cfg`.
  static engine_actor_options from(const config& cfg);

  /// errc::config naming the first bad key ("engine.max_queued", "engine.max_batch_prompts",
  /// "engine.max_batch_samples", "engine.max_queued_updates").
  result<void> validate() const;
};

/// Receives announced weights into the engine's model in place (policy/distributed/weight_sync
/// provides one: an NCCL broadcast from the learners). Called on the runner's thread between engine
/// calls, so nothing else uses the engine meanwhile. On success the engine serves the announced
/// version, or a newer one the receiver set on the engine (policy::weight_handoff installs the
/// newest version staged); on error it keeps the version it had.
using weight_receiver = std::function<result<void>(policy::engine&, const weights_published&)>;

/// What an engine actor owns.
struct engine_deps {
  /// The engine; from now on used only by the actor's runner (one caller at a time).
  std::shared_ptr<policy::engine> engine;
  /// The model's tokenizer: encodes text prompts, decodes completions and stop strings, and
  /// names the eos token. Shared read-only (thread-safe).
  std::shared_ptr<const policy::tokenizer> tokenizer;
  /// For weights_published; empty: that message is errc::unsupported.
  weight_receiver receive_weights;
};

/// Spawns an engine actor over `deps.engine`.
///
/// Requests wait in arrival order. Whenever the engine is free, pending weight updates are
/// installed first (every waiting request then samples with the newest weights), then the
/// oldest request is sampled together with the later waiting ones whose sampling settings equal
/// its own except for the seed, up to max_batch_prompts requests and max_batch_samples
/// completions; the call uses the first request's seed. Completions stop at the tokenizer's and
/// the model's eos tokens (cut from the text) and at the request's stop strings (cut too).
///
/// weight_update loads the directory as a fresh engine on `opt.load`'s device and replaces the
/// served one (the old engine, KV cache included, is freed after: peak memory holds two copies
/// of the weights). The version must not go down, and the vocabulary must stay the same.
///
/// errc::config from validate(); errc::invalid_arg without an engine or tokenizer, or when the
/// tokenizer's vocabulary exceeds the model's.
result<engine_actor> spawn_engine_actor(caf::actor_system& sys, engine_deps deps, engine_actor_options opt);

} // namespace crucible
