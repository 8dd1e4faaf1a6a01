// policy/training/learner.hpp: one learner's update. Scored GRPO groups (or SFT examples) come in
// as token ids; padded micro-batches go through the model's forward and backward; the accumulated
// gradient is optionally handed to a hook (the data-parallel all-reduce), clipped and applied by
// AdamW; the policy version advances and the step's metrics go out.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/error.hpp"
#include "core/learner_options.hpp"
#include "policy/distributed/data_parallel.hpp"
#include "policy/training/loss.hpp"
#include "policy/model/model.hpp"
#include "policy/training/optimizer.hpp"

namespace crucible::policy {

/// One sampled completion of a group, as the engine produced it and the evaluator scored it.
struct grpo_sample {
  std::vector<std::int32_t> completion;    ///< generated tokens (the stopping token included)
  std::vector<float> behaviour_log_probs;  ///< per completion token (engine's completion::logprobs)
  double reward = 0.0;
  /// Set: the sample's advantage as given, in place of its group's relative one (a turn of a
  /// multi-turn episode, whose advantage compares the turn across the episodes of its group:
  /// policy/training/episode_batch.hpp); learner.negative_weight still scales it when below 0.
  /// NaN: the group's.
  double advantage = std::numeric_limits<double>::quiet_NaN();
};

/// G completions of one prompt.
struct grpo_group {
  std::vector<std::int32_t> prompt;  ///< at least one token
  std::vector<grpo_sample> samples;
  std::uint64_t policy_version = 0;  ///< the version that sampled them
};

/// The groups of one update.
struct grpo_batch {
  std::vector<grpo_group> groups;
  double temperature = 1.0;          ///< the sampling temperature: log-probs are taken at it
};

/// One supervised example: the loss covers the completion only.
struct sft_example {
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> completion;
};

/// What one update did. Means are over completion tokens unless said otherwise.
struct step_metrics {
  double loss = 0.0;            ///< the batch loss (sum of its micro-batches' shares)
  double grad_norm = 0.0;       ///< global L2 norm before clipping
  double lr = 0.0;              ///< learning rate of this update
  double seconds = 0.0;         ///< wall time of the whole step
  std::int64_t tokens = 0;      ///< completion tokens trained on
  std::int64_t sequences = 0;
  std::int64_t zero_advantage = 0; ///< sequences of the batch whose advantage was 0 (GRPO without a KL
                                   ///< term): their gradient is 0, so they were not forwarded
  std::int64_t micro_batches = 0;
  // The token statistics below (clip_fraction to nll) are over the tokens forwarded: under GRPO
  // without a KL term, not those of zero_advantage's sequences (0 when every row was one).
  double clip_fraction = 0.0;   ///< tokens whose clipped branch was taken (GRPO)
  double kl = 0.0;              ///< mean KL estimate to the reference (GRPO with a reference)
  double ratio_mean = 0.0;      ///< mean pi_theta / pi_old (GRPO)
  double is_weight_mean = 0.0;  ///< mean stale-sample weight (GRPO)
  double nll = 0.0;             ///< mean -log pi_theta of the completion tokens
  double reward_mean = 0.0;     ///< mean raw reward (GRPO)
  bool recomputed_old = false;  ///< old log-probs came from a forward (else: behaviour's)
  bool skipped = false;         ///< the gradient was not finite: no update, version unchanged
  std::uint64_t version = 0;    ///< the policy version after the step
};

/// Splits sequences of `lengths` tokens into micro-batches whose padded size (rows x longest
/// row) stays within `budget`, longest first so that rows of a micro-batch have similar lengths.
/// A sequence longer than the budget gets a micro-batch of its own. Returns indices into
/// `lengths`; every index appears exactly once.
std::vector<std::vector<std::size_t>> plan_micro_batches(std::span<const std::int64_t> lengths, std::int64_t budget);

/// Called once per update after every micro-batch's backward and before clipping, with the
/// float32 gradients in parameters() order; it may rewrite them in place (the data-parallel
/// all-reduce goes here). An error aborts the update (gradients dropped, version unchanged).
/// Alone, the gradients are those of this learner's batch loss, normalised by its own batch totals
/// (loss.hpp's batch_totals). In a data-parallel group (join_data_parallel) the totals are summed
/// over the ranks before the backward passes, so each rank's gradient is its share of the global
/// batch's, and the hook sees their sum: the global batch's gradient, the same on every rank.
/// With learner.zero1 no rank holds the whole reduced gradient and a hook is refused.
using gradient_hook = std::function<result<void>(std::span<const named_parameter>, std::span<torch::Tensor>)>;

/// A GRPO/SFT learner over one model on one device. Owns the model it trains (shared handle),
/// an optional frozen reference model and the optimiser. Not thread-safe: one thread (the
/// learner actor's) drives it. Non-copyable.
class learner final {
public:
  /// Casts `policy` to options.dtype, adds LoRA adapters when options.lora (A drawn from `seed`)
  /// and builds the optimiser over the trainable parameters. `reference` (may be null) is needed
  /// when options.kl_coef > 0; it is frozen and used as given. `version` is the version of the
  /// weights `policy` holds. errc::config naming the learner key at fault.
  static result<std::unique_ptr<learner>> create(CausalLM policy, CausalLM reference, const learner_options& options,
                                                 std::uint64_t seed = 0, std::uint64_t version = 0);

  learner(const learner&) = delete;
  learner& operator=(const learner&) = delete;

  /// One GRPO update on `batch`. errc::invalid_arg naming the group and sample at fault (empty
  /// prompt, behaviour log-probs of the wrong length, no samples).
  result<step_metrics> grpo_step(const grpo_batch& batch);
  /// One SFT update: mean negative log-likelihood of the completions.
  result<step_metrics> sft_step(std::span<const sft_example> examples);

  /// Installs (or with an empty function removes) the gradient hook.
  void set_gradient_hook(gradient_hook hook) { hook_ = std::move(hook); }

  /// Makes this learner one rank of a data-parallel group over `comm` (every rank calls it, with
  /// the same options and model): from then on each update's batch is this rank's share of a
  /// global batch. Batch totals, reward statistics and metrics are reduced over the ranks, the
  /// gradients in buckets of learner.bucket_mb overlapped with the last micro-batch's backward
  /// (learner.overlap), and every rank applies the same update (or, with learner.zero1, updates
  /// its shard of the optimiser state and all-gathers the parameters). Rank 0's parameters are
  /// broadcast first. A rank whose batch is refused makes every rank's update fail; a rank that
  /// does not take part makes the others fail after learner.collective_timeout_s. Collective.
  result<void> join_data_parallel(std::shared_ptr<communicator> comm);
  /// The data-parallel state (null when alone).
  data_parallel* data_parallel_state() noexcept { return dp_.get(); }

  /// The trainable parameters, in the stable order of the optimiser.
  const std::vector<named_parameter>& parameters() const noexcept { return optimizer_->parameters(); }
  CausalLMImpl& model() { return *policy_; }
  adamw& optimizer() { return *optimizer_; }
  const learner_options& options() const noexcept { return options_; }
  /// The version of the weights the model holds; +1 per applied update.
  std::uint64_t version() const noexcept { return version_; }
  /// Updates applied (the schedule's position).
  std::int64_t steps() const noexcept { return optimizer_->steps(); }
  /// SHA-256 over the names and bytes of the frozen parameters (LoRA's base weights), "" when
  /// everything trains: a checkpoint of adapters records which base they belong to.
  const std::string& frozen_digest() const noexcept { return frozen_digest_; }
  /// Sets the version after a checkpoint restore.
  void set_version(std::uint64_t v) noexcept { version_ = v; }
  /// Starts AdamW's moments afresh (ZeRO-1 shards included) and restarts their bias correction,
  /// as a new run's optimiser would; the learning-rate schedule goes on.
  void reset_moments();
  /// The frozen KL reference (null without one).
  CausalLMImpl* reference() noexcept { return reference_ ? reference_.get() : nullptr; }
  /// steps() after the last SFT update (0: none yet).
  std::int64_t sft_until() const noexcept { return sft_until_; }
  /// steps() when the KL reference was last taken from the policy (0: it is the model given to
  /// create()). A GRPO update that follows SFT updates first copies the policy into the reference,
  /// so the KL term holds RL near the policy it starts from, not near the weights before SFT.
  std::int64_t reference_since() const noexcept { return reference_since_; }
  /// Restores sft_until() and reference_since() from a checkpoint (the reference weights are
  /// restored separately).
  void set_reference_state(std::int64_t sft_until, std::int64_t reference_since) noexcept {
    sft_until_ = sft_until, reference_since_ = reference_since;
  }

private:
  learner(CausalLM policy, CausalLM reference, const learner_options& options, std::uint64_t version);

  struct row;
  struct micro_batch;
  /// Forward, loss and backward of every micro-batch, then hook, clip and step.
  result<step_metrics> update(std::vector<row>& rows, bool grpo, double temperature, bool recompute_old);
  /// Data parallel: a rank whose batch was refused still takes part in the first reduction, so
  /// that the other ranks fail at once instead of timing out. Returns `e`.
  crucible::error refuse_batch(crucible::error e);
  micro_batch build(const std::vector<row>& rows, std::span<const std::size_t> index) const;

  CausalLM policy_;
  CausalLM reference_;
  learner_options options_;
  std::unique_ptr<adamw> optimizer_;
  gradient_hook hook_;
  std::unique_ptr<data_parallel> dp_;
  std::uint64_t version_ = 0;
  std::int64_t sft_until_ = 0;
  std::int64_t reference_since_ = 0;
  std::string frozen_digest_;
  torch::Device device_ = torch::kCPU;
};

} // namespace crucible::policy
