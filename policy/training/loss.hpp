// policy/training/loss.hpp: GRPO and SFT losses. Rewards of scored groups come in; per-token losses
// over padded [B, T] log-prob tensors go out as one differentiable scalar plus additive statistics,
// so the learner can sum micro-batches into the full batch's loss and gradient.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <torch/torch.h>

#include "core/learner_options.hpp"

namespace crucible::policy {

// ---- rewards and advantages (plain numbers) ---------------------------------------------------

/// Rewards after `kind`. normalize_clip (CUDA-L1, arXiv 2507.14111): mean mu and population
/// standard deviation sigma over all of `rewards`, r' = clamp((r - mu) / (sigma + eps), -k, k);
/// all-equal rewards give zeros. `none` returns the input.
std::vector<double> transform_rewards(std::span<const double> rewards, reward_transform kind, double k,
                                      double eps = 1e-6);
/// The same with the statistics of a larger batch that `rewards` is part of (data parallel: every
/// rank's rewards): its mean, population standard deviation and whether all its rewards are equal.
std::vector<double> transform_rewards(std::span<const double> rewards, reward_transform kind, double k, double mean,
                                      double sd, bool all_equal, double eps = 1e-6);

/// Group-relative advantages of one group's rewards (GRPO, arXiv 2402.03300):
/// A_i = r_i - mean(r), divided by (std(r) + eps) when `std_normalize` (std with Bessel's
/// correction, n - 1, as TRL and verl compute it; 0 for a group of one). Without it (Dr.GRPO,
/// arXiv 2503.20783) only mean-centred. All-equal rewards give zeros.
std::vector<double> group_advantages(std::span<const double> rewards, bool std_normalize, double eps);

// ---- aggregation ------------------------------------------------------------------------------

/// Counts over the whole batch that fix every token's weight in the aggregate, so that the losses
/// of micro-batches add up to the loss of the batch (and their gradients to its gradient).
struct batch_totals {
  std::int64_t tokens = 0;              ///< completion tokens (mask entries) in the batch
  std::int64_t sequences = 0;           ///< rows, fully masked ones included
  std::int64_t nonempty_sequences = 0;  ///< rows with at least one completion token
  std::int64_t longest = 0;             ///< most completion tokens in one row
};

/// The totals of one mask [B, T] (bool or 0/1).
batch_totals totals_of(const torch::Tensor& mask);
/// Element-wise sum (micro-batch totals to batch totals; `longest` takes the max).
batch_totals operator+(const batch_totals& a, const batch_totals& b);

/// Each token's weight w[b, t] in the aggregate sum_{b,t} w[b, t] * loss[b, t], float32 [B, T]:
///   token_mean     m[b, t] / tokens
///   sequence_mean  m[b, t] / (nonempty_sequences * n_b)     (n_b: row b's tokens)
///   constant       m[b, t] / (sequences * constant_tokens)  (constant_tokens 0: totals.longest)
/// Fully masked rows weigh 0 everywhere; a batch with no tokens weighs 0 everywhere.
torch::Tensor token_weights(const torch::Tensor& mask, loss_aggregation aggregation, const batch_totals& totals,
                            std::int64_t constant_tokens = 0);

// ---- GRPO -------------------------------------------------------------------------------------

/// The GRPO loss's parameters (a subset of learner_options).
struct grpo_loss_options {
  double clip_low = 0.2;
  double clip_high = 0.2;
  loss_aggregation aggregation = loss_aggregation::token_mean;
  std::int64_t constant_tokens = 0;
  double kl_coef = 0.0;
  kl_estimator kl = kl_estimator::k3;
  double is_cap = 2.0; ///< 0 or less: no stale-sample correction
};

/// One micro-batch of GRPO inputs, all [B, T] float32 on one device except `advantages` [B].
/// Undefined optional tensors switch their term off.
struct grpo_inputs {
  torch::Tensor log_probs;           ///< current policy log pi_theta, differentiable
  torch::Tensor old_log_probs;       ///< log pi_old (no grad): the ratio's denominator
  torch::Tensor behaviour_log_probs; ///< optional: log pi_behaviour, the sampler's, for stale samples
  torch::Tensor ref_log_probs;       ///< optional: frozen reference, needed when kl_coef > 0
  torch::Tensor advantages;          ///< [B], one per sequence
  torch::Tensor mask;                ///< 1 on completion tokens, 0 on prompt and padding
};

/// Sums over the masked tokens of a micro-batch, added up over micro-batches, then read as means.
struct loss_stats {
  double tokens = 0;        ///< completion tokens
  double clipped = 0;       ///< tokens whose clipped branch was taken (no gradient through them)
  double ratio_sum = 0;     ///< sum of pi_theta / pi_old
  double kl_sum = 0;        ///< sum of the per-token KL estimate (when a reference is given)
  double is_weight_sum = 0; ///< sum of the stale-sample weights (1 when the correction is off)
  double is_capped = 0;     ///< tokens whose weight hit the cap
  double nll_sum = 0;       ///< sum of -log pi_theta

  loss_stats& operator+=(const loss_stats& o);
  double clip_fraction() const { return tokens > 0 ? clipped / tokens : 0.0; }
  double ratio_mean() const { return tokens > 0 ? ratio_sum / tokens : 0.0; }
  double kl_mean() const { return tokens > 0 ? kl_sum / tokens : 0.0; }
  double is_weight_mean() const { return tokens > 0 ? is_weight_sum / tokens : 0.0; }
  double nll_mean() const { return tokens > 0 ? nll_sum / tokens : 0.0; }
};

/// A differentiable scalar and its statistics.
struct loss_result {
  torch::Tensor loss; ///< float32 scalar: this micro-batch's share of the batch loss
  loss_stats stats;
};

/// The GRPO loss with DAPO's asymmetric clip and a decoupled stale-sample weight. Per token,
/// with r = exp(logp - old_logp), A the row's advantage, w as below:
///   l = w * -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A) + kl_coef * KL
/// where KL is k1 = logp - ref_logp or k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1, and
///   w = min(exp(old_logp - behaviour_logp), is_cap), a constant (no gradient).
/// w is AReaL's decoupled PPO objective (Fu et al., arXiv 2505.24298: the behaviour
/// importance weight pi_prox / pi_behav multiplies the clipped surrogate taken against the
/// proximal policy, here pi_old) with the weight truncated at a cap as in truncated importance
/// sampling (TIS, Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
/// training": min(pi_learner / pi_sampler, C)). The KL term is not weighted by w (GRPO's
/// per-token KL penalty, arXiv 2402.03300). The loss is sum_{b,t} weight[b,t] * l[b,t] with
/// token_weights(mask, aggregation, totals, constant_tokens); `totals` default to this
/// micro-batch's own (pass the whole batch's when accumulating).
loss_result grpo_loss(const grpo_inputs& in, const grpo_loss_options& options, const batch_totals* totals = nullptr);

/// SFT: mean negative log-likelihood over the completion tokens,
/// sum_{b,t} mask * -logp / totals.tokens (totals default to this micro-batch's own).
loss_result sft_loss(const torch::Tensor& log_probs, const torch::Tensor& mask, const batch_totals* totals = nullptr);

} // namespace crucible::policy
