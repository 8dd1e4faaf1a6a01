// policy/training/learner.cpp: GRPO/SFT updates: token ids -> padded micro-batches -> forward,
// loss, backward -> gradient hook -> clip -> AdamW -> version + 1.
#include "policy/training/learner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "core/sha256.hpp"

namespace crucible::policy {

namespace {

std::string num(std::size_t v) { return std::to_string(v); }

// SHA-256 over names and bytes of the parameters that do not train.
std::string digest_frozen(CausalLMImpl& model) {
  crucible::sha256 h;
  bool any = false;
  for (const auto& item : model.named_parameters(true)) {
    if (item.value().requires_grad())
      continue;
    any = true;
    auto host = item.value().detach().to(torch::kCPU).contiguous();
    h.update(item.key());
    h.update(host.data_ptr(), host.nbytes());
  }
  if (!any)
    return {};
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (auto b : h.finish()) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

} // namespace

std::vector<std::vector<std::size_t>> plan_micro_batches(std::span<const std::int64_t> lengths, std::int64_t budget) {
  std::vector<std::size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  // Longest first (stable: equal lengths keep their order), so each micro-batch's first row
  // fixes its padded width and the rows after it are no longer.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<std::size_t>> out;
  std::int64_t width = 0;
  for (auto i : order) {
    if (!out.empty() && static_cast<std::int64_t>(out.back().size() + 1) * width <= budget) {
      out.back().push_back(i);
      continue;
    }
    out.push_back({i});
    width = lengths[i];
  }
  return out;
}

// One sequence: prompt + completion, with what its loss needs.
struct learner::row {
  std::vector<std::int64_t> tokens;  // prompt then completion
  std::int64_t prompt = 0;           // prompt tokens
  std::int64_t completion = 0;       // completion tokens
  const std::vector<float>* behaviour = nullptr;
  double advantage = 0.0;
  // Forward inputs are tokens[0, n-1), targets tokens[1, n): n - 1 positions, the completion's
  // targets at positions [prompt - 1, prompt - 1 + completion).
  std::int64_t length() const { return static_cast<std::int64_t>(tokens.size()) - 1; }
};

// Padded tensors of some rows, on the learner's device.
struct learner::micro_batch {
  token_batch inputs;
  torch::Tensor targets;     // [b, T] int64, -1 outside completions
  torch::Tensor mask;        // [b, T] bool, the completion targets
  torch::Tensor advantages;  // [b] float32
  torch::Tensor behaviour;   // [b, T] float32 (GRPO)
  torch::Tensor old_log_probs, ref_log_probs;
};

learner::learner(CausalLM policy, CausalLM reference, const learner_options& options, std::uint64_t version)
  : policy_(std::move(policy)), reference_(std::move(reference)), options_(options), version_(version) {}

result<std::unique_ptr<learner>> learner::create(CausalLM policy, CausalLM reference, const learner_options& options,
                                                 std::uint64_t seed, std::uint64_t version) {
  if (!policy)
    return fail(errc::invalid_arg, "learner: no policy model");
  if (options.dtype != "float32" && options.dtype != "bfloat16")
    return fail(errc::config, "learner.dtype: expected float32 or bfloat16, got \"", options.dtype, "\"");
  if (options.micro_batch_tokens <= 0)
    return fail(errc::config, "learner.micro_batch_tokens: must be positive");
  if (!(options.bucket_mb > 0))
    return fail(errc::config, "learner.bucket_mb: must be positive");
  if (!(options.collective_timeout_s > 0))
    return fail(errc::config, "learner.collective_timeout_s: must be positive");
  if (options.kl_coef > 0 && !reference)
    return fail(errc::config, "learner.kl_coef: ", std::to_string(options.kl_coef),
                " > 0 needs a reference model, and none was given");
  if (options.lora) {
    if (options.lora_rank <= 0)
      return fail(errc::config, "learner.lora_rank: must be positive, got ", std::to_string(options.lora_rank));
    if (options.lora_targets.empty())
      return fail(errc::config, "learner.lora_targets: empty");
    static const std::set<std::string> known{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    for (const auto& t : options.lora_targets)
      if (known.count(t) == 0)
        return fail(errc::config, "learner.lora_targets: '", t,
                    "' is not a projection (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  }
  if (policy->parameters().empty())
    return fail(errc::invalid_arg, "learner: the policy has no parameters");
  auto dtype = *parse_torch_dtype(options.dtype);
  const auto device = policy->parameters().front().device();
  policy->to(device, dtype);
  if (options.lora) {
    lora_options lo;
    lo.rank = options.lora_rank;
    lo.alpha = options.lora_alpha;
    lo.targets = options.lora_targets;
    lo.seed = seed;
    if (auto r = policy->add_lora(lo); !r)
      return fail(r.error().code, "learner.", r.error().message);
  }
  // Only the policy's training forward checkpoints: the old and reference log-probs run without grad.
  policy->set_activation_checkpointing(options.activation_checkpointing);
  std::vector<named_parameter> trainable;
  for (auto& item : policy->named_parameters(true))
    if (item.value().requires_grad())
      trainable.push_back({item.key(), item.value()});
  if (trainable.empty())
    return fail(errc::invalid_arg, "learner: no trainable parameters");
  if (reference) {
    for (auto& p : reference->parameters())
      p.set_requires_grad(false);
    reference->eval();
  }
  std::unique_ptr<learner> l(new learner(std::move(policy), std::move(reference), options, version));
  l->device_ = device;
  l->optimizer_ = std::make_unique<adamw>(
    std::move(trainable), adamw_options{options.beta1, options.beta2, options.eps, options.weight_decay, options.zero1});
  l->frozen_digest_ = digest_frozen(*l->policy_);
  return l;
}

learner::micro_batch learner::build(const std::vector<row>& rows, std::span<const std::size_t> index) const {
  const auto b = static_cast<std::int64_t>(index.size());
  std::int64_t width = 0;
  for (auto i : index)
    width = std::max(width, rows[i].length());
  auto ids = torch::zeros({b, width}, torch::kLong);
  auto attention = torch::zeros({b, width}, torch::kLong);
  auto targets = torch::full({b, width}, -1, torch::kLong);
  auto mask = torch::zeros({b, width}, torch::kBool);
  auto behaviour = torch::zeros({b, width}, torch::kFloat);
  auto adv = torch::zeros({b}, torch::kFloat);
  auto ids_a = ids.accessor<std::int64_t, 2>();
  auto att_a = attention.accessor<std::int64_t, 2>();
  auto tgt_a = targets.accessor<std::int64_t, 2>();
  auto mask_a = mask.accessor<bool, 2>();
  auto beh_a = behaviour.accessor<float, 2>();
  auto adv_a = adv.accessor<float, 1>();
  for (std::int64_t r = 0; r < b; ++r) {
    const auto& row = rows[index[r]];
    for (std::int64_t t = 0; t < row.length(); ++t) {
      ids_a[r][t] = row.tokens[t];
      att_a[r][t] = 1;
    }
    for (std::int64_t c = 0; c < row.completion; ++c) {
      const auto t = row.prompt - 1 + c;
      tgt_a[r][t] = row.tokens[t + 1];
      mask_a[r][t] = true;
      if (row.behaviour != nullptr)
        beh_a[r][t] = (*row.behaviour)[c];
    }
    adv_a[r] = static_cast<float>(row.advantage);
  }
  micro_batch mb;
  mb.inputs.input_ids = ids.to(device_);
  mb.inputs.attention_mask = attention.to(device_);
  mb.targets = targets.to(device_);
  mb.mask = mask.to(device_);
  mb.behaviour = behaviour.to(device_);
  mb.advantages = adv.to(device_);
  return mb;
}

result<void> learner::join_data_parallel(std::shared_ptr<communicator> comm) {
  if (dp_)
    return fail(errc::invalid_arg, "join_data_parallel: the learner is in a data-parallel group already");
  if (options_.zero1 && hook_)
    return fail(errc::invalid_arg, "join_data_parallel: learner.zero1 leaves no rank the whole gradient for a hook");
  data_parallel_options o;
  o.bucket_bytes = static_cast<std::int64_t>(options_.bucket_mb * 1024.0 * 1024.0);
  o.overlap = options_.overlap;
  o.zero1 = options_.zero1;
  auto dp = data_parallel::create(std::move(comm), *optimizer_, o, frozen_digest_);
  if (!dp)
    return dp.error();
  dp_ = std::move(*dp);
  return {};
}

crucible::error learner::refuse_batch(crucible::error e) {
  if (dp_) {
    // The shape of the first reduction of grpo_step and of update: {.., .., .., refused}.
    double first[4] = {0, 0, 0, 1};
    (void) dp_->all_reduce(first, reduce_op::sum);
  }
  return e;
}

namespace {
crucible::error refused_elsewhere(const char* what, double ranks) {
  return fail(errc::invalid_arg, what, ": ", std::to_string(static_cast<long long>(ranks)),
              " other data-parallel rank(s) refused their batch; no update");
}
} // namespace

result<step_metrics> learner::grpo_step(const grpo_batch& batch) {
  if (batch.groups.empty())
    return refuse_batch(fail(errc::invalid_arg, "grpo_step: the batch has no groups"));
  if (!(batch.temperature > 0))
    return refuse_batch(fail(errc::invalid_arg, "grpo_step: temperature must be positive"));
  std::vector<double> rewards;
  bool on_policy = true;
  for (std::size_t g = 0; g < batch.groups.size(); ++g) {
    const auto& group = batch.groups[g];
    if (group.prompt.empty())
      return refuse_batch(fail(errc::invalid_arg, "grpo_step: group ", num(g), " has an empty prompt"));
    if (group.samples.empty())
      return refuse_batch(fail(errc::invalid_arg, "grpo_step: group ", num(g), " has no samples"));
    for (std::size_t s = 0; s < group.samples.size(); ++s) {
      const auto& sample = group.samples[s];
      if (sample.behaviour_log_probs.size() != sample.completion.size())
        return refuse_batch(fail(errc::invalid_arg, "grpo_step: group ", num(g), " sample ", num(s), " has ",
                                 num(sample.behaviour_log_probs.size()), " behaviour log-probs for ",
                                 num(sample.completion.size()), " completion tokens"));
      if (std::isinf(sample.advantage))
        return refuse_batch(fail(errc::invalid_arg, "grpo_step: group ", num(g), " sample ", num(s),
                                 " has an infinite advantage"));
      rewards.push_back(sample.reward);
    }
    on_policy = on_policy && group.policy_version == version_;
  }
  // Reward transform over the whole batch (every rank's, in a data-parallel group), then
  // advantages within each group.
  double reward_sum = std::accumulate(rewards.begin(), rewards.end(), 0.0);
  double reward_count = static_cast<double>(rewards.size());
  std::vector<double> shaped;
  if (!dp_) {
    shaped = transform_rewards(rewards, options_.rewards, options_.reward_clip);
  } else {
    double first[4] = {reward_count, reward_sum, on_policy ? 0.0 : 1.0, 0.0};
    if (auto r = dp_->all_reduce(first, reduce_op::sum); !r)
      return r.error();
    if (first[3] > 0)
      return refused_elsewhere("grpo_step", first[3]);
    reward_count = first[0];
    reward_sum = first[1];
    on_policy = first[2] == 0;
    const double mean = reward_sum / reward_count;
    double sd = 0;
    bool all_equal = true;
    if (options_.rewards != reward_transform::none) {
      double dev[1] = {0};
      for (double r : rewards)
        dev[0] += (r - mean) * (r - mean);
      double range[2] = {-std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
      for (double r : rewards)
        range[0] = std::max(range[0], r), range[1] = std::max(range[1], -r);
      if (auto r = dp_->all_reduce(dev, reduce_op::sum); !r)
        return r.error();
      if (auto r = dp_->all_reduce(range, reduce_op::max); !r)
        return r.error();
      sd = std::sqrt(dev[0] / reward_count);
      all_equal = range[0] == -range[1];
    }
    shaped = transform_rewards(rewards, options_.rewards, options_.reward_clip, mean, sd, all_equal);
  }
  std::vector<row> rows;
  rows.reserve(rewards.size());
  std::size_t k = 0;
  for (const auto& group : batch.groups) {
    const std::span<const double> group_rewards(shaped.data() + k, group.samples.size());
    const auto adv = group_advantages(group_rewards, options_.std_normalize, options_.std_eps);
    for (std::size_t s = 0; s < group.samples.size(); ++s, ++k) {
      const auto& sample = group.samples[s];
      row r;
      r.tokens.assign(group.prompt.begin(), group.prompt.end());
      r.tokens.insert(r.tokens.end(), sample.completion.begin(), sample.completion.end());
      r.prompt = static_cast<std::int64_t>(group.prompt.size());
      r.completion = static_cast<std::int64_t>(sample.completion.size());
      r.behaviour = &sample.behaviour_log_probs;
      const double a = std::isnan(sample.advantage) ? adv[s] : sample.advantage;
      r.advantage = a < 0 ? a * options_.negative_weight : a;
      rows.push_back(std::move(r));
    }
  }
  if (reference_ && sft_until_ > reference_since_) {
    // RL after SFT: the KL reference becomes the policy as RL starts. Every data-parallel rank
    // holds the same parameters, so every rank takes the same copy.
    if (options_.lora)
      return refuse_batch(fail(errc::config, "learner.kl_coef: with learner.lora the KL reference cannot be taken "
                                             "from the policy after SFT updates (the adapters are not merged into it)"));
    torch::NoGradGuard no_grad;
    auto from = policy_->named_parameters(true);
    for (auto& item : reference_->named_parameters(true)) {
      const auto* p = from.find(item.key());
      if (p == nullptr)
        return refuse_batch(fail(errc::invalid_arg, "grpo_step: the KL reference's parameter ", item.key(),
                                 " is not in the policy"));
      item.value().copy_(*p);
    }
    reference_since_ = steps();
  }
  const bool recompute = options_.old_log_probs == old_log_probs_source::recompute ||
                         (options_.old_log_probs == old_log_probs_source::automatic && !on_policy);
  auto m = update(rows, /*grpo=*/true, batch.temperature, recompute);
  if (m)
    m->reward_mean = reward_sum / reward_count;
  return m;
}

result<step_metrics> learner::sft_step(std::span<const sft_example> examples) {
  if (examples.empty())
    return refuse_batch(fail(errc::invalid_arg, "sft_step: no examples"));
  std::vector<row> rows;
  for (std::size_t i = 0; i < examples.size(); ++i) {
    const auto& e = examples[i];
    if (e.prompt.empty())
      return refuse_batch(fail(errc::invalid_arg, "sft_step: example ", num(i), " has an empty prompt"));
    row r;
    r.tokens.assign(e.prompt.begin(), e.prompt.end());
    r.tokens.insert(r.tokens.end(), e.completion.begin(), e.completion.end());
    r.prompt = static_cast<std::int64_t>(e.prompt.size());
    r.completion = static_cast<std::int64_t>(e.completion.size());
    rows.push_back(std::move(r));
  }
  auto m = update(rows, /*grpo=*/false, 1.0, false);
  if (m)
    sft_until_ = steps();
  return m;
}

result<step_metrics> learner::update(std::vector<row>& rows, bool grpo, double temperature, bool recompute_old) {
  const auto start = std::chrono::steady_clock::now();
  step_metrics out;
  out.recomputed_old = grpo && recompute_old;

  // Whole-batch totals fix each token's weight, so micro-batch losses add up to the batch loss.
  batch_totals totals;
  std::vector<std::int64_t> lengths;
  std::vector<std::size_t> trained; // rows with anything to forward
  // A GRPO row whose advantage is 0 adds 0 to the loss and to every gradient (its surrogate is
  // ratio x 0), unless a KL term pulls it towards the reference: it is counted in the totals,
  // which fix every token's weight, but neither forwarded nor backpropagated. Groups whose
  // samples all scored alike, and with learner.negative_weight 0 the samples below their
  // group's mean, cost no compute; the gradient is the one the whole batch gives.
  const bool skip_zero = grpo && options_.kl_coef == 0.0;
  std::int64_t zero_advantage = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    totals.tokens += r.completion;
    totals.sequences += 1;
    totals.nonempty_sequences += r.completion > 0;
    totals.longest = std::max(totals.longest, r.completion);
    if (skip_zero && r.advantage == 0.0) {
      ++zero_advantage;
      continue;
    }
    if (r.completion > 0) {
      lengths.push_back(r.length());
      trained.push_back(i);
    }
  }
  const char* what = grpo ? "grpo_step" : "sft_step";
  if (options_.zero1 && !dp_)
    return fail(errc::config, what, ": learner.zero1 needs a data-parallel group (join_data_parallel)");
  if (hook_ && dp_ && dp_->sharded())
    return fail(errc::invalid_arg, what, ": learner.zero1 leaves no rank the whole gradient for a hook");
  if (dp_) {
    // Every rank weighs its tokens by the global batch's totals, so that the sum of the ranks'
    // gradients is the global batch's gradient. Under grpo_step the first reduction (with the
    // refusals) came before; sft_step's is this one.
    double sums[4] = {static_cast<double>(totals.tokens), static_cast<double>(totals.sequences),
                      static_cast<double>(totals.nonempty_sequences), 0.0};
    double longest[1] = {static_cast<double>(totals.longest)};
    if (auto r = dp_->all_reduce(sums, reduce_op::sum); !r)
      return r.error();
    if (sums[3] > 0)
      return refused_elsewhere(what, sums[3]);
    if (auto r = dp_->all_reduce(longest, reduce_op::max); !r)
      return r.error();
    totals.tokens = static_cast<std::int64_t>(sums[0]);
    totals.sequences = static_cast<std::int64_t>(sums[1]);
    totals.nonempty_sequences = static_cast<std::int64_t>(sums[2]);
    totals.longest = static_cast<std::int64_t>(longest[0]);
  }
  if (totals.tokens == 0)
    return fail(errc::invalid_arg, what, ": the batch has no completion tokens");
  auto plan = plan_micro_batches(lengths, options_.micro_batch_tokens);
  std::vector<micro_batch> mbs;
  for (auto& p : plan) {
    for (auto& i : p)
      i = trained[i];
    mbs.push_back(build(rows, p));
  }

  if (grpo) {
    torch::NoGradGuard no_grad;
    for (auto& mb : mbs) {
      mb.old_log_probs = recompute_old ? policy_->token_log_probs(mb.inputs, mb.targets, temperature) : mb.behaviour;
      if (options_.kl_coef > 0)
        mb.ref_log_probs = reference_->token_log_probs(mb.inputs, mb.targets, temperature);
    }
  }

  const grpo_loss_options lo{options_.clip_low, options_.clip_high, options_.aggregation, options_.constant_tokens,
                             options_.kl_coef, options_.kl, options_.is_cap};
  loss_stats stats;
  double loss = 0.0;
  optimizer_->zero_grad();
  for (std::size_t k = 0; k < mbs.size(); ++k) {
    auto& mb = mbs[k];
    auto logp = policy_->token_log_probs(mb.inputs, mb.targets, temperature);
    loss_result r;
    if (grpo) {
      grpo_inputs in;
      in.log_probs = logp;
      in.old_log_probs = mb.old_log_probs;
      in.behaviour_log_probs = mb.behaviour;
      in.ref_log_probs = mb.ref_log_probs;
      in.advantages = mb.advantages;
      in.mask = mb.mask;
      r = grpo_loss(in, lo, &totals);
    } else {
      r = sft_loss(logp, mb.mask, &totals);
    }
    if (dp_)
      dp_->begin_backward(k + 1 == mbs.size());
    r.loss.backward();
    optimizer_->accumulate_gradients();
    loss += r.loss.item<double>();
    stats += r.stats;
  }

  if (dp_) {
    // The optimiser's gradients are views into the buckets: reduced in place.
    if (auto r = dp_->reduce_gradients(); !r) {
      optimizer_->zero_grad();
      return r.error();
    }
    // The metrics of the global batch: every rank reports the same.
    double m[9] = {loss,
                   stats.tokens,
                   stats.clipped,
                   stats.ratio_sum,
                   stats.kl_sum,
                   stats.is_weight_sum,
                   stats.is_capped,
                   stats.nll_sum,
                   static_cast<double>(zero_advantage)};
    if (auto r = dp_->all_reduce(m, reduce_op::sum); !r) {
      optimizer_->zero_grad();
      return r.error();
    }
    loss = m[0];
    stats = loss_stats{m[1], m[2], m[3], m[4], m[5], m[6], m[7]};
    zero_advantage = static_cast<std::int64_t>(m[8]);
  }
  auto grads = optimizer_->gradients();
  if (hook_) {
    if (auto h = hook_(optimizer_->parameters(), grads); !h) {
      optimizer_->zero_grad();
      return h.error();
    }
  }
  out.lr = scheduled_lr(options_, optimizer_->steps() + 1);
  if (dp_ && dp_->sharded()) {
    const adamw_options ao{options_.beta1, options_.beta2, options_.eps, options_.weight_decay, true};
    auto norm = dp_->sharded_step(options_.grad_clip, out.lr, ao);
    if (!norm) {
      optimizer_->zero_grad();
      return norm.error();
    }
    out.grad_norm = *norm;
    if (std::isfinite(out.grad_norm))
      ++version_;
    else
      out.skipped = true;
  } else {
    out.grad_norm = clip_grad_norm(grads, options_.grad_clip);
    if (std::isfinite(out.grad_norm)) {
      optimizer_->step(out.lr);
      ++version_;
    } else {
      out.skipped = true;
    }
  }
  optimizer_->zero_grad();

  out.loss = loss;
  out.tokens = totals.tokens;
  out.sequences = totals.sequences;
  out.zero_advantage = zero_advantage;
  out.micro_batches = static_cast<std::int64_t>(mbs.size());
  out.clip_fraction = stats.clip_fraction();
  out.kl = stats.kl_mean();
  out.ratio_mean = stats.ratio_mean();
  out.is_weight_mean = stats.is_weight_mean();
  out.nll = stats.nll_mean();
  out.version = version_;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

void learner::reset_moments() {
  optimizer_->reset_moments();
  if (dp_ && optimizer_->sharded())
    dp_->reset_moment_shards();
}

} // namespace crucible::policy
