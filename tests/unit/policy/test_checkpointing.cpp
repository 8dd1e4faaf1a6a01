// Activation checkpointing of the training forward (CausalLMImpl::set_activation_checkpointing)
// on CPU: bit for bit the plain forward's log-probs and parameter gradients, for padded and
// packed batches, LoRA (only adapters get gradients, the first layer's included), tied
// embeddings and accumulation over two backward passes; the graph keeps one node per layer;
// inference is untouched.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>

#include <torch/torch.h>

#include "policy/model/model.hpp"
#include "policy_test_util.hpp"

using namespace crucible;
using namespace crucible::policy;
using namespace crucible::policy::testing;

namespace {

CausalLM small_model(bool tied, bool bias, std::uint64_t seed, std::int64_t layers = 3) {
  auto c = preset_config("tiny", model_family::qwen2, 300);
  REQUIRE(c.ok());
  c->hidden_size = 64, c->num_heads = 4, c->num_kv_heads = 2, c->head_dim = 16, c->num_layers = layers;
  c->intermediate_size = 128;
  c->tie_word_embeddings = tied;
  c->qkv_bias = bias;
  auto m = scaled_random_model(*c, seed, 2.0);
  m->train();
  return m;
}

struct pass {
  torch::Tensor log_probs;
  std::map<std::string, torch::Tensor> grads; // undefined: the parameter got no .grad
};

// token_log_probs of `batch`, a weighted sum of them backpropagated, every parameter's .grad.
pass run(CausalLMImpl& m, const token_batch& batch, const torch::Tensor& targets, bool checkpoint,
         double temperature = 1.0) {
  for (auto& p : m.parameters())
    p.mutable_grad() = torch::Tensor{};
  m.set_activation_checkpointing(checkpoint);
  auto lp = m.token_log_probs(batch, targets, temperature, /*chunk_tokens=*/7);
  auto weights = torch::linspace(-1.0, 2.0, lp.numel()).view(lp.sizes());
  (lp * weights).sum().backward();
  pass out{lp.detach().clone(), {}};
  for (const auto& item : m.named_parameters(true))
    out.grads[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : torch::Tensor{};
  m.set_activation_checkpointing(false);
  return out;
}

// Checkpointed and plain passes agree bit for bit: log-probs, and each parameter's gradient
// (present for the same parameters). On the CPU both run the same kernels on the same inputs in
// the same order (the forward, its recomputation, and the sums of each tensor's gradient), so
// nothing is left to rounding; the distance is reported besides, should that ever change.
void check_same(const pass& plain, const pass& ckpt) {
  CHECK(torch::equal(ckpt.log_probs, plain.log_probs));
  REQUIRE(plain.grads.size() == ckpt.grads.size());
  double worst = 0;
  for (const auto& [name, g] : plain.grads) {
    CAPTURE(name);
    const auto& h = ckpt.grads.at(name);
    REQUIRE(g.defined() == h.defined());
    if (!g.defined())
      continue;
    worst = std::max(worst, max_abs_diff(h, g) / (1.0 + g.abs().max().item<double>()));
    CHECK(torch::equal(h, g));
  }
  MESSAGE("max |gradient difference| relative to the largest entry: ", worst);
}

// Autograd nodes reachable from `t`, by name.
std::multiset<std::string> graph_nodes(const torch::Tensor& t) {
  std::multiset<std::string> out;
  std::set<const torch::autograd::Node*> seen;
  std::function<void(const std::shared_ptr<torch::autograd::Node>&)> walk = [&](const auto& n) {
    if (!n || !seen.insert(n.get()).second)
      return;
    out.insert(n->name());
    for (const auto& e : n->next_edges())
      walk(e.function);
  };
  walk(t.grad_fn());
  return out;
}

std::size_t count_containing(const std::multiset<std::string>& names, const std::string& part) {
  std::size_t n = 0;
  for (const auto& s : names)
    n += s.find(part) != std::string::npos;
  return n;
}

} // namespace

TEST_CASE("activation checkpointing: padded batches (left and right) get the same log-probs and gradients") {
  torch::manual_seed(7);
  auto m = small_model(/*tied=*/false, /*bias=*/true, 3);
  for (bool left : {true, false}) {
    CAPTURE(left);
    const std::int64_t t = 11;
    const std::int64_t lens[] = {11, 4, 8};
    auto input = torch::zeros({3, t}, torch::kLong);
    auto mask = torch::zeros({3, t}, torch::kLong);
    auto targets = torch::full({3, t}, -1, torch::kLong);
    for (int i = 0; i < 3; ++i) {
      const auto n = lens[i], start = left ? t - n : 0;
      input[i].narrow(0, start, n).copy_(torch::randint(1, 300, {n}));
      mask[i].narrow(0, start, n).fill_(1);
      targets[i].narrow(0, start, n - 1).copy_(torch::randint(0, 300, {n - 1}));
    }
    token_batch b{input, mask, {}, {}};
    for (double temperature : {1.0, 0.7}) {
      CAPTURE(temperature);
      auto plain = run(*m, b, targets, false, temperature);
      auto ckpt = run(*m, b, targets, true, temperature);
      check_same(plain, ckpt);
      for (const auto& [name, g] : plain.grads)
        CHECK_MESSAGE(g.defined(), name); // full fine-tuning: every parameter trains
    }
  }
}

TEST_CASE("activation checkpointing: a packed batch with padding gets the same log-probs and gradients") {
  torch::manual_seed(8);
  auto m = small_model(false, true, 4);
  auto row1 = torch::randint(1, 300, {12});
  auto seq1 = torch::cat({torch::full({4}, 0L), torch::full({6}, 1L), torch::full({2}, 2L)});
  auto row2 = torch::cat({torch::randint(1, 300, {10}), torch::zeros({2}, torch::kLong)});
  auto seq2 = torch::cat({torch::full({7}, 0L), torch::full({3}, 1L), torch::full({2}, 2L)});
  auto mask2 = torch::cat({torch::ones({10}, torch::kLong), torch::zeros({2}, torch::kLong)});
  token_batch b{torch::stack({row1, row2}), torch::stack({torch::ones({12}, torch::kLong), mask2}),
                torch::stack({seq1, seq2}), {}};
  auto targets = torch::randint(0, 300, {2, 12});
  targets[1].narrow(0, 10, 2).fill_(-1);
  check_same(run(*m, b, targets, false), run(*m, b, targets, true));
}

TEST_CASE("activation checkpointing: a tied-embedding model gets the same gradients, the shared matrix's included") {
  torch::manual_seed(9);
  auto m = small_model(/*tied=*/true, false, 5);
  auto input = torch::randint(1, 300, {2, 9});
  auto targets = torch::randint(0, 300, {2, 9});
  token_batch b{input, {}, {}, {}};
  auto plain = run(*m, b, targets, false);
  auto ckpt = run(*m, b, targets, true);
  check_same(plain, ckpt);
  CHECK_FALSE(plain.grads.contains("lm_head.weight"));
  REQUIRE(ckpt.grads.at("model.embed_tokens.weight").defined());
}

TEST_CASE("activation checkpointing with LoRA: only adapters get gradients, every layer's, the same as without") {
  torch::manual_seed(10);
  // Adapters on q/k/v: the first layer's input (frozen embeddings) does not require grad, yet its
  // adapters must train. Adapters only after attention: nothing before o_proj requires grad.
  using names = std::vector<std::string>;
  for (const names& targets_of_lora : {names{"q_proj", "k_proj", "v_proj", "o_proj"}, names{"o_proj", "down_proj"}}) {
    CAPTURE(targets_of_lora.front());
    auto m = small_model(false, true, 6);
    lora_options lo;
    lo.rank = 4;
    lo.alpha = 8;
    lo.targets = targets_of_lora;
    REQUIRE(m->add_lora(lo).ok());
    {
      torch::NoGradGuard g;
      for (auto& p : m->trainable_parameters())
        p.normal_(0.0, 0.3); // B != 0: A's gradients are not zero either
    }
    auto input = torch::randint(1, 300, {2, 10});
    auto mask = torch::ones({2, 10}, torch::kLong);
    mask[1].narrow(0, 0, 3).fill_(0); // left padding: the masked attention path
    auto targets = torch::randint(0, 300, {2, 10});
    token_batch b{input, mask, {}, {}};
    auto plain = run(*m, b, targets, false);
    auto ckpt = run(*m, b, targets, true);
    check_same(plain, ckpt);
    std::size_t adapters = 0;
    for (const auto& [name, g] : ckpt.grads) {
      CAPTURE(name);
      const bool adapter = name.find(".lora_") != std::string::npos;
      CHECK(g.defined() == adapter); // frozen base weights get no .grad
      if (adapter) {
        ++adapters;
        CHECK(g.abs().max().item<double>() > 0);
      }
    }
    CHECK(adapters == 2 * targets_of_lora.size() * 3); // A and B of each target in all three layers
  }
}

TEST_CASE("activation checkpointing: the graph holds one node per layer instead of the layers' operations") {
  torch::manual_seed(11);
  auto m = small_model(false, true, 7, /*layers=*/4);
  token_batch b{torch::randint(1, 300, {1, 6}), {}, {}, {}};
  auto plain = graph_nodes(m->hidden_states(b));
  m->set_activation_checkpointing(true);
  CHECK(m->activation_checkpointing());
  auto ckpt = graph_nodes(m->hidden_states(b));
  CHECK(count_containing(ckpt, "checkpointed_layer_fn") == 4);
  CHECK(count_containing(plain, "checkpointed_layer_fn") == 0);
  // Left: the embedding, the final norm and the layers' parameters' accumulators.
  CHECK(count_containing(ckpt, "Mm") + count_containing(ckpt, "Addmm") == 0);
  CHECK(count_containing(plain, "Addmm") + count_containing(plain, "Mm") >= 4 * 7);
  MESSAGE("graph nodes: ", plain.size(), " plain, ", ckpt.size(), " checkpointed");
  {
    // Without grad mode (the old and reference log-probs, the engine) nothing changes.
    torch::NoGradGuard g;
    auto with = m->forward(b);
    m->set_activation_checkpointing(false);
    CHECK(torch::equal(with, m->forward(b)));
  }
}

TEST_CASE("activation checkpointing: two backward passes accumulate as without (micro-batches)") {
  torch::manual_seed(12);
  auto m = small_model(false, true, 8);
  token_batch b1{torch::randint(1, 300, {2, 7}), {}, {}, {}}, b2{torch::randint(1, 300, {3, 5}), {}, {}, {}};
  auto t1 = torch::randint(0, 300, {2, 7}), t2 = torch::randint(0, 300, {3, 5});
  auto both = [&](bool checkpoint) {
    for (auto& p : m->parameters())
      p.mutable_grad() = torch::Tensor{};
    m->set_activation_checkpointing(checkpoint);
    m->token_log_probs(b1, t1).sum().backward();
    m->token_log_probs(b2, t2).mean().backward();
    std::vector<torch::Tensor> out;
    for (auto& p : m->parameters())
      out.push_back(p.grad().clone());
    m->set_activation_checkpointing(false);
    return out;
  };
  auto plain = both(false), ckpt = both(true);
  REQUIRE(plain.size() == ckpt.size());
  for (std::size_t i = 0; i < plain.size(); ++i)
    CHECK(torch::equal(ckpt[i], plain[i]));
}
