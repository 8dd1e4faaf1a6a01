// policy/training/optimizer.cpp: AdamW on float32 masters, the schedule and gradient clipping.
#include "policy/training/optimizer.hpp"

#include <cassert>
#include <cmath>
#include <numbers>

namespace crucible::policy {

double scheduled_lr(const learner_options& o, std::int64_t n) {
  if (o.warmup_steps > 0 && n <= o.warmup_steps)
    return o.lr * static_cast<double>(n) / static_cast<double>(o.warmup_steps);
  if (o.schedule == lr_schedule::constant || o.total_steps <= o.warmup_steps)
    return o.lr;
  const double p = std::min(1.0, static_cast<double>(n - o.warmup_steps) /
                                     static_cast<double>(o.total_steps - o.warmup_steps));
  return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * 0.5 * (1.0 + std::cos(std::numbers::pi * p)));
}

double clip_grad_norm(std::span<const torch::Tensor> grads, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  for (const auto& g : grads)
    if (g.defined())
      norms.push_back(g.detach().to(torch::kFloat).norm());
  if (norms.empty())
    return 0.0;
  // One host synchronisation for the whole model.
  const double norm = torch::stack(norms).norm().item<double>();
  if (!std::isfinite(norm) || max_norm <= 0 || norm <= max_norm)
    return norm;
  const double scale = max_norm / (norm + 1e-6);
  for (const auto& g : grads)
    if (g.defined())
      g.mul_(scale); // in place: the tensors are the caller's buffers
  return norm;
}

void adamw_update(torch::Tensor& w, const torch::Tensor& g, torch::Tensor& m, torch::Tensor& v, double lr,
                  std::int64_t t, const adamw_options& o, bool decay) {
  const double bias1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(t)));
  if (o.weight_decay != 0.0 && decay)
    w.mul_(1.0 - lr * o.weight_decay);
  m.lerp_(g, 1.0 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  auto denom = (v.sqrt() / bias2_sqrt).add_(o.eps);
  w.addcdiv_(m, denom, -lr / bias1);
}

adamw::adamw(std::vector<named_parameter> params, adamw_options options)
  : params_(std::move(params)), options_(options) {
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params_) {
    const bool fp32 = p.scalar_type() == torch::kFloat;
    // Sharded: the masters and moments are data_parallel's; masters_ only aliases the parameters.
    masters_.push_back(fp32 || options_.sharded ? p : p.detach().to(torch::kFloat).clone());
    grads_.push_back(fp32 ? torch::Tensor{} : torch::zeros(p.sizes(), p.options().dtype(torch::kFloat)));
    exp_avg_.push_back(options_.sharded ? torch::Tensor{} : torch::zeros(p.sizes(), p.options().dtype(torch::kFloat)));
    exp_avg_sq_.push_back(options_.sharded ? torch::Tensor{}
                                           : torch::zeros(p.sizes(), p.options().dtype(torch::kFloat)));
    in_grad_.push_back(false);
    decays_.push_back(p.dim() >= 2);
  }
}

void adamw::sync_masters() {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (has_master_copy(i))
      masters_[i].copy_(params_[i].param);
}

void adamw::accumulate_gradient(std::size_t i) {
  torch::NoGradGuard no_grad;
  auto& p = params_[i].param;
  if (!grads_[i].defined())
    return; // a float32 parameter with no placed storage: .grad is the accumulation
  const auto& pending = p.grad();
  if (pending.defined() && pending.data_ptr() != grads_[i].data_ptr()) // not the storage itself
    // No float32 temporary: the add promotes bf16 to float32 exactly, as .to(kFloat) would.
    grads_[i].add_(pending);
  // A float32 parameter keeps its placed storage as .grad (also when something had replaced it).
  p.mutable_grad() = in_grad_[i] ? grads_[i] : torch::Tensor{};
}

void adamw::accumulate_gradients() {
  for (std::size_t i = 0; i < params_.size(); ++i)
    accumulate_gradient(i);
}

std::vector<torch::Tensor> adamw::gradients() {
  std::vector<torch::Tensor> out;
  out.reserve(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (grads_[i].defined()) {
      out.push_back(grads_[i]);
      continue;
    }
    auto& p = params_[i].param;
    if (!p.grad().defined())
      p.mutable_grad() = torch::zeros_like(p);
    out.push_back(p.grad());
  }
  return out;
}

void adamw::place_gradient(std::size_t i, const torch::Tensor& storage) {
  torch::NoGradGuard no_grad;
  auto& p = params_[i].param;
  assert(storage.scalar_type() == torch::kFloat && storage.numel() == p.numel());
  auto g = storage.view(p.sizes());
  if (grads_[i].defined())
    g.add_(grads_[i]);
  if (p.grad().defined() && (!grads_[i].defined() || p.grad().data_ptr() != grads_[i].data_ptr()))
    g.add_(p.grad());
  grads_[i] = g; // the optimiser's own buffer, if any, goes now
  in_grad_[i] = p.scalar_type() == torch::kFloat;
  p.mutable_grad() = in_grad_[i] ? g : torch::Tensor{};
}

void adamw::zero_grad() {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].param;
    if (grads_[i].defined()) {
      grads_[i].zero_();
      p.mutable_grad() = in_grad_[i] ? grads_[i] : torch::Tensor{};
    } else if (p.grad().defined()) {
      p.mutable_grad().zero_();
    }
  }
}

void adamw::step(double lr) {
  assert(!options_.sharded && "a sharded adamw is stepped by data_parallel::sharded_step");
  torch::NoGradGuard no_grad;
  auto grads = gradients();
  ++steps_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& w = masters_[i];
    adamw_update(w, grads[i], exp_avg_[i], exp_avg_sq_[i], lr, steps_ - moments_since_, options_, decays_[i]);
    if (has_master_copy(i))
      params_[i].param.copy_(w);
  }
}

void adamw::reset_moments() {
  torch::NoGradGuard no_grad;
  for (auto& m : exp_avg_)
    if (m.defined())
      m.zero_();
  for (auto& v : exp_avg_sq_)
    if (v.defined())
      v.zero_();
  moments_since_ = steps_;
}

std::vector<std::pair<std::string, torch::Tensor>> adamw::moments() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (options_.sharded)
    return out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg." + params_[i].name, exp_avg_[i]);
    out.emplace_back("exp_avg_sq." + params_[i].name, exp_avg_sq_[i]);
  }
  return out;
}

result<void> adamw::check_state(const std::map<std::string, torch::Tensor>& tensors, bool with_masters,
                                const std::string& origin) const {
  auto check = [&](const std::string& name, const torch::Tensor& like) -> result<void> {
    auto it = tensors.find(name);
    if (it == tensors.end())
      return fail(errc::corrupt, origin, ": missing tensor ", name);
    if (it->second.sizes() != like.sizes() || it->second.scalar_type() != torch::kFloat)
      return fail(errc::corrupt, origin, ": tensor ", name, " is ", c10::toString(it->second.scalar_type()), " ",
                  c10::str(it->second.sizes()), ", expected Float ", c10::str(like.sizes()));
    return {};
  };
  if (options_.sharded)
    return fail(errc::config, origin, ": the optimiser state is sharded (learner.zero1): it is restored by rank");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& name = params_[i].name;
    for (const char* kind : {"exp_avg.", "exp_avg_sq.", "master."}) {
      if (kind[0] == 'm' && !with_masters)
        continue;
      if (auto r = check(kind + name, params_[i].param); !r)
        return r;
    }
  }
  return {};
}

result<void> adamw::restore(const std::map<std::string, torch::Tensor>& tensors, std::int64_t steps,
                            bool with_masters, const std::string& origin) {
  if (steps < 0)
    return fail(errc::corrupt, origin, ": negative optimiser step count");
  if (auto r = check_state(tensors, with_masters, origin); !r)
    return r;
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& name = params_[i].name;
    exp_avg_[i].copy_(tensors.at("exp_avg." + name));
    exp_avg_sq_[i].copy_(tensors.at("exp_avg_sq." + name));
    if (with_masters)
      masters_[i].copy_(tensors.at("master." + name));
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!has_master_copy(i))
      continue;
    if (with_masters)
      params_[i].param.copy_(masters_[i]);
    else // the parameters were restored elsewhere: the masters follow them
      masters_[i].copy_(params_[i].param);
  }
  steps_ = steps;
  return {};
}

} // namespace crucible::policy
