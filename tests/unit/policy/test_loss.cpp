// tests/unit/policy/test_loss.cpp: every formula of policy/training/loss.hpp and
// policy/training/optimizer.hpp against a direct element-by-element computation on plain doubles.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>

#include <torch/torch.h>

#include "policy/training/learner.hpp"
#include "policy/training/loss.hpp"
#include "policy/training/optimizer.hpp"

using namespace crucible;
using namespace crucible::policy;

namespace {

// Tensors here are tiny: intra-op threads only add synchronisation, and on a loaded machine
// OpenMP's spin-waiting made these tests twenty times slower (measured: 11.5 s against 0.5 s).
const bool one_thread = [] {
  torch::set_num_threads(1);
  return true;
}();

using grid = std::vector<std::vector<double>>;

torch::Tensor to_tensor2(const grid& g) {
  const auto b = static_cast<std::int64_t>(g.size()), t = static_cast<std::int64_t>(g[0].size());
  auto out = torch::empty({b, t}, torch::kFloat);
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t j = 0; j < t; ++j)
      out[i][j] = g[i][j];
  return out;
}

// A padded batch: random log-probs, olds and behaviours around them (ratios inside and outside
// the clip range), a fully masked row, a single-token row, and garbage (-inf) in the padding.
struct case_data {
  grid logp, old, beh, ref, mask;
  std::vector<double> adv;
};

case_data make_case(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> lp(-4.0, -0.1), noise(-0.6, 0.6), adv(-2.0, 2.0);
  const int b = 5, t = 7;
  // Completion spans per row: [start, end); row 2 fully masked, row 3 a single token.
  const int spans[5][2] = {{2, 7}, {1, 4}, {0, 0}, {5, 6}, {3, 7}};
  case_data c;
  c.logp = c.old = c.beh = c.ref = c.mask = grid(b, std::vector<double>(t, 0.0));
  for (int i = 0; i < b; ++i) {
    c.adv.push_back(adv(rng));
    for (int j = 0; j < t; ++j) {
      const bool in = j >= spans[i][0] && j < spans[i][1];
      c.mask[i][j] = in ? 1.0 : 0.0;
      if (in) {
        c.logp[i][j] = lp(rng);
        c.old[i][j] = c.logp[i][j] + noise(rng);
        c.beh[i][j] = c.old[i][j] + noise(rng) * 2; // some weights above the cap
        c.ref[i][j] = c.logp[i][j] + noise(rng);
      } else {
        c.logp[i][j] = c.old[i][j] = c.beh[i][j] = c.ref[i][j] = -std::numeric_limits<double>::infinity();
      }
    }
  }
  return c;
}

// The loss and d loss / d logp, token by token.
std::pair<double, grid> reference_grpo(const case_data& c, const grpo_loss_options& o, bool use_beh, bool use_ref) {
  const auto b = c.logp.size(), t = c.logp[0].size();
  grid grad(b, std::vector<double>(t, 0.0));
  std::vector<double> n(b, 0.0);
  double tokens = 0, nonempty = 0, longest = 0;
  for (std::size_t i = 0; i < b; ++i) {
    for (std::size_t j = 0; j < t; ++j)
      n[i] += c.mask[i][j];
    tokens += n[i];
    nonempty += n[i] > 0;
    longest = std::max(longest, n[i]);
  }
  double total = 0;
  for (std::size_t i = 0; i < b; ++i) {
    for (std::size_t j = 0; j < t; ++j) {
      if (c.mask[i][j] == 0)
        continue;
      double weight = 0;
      switch (o.aggregation) {
        case loss_aggregation::token_mean: weight = 1.0 / tokens; break;
        case loss_aggregation::sequence_mean: weight = 1.0 / (nonempty * n[i]); break;
        case loss_aggregation::constant:
          weight = 1.0 / (static_cast<double>(b) * (o.constant_tokens > 0 ? o.constant_tokens : longest));
          break;
      }
      const double a = c.adv[i];
      const double r = std::exp(c.logp[i][j] - c.old[i][j]);
      const double rc = std::clamp(r, 1.0 - o.clip_low, 1.0 + o.clip_high);
      const bool clipped = rc * a < r * a;
      const double w = use_beh ? std::min(std::exp(c.old[i][j] - c.beh[i][j]), o.is_cap) : 1.0;
      double l = -w * std::min(r * a, rc * a);
      double g = clipped ? 0.0 : -w * a * r;
      if (use_ref) {
        const double d = c.ref[i][j] - c.logp[i][j];
        if (o.kl == kl_estimator::k1) {
          l += o.kl_coef * -d;
          g += o.kl_coef;
        } else {
          l += o.kl_coef * (std::exp(d) - d - 1.0);
          g += o.kl_coef * (1.0 - std::exp(d));
        }
      }
      total += weight * l;
      grad[i][j] = weight * g;
    }
  }
  return {total, grad};
}

grpo_inputs inputs_of(const case_data& c, bool use_beh, bool use_ref, torch::Tensor& logp) {
  logp = to_tensor2(c.logp).requires_grad_(true);
  grpo_inputs in;
  in.log_probs = logp;
  in.old_log_probs = to_tensor2(c.old);
  if (use_beh)
    in.behaviour_log_probs = to_tensor2(c.beh);
  if (use_ref)
    in.ref_log_probs = to_tensor2(c.ref);
  in.advantages = torch::tensor(c.adv, torch::kDouble).to(torch::kFloat);
  in.mask = to_tensor2(c.mask).to(torch::kBool);
  return in;
}

double max_diff(const torch::Tensor& t, const grid& g) {
  double worst = 0;
  for (std::size_t i = 0; i < g.size(); ++i)
    for (std::size_t j = 0; j < g[i].size(); ++j)
      worst = std::max(worst, std::abs(t[i][j].item<double>() - g[i][j]));
  return worst;
}

} // namespace

TEST_CASE("transform_rewards: normalize_clip standardises over the batch and clips to k") {
  const std::vector<double> r{0.0, 1.0, 2.0, 10.0};
  const double mean = 13.0 / 4;
  double var = 0;
  for (double x : r)
    var += (x - mean) * (x - mean);
  const double sd = std::sqrt(var / 4);
  auto out = transform_rewards(r, reward_transform::normalize_clip, 1.0, 1e-6);
  REQUIRE(out.size() == 4);
  for (std::size_t i = 0; i < r.size(); ++i)
    CHECK(out[i] == doctest::Approx(std::clamp((r[i] - mean) / (sd + 1e-6), -1.0, 1.0)).epsilon(1e-12));
  CHECK(out[3] == 1.0);  // (10 - 3.25) / 3.9 > 1: clipped
  CHECK(out[0] > -1.0);  // -0.83: inside
  CHECK(transform_rewards(r, reward_transform::none, 1.0) == r);
  CHECK(transform_rewards(std::vector<double>{0.3, 0.3, 0.3}, reward_transform::normalize_clip, 2.0) ==
        std::vector<double>{0, 0, 0});
}

TEST_CASE("group_advantages: mean-centred, divided by the sample std unless Dr.GRPO") {
  const std::vector<double> r{1, 2, 3, 4};
  const double sd = std::sqrt((2.25 + 0.25 + 0.25 + 2.25) / 3.0);
  auto a = group_advantages(r, true, 1e-6);
  for (std::size_t i = 0; i < r.size(); ++i)
    CHECK(a[i] == doctest::Approx((r[i] - 2.5) / (sd + 1e-6)).epsilon(1e-12));
  CHECK(group_advantages(r, false, 1e-6) == std::vector<double>{-1.5, -0.5, 0.5, 1.5});
  // All-equal rewards: exactly zero (no rounding residue amplified by a tiny std).
  for (bool norm : {true, false}) {
    CHECK(group_advantages(std::vector<double>{0.1, 0.1, 0.1}, norm, 1e-6) == std::vector<double>{0, 0, 0});
    CHECK(group_advantages(std::vector<double>{7.0}, norm, 1e-6) == std::vector<double>{0});
  }
}

TEST_CASE("grpo_loss equals the token-by-token computation: value and gradient, every aggregation and option") {
  for (std::uint64_t seed : {1, 2, 3}) {
    const auto c = make_case(seed);
    for (auto agg : {loss_aggregation::token_mean, loss_aggregation::sequence_mean, loss_aggregation::constant})
      for (std::int64_t constant : {0, 9})
        for (int variant = 0; variant < 4; ++variant) {
          const bool use_beh = variant & 1, use_ref = variant & 2;
          grpo_loss_options o;
          o.clip_low = 0.2;
          o.clip_high = 0.28;
          o.aggregation = agg;
          o.constant_tokens = constant;
          o.is_cap = 1.5;
          o.kl_coef = use_ref ? 0.1 : 0.0;
          for (auto est : {kl_estimator::k1, kl_estimator::k3}) {
            o.kl = est;
            CAPTURE(seed);
            CAPTURE(to_string(agg));
            CAPTURE(constant);
            CAPTURE(variant);
            CAPTURE(to_string(est));
            torch::Tensor logp;
            auto in = inputs_of(c, use_beh, use_ref, logp);
            auto out = grpo_loss(in, o);
            auto [want, want_grad] = reference_grpo(c, o, use_beh, use_ref);
            CHECK(out.loss.item<double>() == doctest::Approx(want).epsilon(1e-5));
            out.loss.backward();
            REQUIRE(logp.grad().defined());
            CHECK(torch::isfinite(logp.grad()).all().item<bool>());
            CHECK(max_diff(logp.grad(), want_grad) < 1e-6);
          }
        }
  }
}

TEST_CASE("grpo_loss statistics: clip fraction, ratio, KL and weights over the masked tokens") {
  const auto c = make_case(7);
  grpo_loss_options o;
  o.clip_low = 0.1;
  o.clip_high = 0.1;
  o.is_cap = 1.2;
  o.kl_coef = 0.05;
  o.kl = kl_estimator::k3;
  torch::Tensor logp;
  auto out = grpo_loss(inputs_of(c, true, true, logp), o);
  double tokens = 0, clipped = 0, ratio = 0, kl = 0, w = 0, capped = 0;
  for (std::size_t i = 0; i < c.mask.size(); ++i)
    for (std::size_t j = 0; j < c.mask[i].size(); ++j) {
      if (c.mask[i][j] == 0)
        continue;
      const double r = std::exp(c.logp[i][j] - c.old[i][j]), a = c.adv[i];
      tokens += 1;
      clipped += std::clamp(r, 0.9, 1.1) * a < r * a;
      ratio += r;
      const double d = c.ref[i][j] - c.logp[i][j];
      kl += std::exp(d) - d - 1;
      const double raw = std::exp(c.old[i][j] - c.beh[i][j]);
      w += std::min(raw, 1.2);
      capped += raw > 1.2;
    }
  CHECK(out.stats.tokens == tokens);
  CHECK(out.stats.clipped == clipped);
  CHECK(clipped > 0);
  CHECK(clipped < tokens);
  CHECK(out.stats.ratio_sum == doctest::Approx(ratio).epsilon(1e-6));
  CHECK(out.stats.kl_sum == doctest::Approx(kl).epsilon(1e-5));
  CHECK(out.stats.is_weight_sum == doctest::Approx(w).epsilon(1e-6));
  CHECK(out.stats.is_capped == capped);
  CHECK(capped > 0);
  CHECK(out.stats.clip_fraction() == doctest::Approx(clipped / tokens));
}

TEST_CASE("micro-batch losses with the batch's totals add up to the batch loss, for every aggregation") {
  const auto c = make_case(11);
  for (auto agg : {loss_aggregation::token_mean, loss_aggregation::sequence_mean, loss_aggregation::constant}) {
    CAPTURE(to_string(agg));
    grpo_loss_options o;
    o.aggregation = agg;
    o.kl_coef = 0.1;
    torch::Tensor logp;
    auto in = inputs_of(c, true, true, logp);
    const auto whole = grpo_loss(in, o).loss.item<double>();
    const auto totals = totals_of(in.mask);
    CHECK(totals.tokens == 5 + 3 + 0 + 1 + 4);
    CHECK(totals.sequences == 5);
    CHECK(totals.nonempty_sequences == 4);
    CHECK(totals.longest == 5);
    // Rows {0, 2} and {1, 3, 4} as two micro-batches.
    double parts = 0;
    batch_totals summed;
    for (auto rows : {std::vector<std::int64_t>{0, 2}, std::vector<std::int64_t>{1, 3, 4}}) {
      auto idx = torch::tensor(rows);
      grpo_inputs part;
      part.log_probs = in.log_probs.index_select(0, idx);
      part.old_log_probs = in.old_log_probs.index_select(0, idx);
      part.behaviour_log_probs = in.behaviour_log_probs.index_select(0, idx);
      part.ref_log_probs = in.ref_log_probs.index_select(0, idx);
      part.advantages = in.advantages.index_select(0, idx);
      part.mask = in.mask.index_select(0, idx);
      parts += grpo_loss(part, o, &totals).loss.item<double>();
      summed = summed + totals_of(part.mask);
      // Without the batch's totals a part is normalised on its own: not a share of the batch.
    }
    CHECK(parts == doctest::Approx(whole).epsilon(1e-6));
    CHECK(summed.tokens == totals.tokens);
    CHECK(summed.nonempty_sequences == totals.nonempty_sequences);
    CHECK(summed.longest == totals.longest);
  }
}

TEST_CASE("edge cases: zero advantages, an all-masked batch, single tokens") {
  auto c = make_case(5);
  grpo_loss_options o;
  torch::Tensor logp;
  // All-equal rewards: zero advantages, zero policy loss and gradient.
  std::fill(c.adv.begin(), c.adv.end(), 0.0);
  auto out = grpo_loss(inputs_of(c, true, false, logp), o);
  CHECK(out.loss.item<double>() == 0.0);
  out.loss.backward();
  CHECK(logp.grad().abs().max().item<double>() == 0.0);
  // Nothing to learn from: the loss is 0 (not NaN) under every aggregation.
  for (auto& row : c.mask)
    std::fill(row.begin(), row.end(), 0.0);
  for (auto agg : {loss_aggregation::token_mean, loss_aggregation::sequence_mean, loss_aggregation::constant}) {
    o.aggregation = agg;
    auto empty = grpo_loss(inputs_of(c, true, true, logp), o);
    CHECK(empty.loss.item<double>() == 0.0);
    CHECK(empty.stats.tokens == 0);
    CHECK(empty.stats.clip_fraction() == 0.0);
  }
  // One single-token row: sequence_mean = token_mean = that token's loss.
  case_data one;
  one.logp = {{-1.0, -0.5}};
  one.old = {{-1.0, -0.7}};
  one.beh = one.old;
  one.ref = one.old;
  one.mask = {{0.0, 1.0}};
  one.adv = {0.7};
  for (auto agg : {loss_aggregation::token_mean, loss_aggregation::sequence_mean}) {
    o.aggregation = agg;
    auto r = grpo_loss(inputs_of(one, false, false, logp), o);
    const double ratio = std::exp(0.2);
    CHECK(r.loss.item<double>() == doctest::Approx(-std::min(ratio * 0.7, 1.2 * 0.7)).epsilon(1e-6));
  }
}

TEST_CASE("sft_loss: mean negative log-likelihood of the completion tokens") {
  const auto c = make_case(3);
  auto logp = to_tensor2(c.logp).requires_grad_(true);
  auto mask = to_tensor2(c.mask);
  auto out = sft_loss(logp, mask);
  double sum = 0, n = 0;
  for (std::size_t i = 0; i < c.mask.size(); ++i)
    for (std::size_t j = 0; j < c.mask[i].size(); ++j)
      if (c.mask[i][j] > 0) {
        sum -= c.logp[i][j];
        n += 1;
      }
  CHECK(out.loss.item<double>() == doctest::Approx(sum / n).epsilon(1e-6));
  CHECK(out.stats.nll_mean() == doctest::Approx(sum / n).epsilon(1e-6));
  out.loss.backward();
  grid want(c.mask.size(), std::vector<double>(c.mask[0].size(), 0.0));
  for (std::size_t i = 0; i < c.mask.size(); ++i)
    for (std::size_t j = 0; j < c.mask[i].size(); ++j)
      want[i][j] = c.mask[i][j] > 0 ? -1.0 / n : 0.0;
  CHECK(max_diff(logp.grad(), want) < 1e-7);
}

// ---- optimiser ------------------------------------------------------------------------------

TEST_CASE("AdamW: two steps equal the hand computation of PyTorch's formula (decay on matrices only)") {
  adamw_options o{0.9, 0.99, 1e-8, 0.1};
  const double lr = 0.01;
  auto w = torch::tensor({0.5, -1.0, 2.0, 0.25}, torch::kFloat).view({2, 2}).requires_grad_(true);
  auto b = torch::tensor({0.3, -0.2}, torch::kFloat).requires_grad_(true);
  adamw opt({{"w", w}, {"b", b}}, o);
  const std::vector<std::vector<double>> gw{{0.1, -0.2, 0.3, 0.05}, {-0.4, 0.1, 0.2, 0.0}};
  const std::vector<std::vector<double>> gb{{1.0, -0.5}, {0.5, 0.25}};
  // Hand computation in double.
  std::vector<double> pw{0.5, -1.0, 2.0, 0.25}, pb{0.3, -0.2};
  std::vector<double> mw(4, 0), vw(4, 0), mb(2, 0), vb(2, 0);
  auto hand = [&](std::vector<double>& p, std::vector<double>& m, std::vector<double>& v, const std::vector<double>& g,
                  int t, bool decay) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (decay)
        p[i] *= 1 - lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(o.beta1, t));
      const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
      p[i] -= lr * mhat / denom;
    }
  };
  for (int step = 0; step < 2; ++step) {
    w.mutable_grad() = torch::tensor(gw[step], torch::kDouble).to(torch::kFloat).view({2, 2});
    b.mutable_grad() = torch::tensor(gb[step], torch::kDouble).to(torch::kFloat);
    opt.step(lr);
    hand(pw, mw, vw, gw[step], step + 1, true);
    hand(pb, mb, vb, gb[step], step + 1, false);
  }
  CHECK(opt.steps() == 2);
  auto fw = w.detach().flatten();
  for (int i = 0; i < 4; ++i)
    CHECK(fw[i].item<double>() == doctest::Approx(pw[i]).epsilon(1e-6));
  for (int i = 0; i < 2; ++i)
    CHECK(b[i].item<double>() == doctest::Approx(pb[i]).epsilon(1e-6));
  // The weight with g = 0 in step 2 still moves (momentum) and decays.
  CHECK(fw[3].item<double>() != doctest::Approx(0.25).epsilon(1e-4));
}

TEST_CASE("AdamW agrees with LibTorch's torch::optim::AdamW on matrices") {
  torch::manual_seed(3);
  auto a = torch::randn({3, 4}).requires_grad_(true);
  auto b = a.detach().clone().requires_grad_(true);
  adamw mine({{"a", a}}, {0.9, 0.999, 1e-8, 0.05});
  torch::optim::AdamW theirs({b}, torch::optim::AdamWOptions(0.02).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.05));
  for (int step = 0; step < 3; ++step) {
    auto g = torch::randn({3, 4});
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    mine.step(0.02);
    theirs.step();
  }
  CHECK((a - b).abs().max().item<double>() < 1e-6);
}

TEST_CASE("bf16 parameters are updated through float32 masters and accumulate float32 gradients") {
  auto p = torch::ones({4}, torch::kBFloat16).requires_grad_(true);
  adamw opt({{"p", p}}, {0.9, 0.999, 1e-8, 0.0});
  REQUIRE(opt.has_master_copy(0));
  REQUIRE((opt.masters()[0].scalar_type() == torch::kFloat));
  // Two micro-batches: bf16 .grad moves into a float32 sum.
  p.mutable_grad() = torch::full({4}, 1.0, torch::kBFloat16);
  opt.accumulate_gradients();
  CHECK_FALSE(p.grad().defined());
  p.mutable_grad() = torch::full({4}, 1.0 / 256, torch::kBFloat16);
  opt.accumulate_gradients();
  auto g = opt.gradients()[0];
  CHECK((g.scalar_type() == torch::kFloat));
  CHECK(g[0].item<double>() == 1.0 + 1.0 / 256); // not representable in bf16 (8 bits of mantissa)
  // An update of 1e-3 is below bf16's resolution at 1.0 (2^-8 below it): the master moves, the
  // parameter does not, and after enough steps the parameter follows the master.
  opt.step(1e-3);
  CHECK(opt.masters()[0][0].item<double>() == doctest::Approx(1.0 - 1e-3).epsilon(1e-6));
  CHECK(p[0].item<double>() == 1.0);
  opt.zero_grad();
  CHECK(opt.gradients()[0].abs().max().item<double>() == 0.0);
  for (int i = 0; i < 9; ++i) {
    p.mutable_grad() = torch::full({4}, 1.0, torch::kBFloat16);
    opt.accumulate_gradients();
    opt.step(1e-3);
    opt.zero_grad();
  }
  const double master = opt.masters()[0][0].item<double>();
  CHECK(master == doctest::Approx(1.0 - 1e-2).epsilon(1e-4));
  CHECK(p[0].item<double>() == torch::tensor(master).to(torch::kBFloat16).item<double>());
  CHECK(p[0].item<double>() < 1.0);
}

TEST_CASE("placed gradients: a float32 .grad accumulates in the given storage, a bf16 .grad is added into it and released") {
  // What data_parallel does with its buckets: the optimiser's float32 gradients become views into
  // one flat tensor, so that no second float32 copy exists.
  auto a = torch::randn({2, 3}).requires_grad_(true);
  auto b = torch::ones({4}, torch::kBFloat16).requires_grad_(true);
  adamw opt({{"a", a}, {"b", b}}, {0.9, 0.999, 1e-8, 0.0});
  a.mutable_grad() = torch::ones({2, 3}); // a gradient so far: carried into the storage
  auto flat = torch::zeros({10});
  opt.place_gradient(0, flat.narrow(0, 0, 6));
  opt.place_gradient(1, flat.narrow(0, 6, 4));
  CHECK(a.grad().data_ptr() == flat.data_ptr());
  CHECK(a.grad().sizes() == a.sizes());
  CHECK_FALSE(b.grad().defined());
  CHECK(flat.narrow(0, 0, 6).eq(1.0).all().item<bool>());
  // Two micro-batches each: autograd adds into a's view in place; b's bf16 .grad is added in
  // float32 (1 + 1/256 is not a bf16 number) and released.
  for (int k = 0; k < 2; ++k) {
    (a * 2).sum().backward();
    (b.to(torch::kFloat) * (k == 0 ? 1.0 : 1.0 / 256)).sum().backward();
    REQUIRE(b.grad().defined());
    opt.accumulate_gradients();
    CHECK_FALSE(b.grad().defined());
    CHECK(a.grad().data_ptr() == flat.data_ptr());
  }
  CHECK(flat.narrow(0, 0, 6).eq(5.0).all().item<bool>());
  CHECK(flat.narrow(0, 6, 4).eq(1.0 + 1.0 / 256).all().item<bool>());
  auto grads = opt.gradients();
  CHECK(grads[0].data_ptr() == flat.data_ptr());
  CHECK(grads[1].data_ptr() == flat.narrow(0, 6, 4).data_ptr());
  const auto before = a.detach().clone();
  opt.step(1e-2);
  CHECK((a - before).abs().min().item<double>() > 0.0);
  CHECK(opt.masters()[1][0].item<double>() == doctest::Approx(1.0 - 1e-2).epsilon(1e-4));
  opt.zero_grad();
  CHECK(flat.abs().max().item<double>() == 0.0);
  CHECK(a.grad().data_ptr() == flat.data_ptr()); // zeroed in place, still the storage
  // A .grad that something replaced: its gradient still lands in the storage.
  a.mutable_grad() = torch::Tensor{};
  (a * 3).sum().backward();
  CHECK(a.grad().data_ptr() != flat.data_ptr());
  opt.accumulate_gradients();
  CHECK(a.grad().data_ptr() == flat.data_ptr());
  CHECK(flat.narrow(0, 0, 6).eq(3.0).all().item<bool>());
}

TEST_CASE("schedule: linear warm-up, then constant or cosine down to the floor") {
  learner_options o;
  o.lr = 1.0;
  o.warmup_steps = 4;
  CHECK(scheduled_lr(o, 1) == 0.25);
  CHECK(scheduled_lr(o, 4) == 1.0);
  CHECK(scheduled_lr(o, 100) == 1.0);
  o.schedule = lr_schedule::cosine;
  o.total_steps = 14;
  o.min_lr_ratio = 0.1;
  CHECK(scheduled_lr(o, 2) == 0.5);
  CHECK(scheduled_lr(o, 9) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.5))));
  CHECK(scheduled_lr(o, 14) == doctest::Approx(0.1));
  CHECK(scheduled_lr(o, 50) == doctest::Approx(0.1));
  o.warmup_steps = 0;
  CHECK(scheduled_lr(o, 1) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 14))));
}

TEST_CASE("clip_grad_norm: global norm, scaled to max_norm only when above it") {
  auto a = torch::tensor({3.0f, 0.0f});
  auto b = torch::tensor({4.0f});
  std::vector<torch::Tensor> g{a, b};
  CHECK(clip_grad_norm(g, 10.0) == doctest::Approx(5.0));
  CHECK(a[0].item<double>() == 3.0);
  CHECK(clip_grad_norm(g, 1.0) == doctest::Approx(5.0));
  CHECK(a[0].item<double>() == doctest::Approx(3.0 / (5.0 + 1e-6)));
  CHECK(b[0].item<double>() == doctest::Approx(4.0 / (5.0 + 1e-6)));
  CHECK(clip_grad_norm(g, 0.0) == doctest::Approx(1.0).epsilon(1e-5)); // 0: report only
  auto bad = torch::tensor({std::numeric_limits<float>::infinity()});
  std::vector<torch::Tensor> nonfinite{bad, b};
  CHECK_FALSE(std::isfinite(clip_grad_norm(nonfinite, 1.0)));
}

TEST_CASE("plan_micro_batches: padded size within the budget, every sequence once, oversized ones alone") {
  const std::vector<std::int64_t> lengths{5, 12, 3, 7, 7, 30, 1, 9};
  auto plan = plan_micro_batches(lengths, 24);
  std::vector<int> seen(lengths.size(), 0);
  for (const auto& mb : plan) {
    std::int64_t width = 0;
    for (auto i : mb) {
      ++seen[i];
      width = std::max(width, lengths[i]);
    }
    if (mb.size() > 1)
      CHECK(static_cast<std::int64_t>(mb.size()) * width <= 24);
    else
      CHECK((width <= 24 || lengths[mb[0]] == 30));
  }
  for (int s : seen)
    CHECK(s == 1);
  CHECK(plan.front() == std::vector<std::size_t>{5}); // the 30-token sequence, alone
  CHECK(plan_micro_batches(lengths, 1000).size() == 1);
  CHECK(plan_micro_batches(lengths, 1).size() == lengths.size());
}
