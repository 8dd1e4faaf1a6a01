// policy/distributed/weight_handoff.hpp: a learner's new weights to an engine of the same process
// through memory, instead of a directory written and read back per version (at 7B a published
// version is 15 GB of files). The engine's model is built from the learner's: on the same device,
// tensors that never change are shared, not copied (under LoRA the frozen base: embeddings, norms
// and every projection without an adapter); the rest are the engine's own, refreshed in place after
// each update (so the engine's CUDA graphs stay valid). On another device (one of engine.devices) every
// tensor is the engine's own; a version is staged across, onto the engine's device (the learner's
// thread copies it after its update), and installed there.
//
// Two threads use it: the learner's stages a version right after its update (a device copy of
// what changed into a staging area), the engine's installs the staged version between its calls
// (a device copy into its model). Each holds the handoff's mutex only for its copies, so neither
// waits for the other's work: the learner never waits for a generation, the engine never for an
// update. No torch types here (the actors include it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/error.hpp"

namespace crucible::policy {

class CausalLMImpl;

/// Where the engine's tensors come from. Plain value.
struct handoff_stats {
  std::int64_t shared_bytes = 0;  ///< the engine's tensors that are the learner's (no copy)
  std::int64_t own_bytes = 0;     ///< the engine's own tensors
  std::int64_t staged_bytes = 0;  ///< copied per version, twice (learner to staging, staging to engine)
  std::int64_t tensors_shared = 0, tensors_own = 0, tensors_staged = 0;
};

/// One learner model feeding one engine model. Thread-safe as described above; the learner's
/// model must outlive it.
class weight_handoff final {
public:
  /// Builds the engine's model from `learner_model` (its parameters on their device) in
  /// `engine_dtype` ("bfloat16", "float16", "float32") on `engine_device` ("cpu", "cuda:N"; empty:
  /// the learner's device), serving `version`.
  /// On the learner's device a tensor is shared when it cannot change (it does not train) and has
  /// the engine's dtype, and the projections it is joined with (q/k/v, gate/up: one GEMM in
  /// decoding) are shared too; on another device none is. The staging area is on the engine's
  /// device (a stage copies across; an install is a copy on the engine's device alone).
  /// A projection with a LoRA adapter is the engine's own and holds the merged weight
  /// (W + scale · B A), as a published directory would. errc::config for an unknown dtype or a
  /// device that is not one.
  static result<std::unique_ptr<weight_handoff>> create(CausalLMImpl& learner_model, const std::string& engine_dtype,
                                                        std::uint64_t version, const std::string& engine_device = {});
  ~weight_handoff();
  weight_handoff(const weight_handoff&) = delete;
  weight_handoff& operator=(const weight_handoff&) = delete;

  /// The engine's model (give it to policy::engine's model constructor).
  std::shared_ptr<CausalLMImpl> engine_model() const;

  /// The learner's thread, after the update that made `version`: copies the trainable tensors
  /// (merged, for adapters) into the staging area. Returns when the copies are complete on the
  /// device. errc::invalid_arg when `version` is older than the version staged.
  result<void> stage(std::uint64_t version);
  /// The engine's thread, between its calls: copies the staged tensors into the engine's model
  /// and returns the version they are (the newest staged: it may be newer than the announcement
  /// that prompted the call). Nothing is copied when that version is installed already.
  result<std::uint64_t> install();

  std::uint64_t staged_version() const;
  std::uint64_t installed_version() const;
  const handoff_stats& stats() const noexcept;

private:
  struct state;
  explicit weight_handoff(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

} // namespace crucible::policy
