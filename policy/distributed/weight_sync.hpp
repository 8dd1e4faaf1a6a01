// policy/distributed/weight_sync.hpp: new weights from the learner to the engines. After an update
// the learner's rank (the root of a sync communicator) broadcasts its tensors (all weights, or only
// the LoRA adapters) in buckets, stamped with the new policy version; each engine rank receives
// them into its own model in place. An engine on the learner's own device shares the learner's
// tensors instead and needs no copy.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/error.hpp"
#include "policy/distributed/collective.hpp"
#include "policy/model/model.hpp"
#include "policy/training/optimizer.hpp"

namespace crucible::policy {

/// The tensors a sync carries, in the model's order: every parameter, or with `adapters_only`
/// the parameters that train (the LoRA adapters after add_lora). Shares the model's tensors.
std::vector<named_parameter> sync_tensors(CausalLMImpl& model, bool adapters_only);

/// How weights travel. Plain value.
struct weight_sync_options {
  std::int64_t bucket_bytes = 256ll << 20; ///< bytes per broadcast (learner.sync_bucket_mb); larger tensors go alone
  int root = 0;                            ///< the learner's rank in the sync communicator
};

/// What one sync moved. Plain value.
struct weight_sync_stats {
  std::uint64_t version = 0; ///< the version stamped by the root
  std::int64_t bytes = 0;    ///< tensor bytes moved (per receiver)
  std::int64_t buckets = 0;  ///< broadcasts of tensor data
  double seconds = 0.0;      ///< wall time of the sync on this rank, the device synchronised
};

/// One rank of a weight sync group: the learner (root) or an engine. Each sync broadcasts a
/// header (version, bucket size), the root's manifest (names, dtypes, shapes) and then the
/// tensors; every engine checks the manifest against its own tensors before any weight moves, and
/// all ranks agree (one reduction) to go on or to fail: a mismatch fails on every rank, the
/// engine's error naming the first tensor that differs. Collective timeouts are the
/// communicator's. Owned by one thread; non-copyable.
class weight_sync final {
public:
  /// `tensors` are sent (root) or overwritten in place (engines); contiguous, on comm's device.
  static result<std::unique_ptr<weight_sync>> create(std::shared_ptr<communicator> comm,
                                                     std::vector<named_parameter> tensors,
                                                     const weight_sync_options& options);
  weight_sync(const weight_sync&) = delete;
  weight_sync& operator=(const weight_sync&) = delete;

  /// Root only: broadcasts the tensors stamped with `version`. Collective.
  result<weight_sync_stats> send(std::uint64_t version);
  /// Engines only: receives the tensors into this rank's; stats.version is the root's stamp.
  /// Collective.
  result<weight_sync_stats> receive();

  bool is_root() const noexcept { return comm_->rank() == options_.root; }

private:
  weight_sync(std::shared_ptr<communicator> comm, std::vector<named_parameter> tensors,
              const weight_sync_options& options);
  result<weight_sync_stats> run(std::uint64_t version);

  std::shared_ptr<communicator> comm_;
  std::vector<named_parameter> tensors_;
  weight_sync_options options_;
  std::string manifest_;
};

/// Makes every parameter of `engine_model` share the storage of the tensor of the same name in
/// `source` (a learner's model on the same device): the engine then reads each update the moment
/// the optimiser writes it, with no copy and no broadcast. Every engine parameter must have a
/// source of the same shape, dtype and device (errc::invalid_arg naming the first that does not).
/// An engine that captured CUDA graphs over its old tensors must release_graphs() afterwards.
/// The caller keeps updates and generation apart (the learner steps while the engine waits).
result<void> share_weights(std::span<const named_parameter> source, CausalLMImpl& engine_model);

} // namespace crucible::policy
