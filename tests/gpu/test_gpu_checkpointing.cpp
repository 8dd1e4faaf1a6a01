// Activation checkpointing of the training forward on CUDA in bfloat16: the same log-probs and
// gradients as without it (fused training kernels and LibTorch ops, full fine-tuning and LoRA),
// and a lower peak of allocated memory over a forward and backward of a long sequence (6 layers
// of hidden 1024, 4096 tokens).
#include <c10/cuda/CUDACachingAllocator.h>

#include "gpu_kernels_util.hpp"

using namespace crucible;
using namespace crucible::policy;
using namespace crucible::policy::testing;
using namespace crucible::policy::gpu_testing;

namespace {

struct gpu_pass {
  torch::Tensor log_probs;
  std::vector<std::pair<std::string, torch::Tensor>> grads; // undefined: no .grad
  std::int64_t peak_bytes = 0; // allocated at the peak of forward and backward, above what was before
};

gpu_pass run_pass(CausalLMImpl& m, const token_batch& batch, const torch::Tensor& targets, bool checkpoint) {
  for (auto& p : m.parameters())
    p.mutable_grad() = torch::Tensor{};
  m.set_activation_checkpointing(checkpoint);
  torch::cuda::synchronize();
  using c10::CachingDeviceAllocator::StatType;
  const auto agg = static_cast<std::size_t>(StatType::AGGREGATE);
  const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].current;
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  auto lp = m.token_log_probs(batch, targets);
  auto weights = torch::linspace(-1.0, 2.0, lp.numel(), lp.options()).view(lp.sizes());
  (lp * weights).sum().backward();
  torch::cuda::synchronize();
  gpu_pass out;
  out.peak_bytes = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].peak - before;
  out.log_probs = lp.detach().cpu();
  for (const auto& item : m.named_parameters(true))
    out.grads.emplace_back(item.key(), item.value().grad().defined() ? item.value().grad().cpu() : torch::Tensor{});
  m.set_activation_checkpointing(false);
  return out;
}

// The worst relative error of `b`'s gradients against `a`'s, and how many are equal bit for bit.
struct grad_difference {
  double worst = 0;
  int equal = 0, defined = 0;
};

grad_difference compare_grads(const gpu_pass& a, const gpu_pass& b) {
  REQUIRE(a.grads.size() == b.grads.size());
  grad_difference d;
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    const auto& [name, g] = a.grads[i];
    const auto& h = b.grads[i].second;
    CAPTURE(name);
    REQUIRE(g.defined() == h.defined());
    if (!g.defined())
      continue;
    ++d.defined;
    d.equal += torch::equal(g, h);
    d.worst = std::max(d.worst, relative_error(h, g));
  }
  return d;
}

// Gradients of the checkpointed pass against the plain one. The forward and its recomputation run
// the same kernels on the same inputs; what may differ is the order of atomic sums in some backward
// kernels (attention, embedding), a few bfloat16 roundings apart. The plain pass run twice (`again`)
// measures that floor on this device: the checkpointed pass may differ from the plain one by one
// bfloat16 rounding (2^-7) or twice the floor, whichever is larger.
void check_grads(const gpu_pass& plain, const gpu_pass& again, const gpu_pass& ckpt, const std::string& what) {
  CHECK(relative_error(ckpt.log_probs, plain.log_probs) <= 1e-6);
  const auto floor = compare_grads(plain, again);
  const auto d = compare_grads(plain, ckpt);
  MESSAGE(what << ": " << d.equal << " of " << d.defined << " gradients bit for bit equal, worst relative error "
               << d.worst << "; plain against plain: " << floor.equal << " equal, worst " << floor.worst);
  CHECK(d.worst <= std::max(std::ldexp(1.0, -7), 2 * floor.worst));
}

} // namespace

TEST_CASE("activation checkpointing on CUDA in bfloat16: the same log-probs and gradients as without") {
  torch::manual_seed(21);
  auto config = tiny_config(model_family::qwen2, 256, 4, 2);
  for (bool lora : {false, true}) {
    for (bool fused : {true, false}) {
      const std::string what = std::string(lora ? "LoRA" : "full") + (fused ? ", fused kernels" : ", LibTorch ops");
      CAPTURE(what);
      auto m = scaled_random_model(config, 5, 2.0);
      m->to(torch::kCUDA, torch::kBFloat16);
      m->set_fused_training(fused);
      if (lora) {
        lora_options lo;
        lo.rank = 8;
        lo.targets = {"q_proj", "v_proj", "down_proj"};
        REQUIRE(m->add_lora(lo).ok());
        torch::NoGradGuard g;
        for (auto& p : m->trainable_parameters())
          p.normal_(0.0, 0.05);
      }
      // Left padding (masked attention) in one row; a packed row with padding at its end.
      const std::int64_t t = 96;
      auto ids = torch::randint(1, 1000, {2, t}, torch::kLong);
      auto mask = torch::ones({2, t}, torch::kLong);
      mask[0].narrow(0, 0, 17).fill_(0);
      mask[1].narrow(0, t - 5, 5).fill_(0);
      auto seq = torch::zeros({2, t}, torch::kLong);
      seq[1].narrow(0, 40, t - 40).fill_(1);
      auto targets = torch::randint(0, 1000, {2, t}, torch::kLong);
      targets[0].narrow(0, 0, 17).fill_(-1);
      token_batch b{ids.cuda(), mask.cuda(), seq.cuda(), {}};
      auto plain = run_pass(*m, b, targets.cuda(), false);
      auto again = run_pass(*m, b, targets.cuda(), false);
      auto ckpt = run_pass(*m, b, targets.cuda(), true);
      check_grads(plain, again, ckpt, what);
      if (lora)
        for (const auto& [name, g] : ckpt.grads)
          CHECK_MESSAGE(g.defined() == (name.find(".lora_") != std::string::npos), name);
    }
  }
}

TEST_CASE("activation checkpointing on CUDA: a long sequence's forward and backward peak lower, same gradients") {
  torch::manual_seed(22);
  auto config = tiny_config(model_family::qwen2, 1024, 8, 2);
  config.num_layers = 6;
  config.intermediate_size = 2816;
  auto m = scaled_random_model(config, 6, 1.0);
  m->to(torch::kCUDA, torch::kBFloat16);
  const std::int64_t t = 4096;
  auto ids = torch::randint(1, 1000, {1, t}, torch::kLong).cuda();
  auto targets = torch::randint(0, 1000, {1, t}, torch::kLong).cuda();
  targets.narrow(1, 0, t / 2).fill_(-1); // a prompt: no targets
  token_batch b{ids, torch::ones_like(ids), {}, {}};
  auto again = run_pass(*m, b, targets, false); // also the warm-up: cuBLAS workspaces, kernels loaded
  auto plain = run_pass(*m, b, targets, false);
  auto ckpt = run_pass(*m, b, targets, true);
  MESSAGE("peak allocated above the model over forward and backward: " << plain.peak_bytes / 1e6 << " MB plain, "
                                                                       << ckpt.peak_bytes / 1e6 << " MB checkpointed");
  check_grads(plain, again, ckpt, "6 layers, 4096 tokens");
  // Without checkpointing each layer keeps about 128 MB here (a dozen [T, hidden] tensors, three
  // [T, intermediate] ones, in bf16): ~770 MB for six; with it one 8 MB input per layer plus one
  // layer's activations during its recomputation. Both hold the gradients (~135 MB) and the
  // backward's temporaries: about 950 MB against 360 MB expected.
  CHECK(ckpt.peak_bytes < 0.6 * plain.peak_bytes);
}
