// policy/training/loss.cpp: the GRPO and SFT formulas of loss.hpp on padded [B, T] tensors.
#include "policy/training/loss.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace crucible::policy {

std::vector<double> transform_rewards(std::span<const double> rewards, reward_transform kind, double k, double eps) {
  std::vector<double> out(rewards.begin(), rewards.end());
  if (kind == reward_transform::none || out.empty())
    return out;
  const double n = static_cast<double>(out.size());
  const double mean = std::accumulate(out.begin(), out.end(), 0.0) / n;
  double var = 0.0;
  for (double r : out)
    var += (r - mean) * (r - mean);
  const double sd = std::sqrt(var / n);
  const bool all_equal = std::all_of(out.begin(), out.end(), [&](double r) { return r == out[0]; });
  return transform_rewards(rewards, kind, k, mean, sd, all_equal, eps);
}

std::vector<double> transform_rewards(std::span<const double> rewards, reward_transform kind, double k, double mean,
                                      double sd, bool all_equal, double eps) {
  std::vector<double> out(rewards.begin(), rewards.end());
  if (kind == reward_transform::none)
    return out;
  for (double& r : out)
    r = all_equal ? 0.0 : std::clamp((r - mean) / (sd + eps), -k, k);
  return out;
}

std::vector<double> group_advantages(std::span<const double> rewards, bool std_normalize, double eps) {
  std::vector<double> out(rewards.size(), 0.0);
  if (rewards.empty())
    return out;
  const double n = static_cast<double>(rewards.size());
  const double mean = std::accumulate(rewards.begin(), rewards.end(), 0.0) / n;
  double var = 0.0;
  for (double r : rewards)
    var += (r - mean) * (r - mean);
  const double sd = rewards.size() > 1 ? std::sqrt(var / (n - 1)) : 0.0;
  // Equal rewards carry no preference: exactly 0, not the rounding residue of r - mean.
  const bool all_equal = std::all_of(rewards.begin(), rewards.end(), [&](double r) { return r == rewards[0]; });
  for (std::size_t i = 0; i < rewards.size(); ++i) {
    const double centred = all_equal ? 0.0 : rewards[i] - mean;
    out[i] = std_normalize ? centred / (sd + eps) : centred;
  }
  return out;
}

batch_totals totals_of(const torch::Tensor& mask) {
  auto per_row = mask.to(torch::kLong).sum(1).cpu();
  batch_totals t;
  t.sequences = per_row.size(0);
  auto acc = per_row.accessor<std::int64_t, 1>();
  for (std::int64_t b = 0; b < t.sequences; ++b) {
    t.tokens += acc[b];
    t.nonempty_sequences += acc[b] > 0;
    t.longest = std::max(t.longest, acc[b]);
  }
  return t;
}

batch_totals operator+(const batch_totals& a, const batch_totals& b) {
  return {a.tokens + b.tokens, a.sequences + b.sequences, a.nonempty_sequences + b.nonempty_sequences,
          std::max(a.longest, b.longest)};
}

torch::Tensor token_weights(const torch::Tensor& mask, loss_aggregation aggregation, const batch_totals& totals,
                            std::int64_t constant_tokens) {
  auto m = mask.to(torch::kFloat);
  switch (aggregation) {
    case loss_aggregation::token_mean:
      return totals.tokens > 0 ? m / static_cast<double>(totals.tokens) : torch::zeros_like(m);
    case loss_aggregation::sequence_mean: {
      if (totals.nonempty_sequences == 0)
        return torch::zeros_like(m);
      auto n = m.sum(1, /*keepdim=*/true).clamp_min(1.0);
      return m / n / static_cast<double>(totals.nonempty_sequences);
    }
    case loss_aggregation::constant: {
      const auto c = constant_tokens > 0 ? constant_tokens : totals.longest;
      if (totals.sequences == 0 || c == 0)
        return torch::zeros_like(m);
      return m / (static_cast<double>(totals.sequences) * static_cast<double>(c));
    }
  }
  return torch::zeros_like(m);
}

loss_stats& loss_stats::operator+=(const loss_stats& o) {
  tokens += o.tokens;
  clipped += o.clipped;
  ratio_sum += o.ratio_sum;
  kl_sum += o.kl_sum;
  is_weight_sum += o.is_weight_sum;
  is_capped += o.is_capped;
  nll_sum += o.nll_sum;
  return *this;
}

namespace {

void check_shape(const torch::Tensor& t, const torch::Tensor& like, const char* name) {
  TORCH_CHECK(t.sizes() == like.sizes(), "grpo_loss: ", name, " ", t.sizes(), " does not match log_probs ",
              like.sizes());
}

} // namespace

loss_result grpo_loss(const grpo_inputs& in, const grpo_loss_options& o, const batch_totals* totals) {
  const auto& logp = in.log_probs;
  TORCH_CHECK(logp.dim() == 2, "grpo_loss: log_probs must be [B, T], got ", logp.sizes());
  check_shape(in.old_log_probs, logp, "old_log_probs");
  check_shape(in.mask, logp, "mask");
  if (in.behaviour_log_probs.defined())
    check_shape(in.behaviour_log_probs, logp, "behaviour_log_probs");
  TORCH_CHECK(o.kl_coef == 0.0 || in.ref_log_probs.defined(), "grpo_loss: kl_coef > 0 needs ref_log_probs");
  if (in.ref_log_probs.defined())
    check_shape(in.ref_log_probs, logp, "ref_log_probs");
  TORCH_CHECK(in.advantages.dim() == 1 && in.advantages.size(0) == logp.size(0), "grpo_loss: advantages ",
              in.advantages.sizes(), " must be [", logp.size(0), "]");

  const auto own = totals != nullptr ? batch_totals{} : totals_of(in.mask);
  const auto& tot = totals != nullptr ? *totals : own;
  auto valid = in.mask.to(torch::kBool);
  auto m = valid.to(torch::kFloat);
  auto zeros = torch::zeros_like(m);
  // Padding may hold anything (0, or -inf from a masked softmax): every exponent is taken of
  // masked differences so that a weight of 0 never meets an inf.
  auto masked = [&](const torch::Tensor& x) { return torch::where(valid, x, zeros); };

  auto log_ratio = masked(logp.to(torch::kFloat) - in.old_log_probs.detach().to(torch::kFloat));
  auto ratio = torch::exp(log_ratio);
  auto adv = in.advantages.detach().to(torch::kFloat).to(logp.device()).unsqueeze(1);
  auto unclipped = ratio * adv;
  auto clipped = torch::clamp(ratio, 1.0 - o.clip_low, 1.0 + o.clip_high) * adv;
  // min(r A, clip(r) A): the clipped branch wins only where it is strictly smaller, and there r
  // lies outside the clip range, so those tokens get no gradient.
  auto took_clip = clipped < unclipped;
  auto surrogate = torch::where(took_clip, clipped, unclipped);

  torch::Tensor is_weight, capped;
  if (in.behaviour_log_probs.defined() && o.is_cap > 0) {
    auto raw = torch::exp(masked(in.old_log_probs.detach().to(torch::kFloat) - in.behaviour_log_probs.to(torch::kFloat)));
    is_weight = raw.clamp_max(o.is_cap);
    capped = raw > o.is_cap;
  } else {
    is_weight = torch::ones_like(m);
    capped = torch::zeros_like(valid);
  }
  auto per_token = -surrogate * is_weight;

  torch::Tensor kl;
  if (in.ref_log_probs.defined()) {
    auto d = masked(in.ref_log_probs.detach().to(torch::kFloat) - logp.to(torch::kFloat));
    kl = o.kl == kl_estimator::k1 ? -d : torch::exp(d) - d - 1.0;
    if (o.kl_coef != 0.0)
      per_token = per_token + o.kl_coef * kl;
  }

  auto weights = token_weights(in.mask, o.aggregation, tot, o.constant_tokens);
  loss_result out;
  out.loss = (weights * per_token).sum();

  torch::NoGradGuard no_grad;
  // One transfer for all statistics (a host synchronisation per item would cost one each on CUDA).
  auto sums = torch::stack({m.sum(), (took_clip & valid).to(torch::kFloat).sum(), (ratio * m).sum(),
                            kl.defined() ? (kl.detach() * m).sum() : torch::zeros({}, m.options()),
                            (is_weight * m).sum(), (capped & valid).to(torch::kFloat).sum(),
                            -(masked(logp.detach().to(torch::kFloat))).sum()})
                .to(torch::kCPU, torch::kDouble);
  auto s = sums.accessor<double, 1>();
  out.stats = {s[0], s[1], s[2], s[3], s[4], s[5], s[6]};
  return out;
}

loss_result sft_loss(const torch::Tensor& log_probs, const torch::Tensor& mask, const batch_totals* totals) {
  TORCH_CHECK(log_probs.dim() == 2 && mask.sizes() == log_probs.sizes(), "sft_loss: log_probs ", log_probs.sizes(),
              " and mask ", mask.sizes(), " must be the same [B, T]");
  const auto tot = totals != nullptr ? *totals : totals_of(mask);
  auto valid = mask.to(torch::kBool);
  auto nll = -torch::where(valid, log_probs.to(torch::kFloat), torch::zeros_like(log_probs, torch::kFloat));
  auto weights = token_weights(mask, loss_aggregation::token_mean, tot);
  loss_result out;
  out.loss = (weights * nll).sum();
  torch::NoGradGuard no_grad;
  auto sums = torch::stack({valid.to(torch::kFloat).sum(), nll.detach().sum()}).to(torch::kCPU, torch::kDouble);
  out.stats.tokens = sums[0].item<double>();
  out.stats.nll_sum = sums[1].item<double>();
  return out;
}

} // namespace crucible::policy
