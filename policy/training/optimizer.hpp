// policy/training/optimizer.hpp: AdamW over a model's trainable parameters with float32 master
// weights, gradients and moments (whatever the parameters' dtype), global-norm clipping and the
// learning-rate schedule. Gradients come from backward passes; updated weights go back into the
// model's own parameters.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "core/error.hpp"
#include "core/learner_options.hpp"

namespace crucible::policy {

/// A trainable parameter and its checkpoint name.
struct named_parameter {
  std::string name;
  torch::Tensor param;
};

/// The learning rate of update `n` (1-based) under `o`'s schedule:
///   n <= warmup_steps:  lr * n / warmup_steps
///   constant:           lr
///   cosine:             lr * (min_lr_ratio + (1 - min_lr_ratio) * (1 + cos(pi * p)) / 2),
///                       p = min(1, (n - warmup_steps) / (total_steps - warmup_steps))
double scheduled_lr(const learner_options& o, std::int64_t n);

/// The global L2 norm of `grads` (float32 or any float type; undefined entries count as zero).
/// When max_norm > 0 and the norm exceeds it, every gradient is scaled in place by
/// max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_ does. Returns the norm before
/// clipping (NaN or infinity when a gradient is not finite; nothing is scaled then).
double clip_grad_norm(std::span<const torch::Tensor> grads, double max_norm);

/// AdamW hyper-parameters (the learning rate comes per step, from the schedule).
struct adamw_options {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0; ///< decoupled; applied to parameters of two or more dimensions only
  /// ZeRO-1: the moments and float32 masters live in data_parallel's shards, not here: none are
  /// allocated, and step(), moments() and restore() are not available (gradients still are).
  bool sharded = false;
};

/// The AdamW update of one float32 weight tensor `w` with gradient `g` and moments `m`, `v` in
/// place, at learning rate `lr` and step `t` (from 1), decoupled decay on `w` when `decay`. The
/// arithmetic of adamw::step, shared with ZeRO-1's shard update so that both give the same bits.
void adamw_update(torch::Tensor& w, const torch::Tensor& g, torch::Tensor& m, torch::Tensor& v, double lr,
                  std::int64_t t, const adamw_options& options, bool decay);

/// AdamW exactly as PyTorch's torch.optim.AdamW (amsgrad off), per parameter p with gradient g
/// at step t (from 1):
///   p <- p * (1 - lr * weight_decay)
///   m <- beta1 * m + (1 - beta1) * g;   v <- beta2 * v + (1 - beta2) * g^2
///   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
/// computed in float32 on master copies when a parameter is not float32 (bf16 models), which are
/// then rounded into the parameter. Gradients are accumulated in float32 too (see
/// accumulate_gradients). Owns its state; shares the parameters with the model. Not
/// thread-safe; non-copyable.
class adamw final {
public:
  /// `params` in the order every rank must agree on (bucketing and all-reduce rely on it).
  adamw(std::vector<named_parameter> params, adamw_options options);
  adamw(const adamw&) = delete;
  adamw& operator=(const adamw&) = delete;

  /// The parameters, in their stable order.
  const std::vector<named_parameter>& parameters() const noexcept { return params_; }

  /// Adds the parameters' .grad into the float32 gradients and clears .grad, for parameters that
  /// are not float32 (their .grad would accumulate micro-batches in bf16). Call after each
  /// backward. Float32 parameters accumulate in .grad directly (which is the float32 gradient).
  void accumulate_gradients();
  /// accumulate_gradients() for parameter i alone: its .grad of a backward not yet accumulated
  /// goes into its float32 gradient (added in float32: float32 += bf16 promotes exactly). The
  /// data-parallel hooks call it as each gradient completes, on autograd's thread.
  void accumulate_gradient(std::size_t i);
  /// The float32 gradient of every parameter, in parameters() order (zeros where no gradient
  /// arrived). The tensors are the optimiser's own: an all-reduce may overwrite them in place.
  std::vector<torch::Tensor> gradients();
  /// Makes `storage` (float32, parameter i's element count, contiguous; a view into a
  /// data-parallel bucket) parameter i's float32 gradient from now on: the gradient so far is
  /// added into it (callers pass zeros) and the optimiser's own buffer for it is released, so that
  /// one float32 copy of the gradient exists. A float32 parameter's .grad becomes that tensor
  /// (shaped as the parameter), into which autograd then accumulates in place, as PyTorch DDP's
  /// gradient_as_bucket_view does; zero_grad() zeroes it in place. The optimiser shares the
  /// storage (it stays alive while the optimiser uses it).
  void place_gradient(std::size_t i, const torch::Tensor& storage);
  /// Zeroes every gradient.
  void zero_grad();

  /// One update at learning rate `lr` from gradients(); increments steps().
  void step(double lr);
  /// Updates done so far (t of the last update).
  std::int64_t steps() const noexcept { return steps_; }
  /// Counts an update applied elsewhere (ZeRO-1's shards).
  void count_step() noexcept { ++steps_; }
  /// Sets the step count (restoring a ZeRO-1 checkpoint, whose state is data_parallel's).
  void set_steps(std::int64_t steps) noexcept { steps_ = steps; }
  /// Zeroes the moments (this rank's; ZeRO-1's shards are data_parallel's) and restarts their
  /// bias correction: the next update is the first of fresh moments, while steps() (the
  /// schedule's position) goes on. A new training stage starts so (learner::reset_moments).
  void reset_moments();
  /// steps() at the last reset_moments() (0: never); updates since then are the moments' t.
  std::int64_t moments_since() const noexcept { return moments_since_; }
  /// Restores moments_since() from a checkpoint.
  void set_moments_since(std::int64_t steps) noexcept { moments_since_ = steps; }
  /// True when the state is sharded over data-parallel ranks (adamw_options::sharded).
  bool sharded() const noexcept { return options_.sharded; }
  /// Copies the parameters into the float32 masters (after the parameters were overwritten, e.g.
  /// by rank 0's broadcast).
  void sync_masters();

  /// The float32 weights the optimiser updates: the parameter itself when it is float32, its
  /// master copy otherwise. Same order as parameters().
  const std::vector<torch::Tensor>& masters() const noexcept { return masters_; }
  /// True when parameter i has a master copy separate from the model's tensor.
  bool has_master_copy(std::size_t i) const { return masters_[i].data_ptr() != params_[i].param.data_ptr(); }

  /// The first and second moments, named "exp_avg.NAME" and "exp_avg_sq.NAME".
  std::vector<std::pair<std::string, torch::Tensor>> moments() const;
  /// Restores moments (from moments()' names), masters (when given: "master.NAME", which also
  /// rewrite the parameters) and the step count. Every name and shape is checked before anything
  /// changes: errc::corrupt naming the tensor, `origin` naming the file.
  result<void> restore(const std::map<std::string, torch::Tensor>& tensors, std::int64_t steps, bool with_masters,
                       const std::string& origin);
  /// The checks of restore() alone: nothing changes.
  result<void> check_state(const std::map<std::string, torch::Tensor>& tensors, bool with_masters,
                           const std::string& origin) const;

private:
  std::vector<named_parameter> params_;
  adamw_options options_;
  std::vector<torch::Tensor> masters_, exp_avg_, exp_avg_sq_;
  // Each parameter's float32 accumulated gradient: the optimiser's buffer for a parameter that is
  // not float32, placed storage after place_gradients(), undefined for a float32 parameter whose
  // .grad (autograd's own tensor) is the accumulation. `in_grad_[i]`: the parameter's .grad is
  // grads_[i] itself (float32 parameters with placed storage).
  std::vector<torch::Tensor> grads_;
  std::vector<bool> in_grad_;
  std::vector<bool> decays_;
  std::int64_t steps_ = 0;
  std::int64_t moments_since_ = 0;
};

} // namespace crucible::policy
