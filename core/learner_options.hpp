// core/learner_options.hpp: the `learner:` section of the run configuration (GRPO and SFT
// losses, AdamW, schedule, micro-batching, LoRA), decoded by core/config.cpp and consumed by
// policy/training/learner.hpp. No torch types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

/// How rewards are transformed before group advantages are computed.
enum class reward_transform : std::uint8_t {
  none,           ///< rewards as the evaluator gave them
  normalize_clip, ///< CUDA-L1: (r - mean) / std over the batch, then clipped to [-k, k]
};

/// How per-token losses become one number (see policy/training/loss.hpp for the exact formulas).
enum class loss_aggregation : std::uint8_t {
  token_mean,    ///< sum over all completion tokens / their count (DAPO)
  sequence_mean, ///< mean over sequences of each sequence's token mean (GRPO)
  constant,      ///< sum / (sequences x a constant token count) (Dr.GRPO)
};

/// Estimator of KL(pi_theta || pi_ref) per token, from log-ratio d = ref_logp - logp.
enum class kl_estimator : std::uint8_t {
  k1, ///< -d  (= logp - ref_logp)
  k3, ///< exp(d) - d - 1 (Schulman's unbiased, non-negative estimator; GRPO's choice)
};

/// Where the "old" log-probs of the clipped ratio come from.
enum class old_log_probs_source : std::uint8_t {
  recompute, ///< one no-grad forward of the learner's current weights before the update
  behaviour, ///< the engine's sampling log-probs (exact only when samples are on-policy)
  automatic, ///< behaviour when every sample's policy version is the learner's, else recompute
};

/// Learning-rate schedule after the warm-up.
enum class lr_schedule : std::uint8_t {
  constant, ///< lr
  cosine,   ///< from lr down to lr * min_lr_ratio at total_steps
};

/// How a turn's return is made from the rewards of its episode's turns r_0 .. r_{T-1}
/// (multi-turn episodes, rollout.turns > 1; policy/training/episodes.hpp).
enum class turn_return : std::uint8_t {
  discounted, ///< G_t = sum_{k >= t} gamma^(k - t) r_k: the discounted return-to-go (Kevin-32B)
  best,       ///< G_t = max_{k >= t} gamma^(k - t) r_k: the best the episode reaches from turn t on
  immediate,  ///< G_t = r_t: each turn judged alone
};

/// How returns become advantages across a group's episodes, turn by turn (only the episodes that
/// reached turn t take part).
enum class turn_advantage : std::uint8_t {
  grpo,  ///< GRPO at each turn (learner.std_normalize and std_eps apply)
  trloo, ///< turn-level leave-one-out (Dr.Kernel): the return minus the mean of the others' at that turn
};

/// `learner:` — losses, optimiser and schedule of the GRPO/SFT learner. Plain value.
struct learner_options {
  // AdamW (PyTorch's torch.optim.AdamW semantics: decoupled decay p -= lr * wd * p).
  double lr = 1e-6;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;        ///< applied to matrices and embeddings, not biases or norms
  // Schedule.
  std::int64_t warmup_steps = 0;    ///< linear warm-up: update n (1-based) uses lr * n / warmup_steps
  lr_schedule schedule = lr_schedule::constant;
  std::int64_t total_steps = 0;     ///< cosine: the update at which lr reaches lr * min_lr_ratio
  double min_lr_ratio = 0.0;
  double grad_clip = 1.0;           ///< global L2 norm; 0: no clipping
  bool reset_moments = false;       ///< a training stage after another stage's updates starts with fresh AdamW moments
  std::int64_t micro_batch_tokens = 8192; ///< padded tokens per micro-batch (rows x longest row)
  bool activation_checkpointing = false; ///< keep each decoder layer's input only; recompute the layer in backward
  // GRPO loss.
  double clip_low = 0.2;            ///< ratio clipped below at 1 - clip_low
  double clip_high = 0.2;           ///< ratio clipped above at 1 + clip_high (DAPO: 0.28)
  double kl_coef = 0.0;             ///< 0: no reference model and no KL term
  kl_estimator kl = kl_estimator::k3;
  loss_aggregation aggregation = loss_aggregation::token_mean;
  std::int64_t constant_tokens = 0; ///< `constant` normaliser; 0: the batch's longest completion
  bool std_normalize = true;        ///< divide advantages by the group's std (false: Dr.GRPO)
  double std_eps = 1e-6;            ///< A = (r - mean) / (std + std_eps)
  double negative_weight = 1.0;     ///< negative advantages are scaled by this (1: GRPO; 0: only above-mean samples learn)
  reward_transform rewards = reward_transform::none;
  double reward_clip = 3.0;         ///< k of normalize_clip
  double is_cap = 2.0;              ///< cap of the stale-sample weight min(pi_old / pi_behaviour, cap); 0: off
  old_log_probs_source old_log_probs = old_log_probs_source::recompute;
  // Multi-turn episodes (rollout.turns > 1): each turn a row, its advantage from the returns.
  turn_return turn_returns = turn_return::discounted;
  double turn_gamma = 0.4;          ///< discount of later turns' rewards (Kevin-32B: 0.4)
  turn_advantage turn_advantages = turn_advantage::grpo;
  // Model.
  std::string dtype = "float32";    ///< parameter dtype: float32 or bfloat16 (fp32 master weights)
  bool lora = false;                ///< train LoRA adapters only
  std::int64_t lora_rank = 16;
  double lora_alpha = 32.0;
  std::vector<std::string> lora_targets{"q_proj", "k_proj", "v_proj", "o_proj"};
  // Data parallel and weight sync (policy/distributed/data_parallel.hpp,
  // policy/distributed/weight_sync.hpp).
  /// One data-parallel learner rank per entry ("cpu" or "cuda:N"); the first is model.device, where
  /// rank 0 trains beside the engine. Empty: one learner on model.device. Read by the run
  /// (actors/run_roles.cpp); a policy::learner trains on the device its model is on.
  std::vector<std::string> devices;
  double bucket_mb = 25.0;          ///< float32 gradient MiB reduced per collective
  bool overlap = true;              ///< reduce each bucket during the backward pass, as soon as it is complete
  bool zero1 = false;               ///< shard AdamW's moments and masters over the data-parallel ranks
  double collective_timeout_s = 600.0; ///< a collective not complete after this fails and aborts its communicator
  /// Refuse to start a run on CUDA whose memory plan (policy/memory_plan.hpp) exceeds a learner
  /// GPU's memory, instead of failing out of memory minutes into loading. Read by the run.
  bool memory_check = true;
  double sync_bucket_mb = 256.0;    ///< MiB of weights per broadcast of a weight sync
};

/// Names as config files spell them: "none", "normalize_clip", "token_mean", ...
const char* to_string(reward_transform v) noexcept;
const char* to_string(loss_aggregation v) noexcept;
const char* to_string(kl_estimator v) noexcept;
const char* to_string(old_log_probs_source v) noexcept;
const char* to_string(lr_schedule v) noexcept;
const char* to_string(turn_return v) noexcept;
const char* to_string(turn_advantage v) noexcept;

} // namespace crucible
