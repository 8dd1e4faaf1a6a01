// policy/learner.cpp: GRPO/SFT updates: token ids -> padded micro-batches -> forward, loss,
// backward -> gradient hook -> clip -> AdamW -> version + 1.
#include "policy/learner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
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
    std::move(trainable), adamw_options{options.beta1, options.beta2, options.eps, options.weight_decay});
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

result<step_metrics> learner::grpo_step(const grpo_batch& batch) {
  if (batch.groups.empty())
    return fail(errc::invalid_arg, "grpo_step: the batch has no groups");
  if (!(batch.temperature > 0))
    return fail(errc::invalid_arg, "grpo_step: temperature must be positive");
  std::vector<double> rewards;
  for (std::size_t g = 0; g < batch.groups.size(); ++g) {
    const auto& group = batch.groups[g];
    if (group.prompt.empty())
      return fail(errc::invalid_arg, "grpo_step: group ", num(g), " has an empty prompt");
    if (group.samples.empty())
      return fail(errc::invalid_arg, "grpo_step: group ", num(g), " has no samples");
    for (std::size_t s = 0; s < group.samples.size(); ++s) {
      const auto& sample = group.samples[s];
      if (sample.behaviour_log_probs.size() != sample.completion.size())
        return fail(errc::invalid_arg, "grpo_step: group ", num(g), " sample ", num(s), " has ",
                    num(sample.behaviour_log_probs.size()), " behaviour log-probs for ", num(sample.completion.size()),
                    " completion tokens");
      rewards.push_back(sample.reward);
    }
  }
  // Reward transform over the whole batch, then advantages within each group.
  const auto shaped = transform_rewards(rewards, options_.rewards, options_.reward_clip);
  std::vector<row> rows;
  rows.reserve(rewards.size());
  std::size_t k = 0;
  bool on_policy = true;
  for (const auto& group : batch.groups) {
    const std::span<const double> group_rewards(shaped.data() + k, group.samples.size());
    const auto adv = group_advantages(group_rewards, options_.std_normalize, options_.std_eps);
    on_policy = on_policy && group.policy_version == version_;
    for (std::size_t s = 0; s < group.samples.size(); ++s, ++k) {
      const auto& sample = group.samples[s];
      row r;
      r.tokens.assign(group.prompt.begin(), group.prompt.end());
      r.tokens.insert(r.tokens.end(), sample.completion.begin(), sample.completion.end());
      r.prompt = static_cast<std::int64_t>(group.prompt.size());
      r.completion = static_cast<std::int64_t>(sample.completion.size());
      r.behaviour = &sample.behaviour_log_probs;
      r.advantage = adv[s];
      rows.push_back(std::move(r));
    }
  }
  const bool recompute = options_.old_log_probs == old_log_probs_source::recompute ||
                         (options_.old_log_probs == old_log_probs_source::automatic && !on_policy);
  auto m = update(rows, /*grpo=*/true, batch.temperature, recompute);
  if (m)
    m->reward_mean = std::accumulate(rewards.begin(), rewards.end(), 0.0) / static_cast<double>(rewards.size());
  return m;
}

result<step_metrics> learner::sft_step(std::span<const sft_example> examples) {
  if (examples.empty())
    return fail(errc::invalid_arg, "sft_step: no examples");
  std::vector<row> rows;
  for (std::size_t i = 0; i < examples.size(); ++i) {
    const auto& e = examples[i];
    if (e.prompt.empty())
      return fail(errc::invalid_arg, "sft_step: example ", num(i), " has an empty prompt");
    row r;
    r.tokens.assign(e.prompt.begin(), e.prompt.end());
    r.tokens.insert(r.tokens.end(), e.completion.begin(), e.completion.end());
    r.prompt = static_cast<std::int64_t>(e.prompt.size());
    r.completion = static_cast<std::int64_t>(e.completion.size());
    rows.push_back(std::move(r));
  }
  return update(rows, /*grpo=*/false, 1.0, false);
}

result<step_metrics> learner::update(std::vector<row>& rows, bool grpo, double temperature, bool recompute_old) {
  const auto start = std::chrono::steady_clock::now();
  step_metrics out;
  out.recomputed_old = grpo && recompute_old;

  // Whole-batch totals fix each token's weight, so micro-batch losses add up to the batch loss.
  batch_totals totals;
  std::vector<std::int64_t> lengths;
  std::vector<std::size_t> trained; // rows with anything to forward
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    totals.tokens += r.completion;
    totals.sequences += 1;
    totals.nonempty_sequences += r.completion > 0;
    totals.longest = std::max(totals.longest, r.completion);
    if (r.completion > 0) {
      lengths.push_back(r.length());
      trained.push_back(i);
    }
  }
  if (totals.tokens == 0)
    return fail(errc::invalid_arg, grpo ? "grpo_step" : "sft_step", ": the batch has no completion tokens");
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
  for (auto& mb : mbs) {
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
    r.loss.backward();
    optimizer_->accumulate_gradients();
    loss += r.loss.item<double>();
    stats += r.stats;
  }

  auto grads = optimizer_->gradients();
  if (hook_) {
    if (auto h = hook_(optimizer_->parameters(), grads); !h) {
      optimizer_->zero_grad();
      return h.error();
    }
  }
  out.grad_norm = clip_grad_norm(grads, options_.grad_clip);
  out.lr = scheduled_lr(options_, optimizer_->steps() + 1);
  if (std::isfinite(out.grad_norm)) {
    optimizer_->step(out.lr);
    ++version_;
  } else {
    out.skipped = true;
  }
  optimizer_->zero_grad();

  out.loss = loss;
  out.tokens = totals.tokens;
  out.sequences = totals.sequences;
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

} // namespace crucible::policy
