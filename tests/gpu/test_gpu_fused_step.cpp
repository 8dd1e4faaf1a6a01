// The learner's fused kernels (policy/kernels/train_kernels.cu) and their gradients against float64
// and LibTorch; a fused decoding step against the LibTorch step on random tiny models; the engine's
// greedy tokens with and without the fused kernels; the batch-1 benchmark of the 0.5b preset.
#include "gpu_kernels_util.hpp"

using namespace crucible;
using namespace crucible::policy;
using namespace crucible::policy::testing;
using namespace crucible::policy::gpu_testing;

TEST_CASE("the learner's fused log-softmax and its gradients equal float64, per dtype, vocab and temperature") {
  torch::manual_seed(17);
  // Rows with targets -1 are left out of the output projection; a vocabulary that is not a
  // multiple of 8 takes the kernels' element-by-element path.
  for (auto dtype : all_dtypes) {
    for (auto [rows, vocab, chunk] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{300, 4096, 128},
                                      {77, 1003, 32}, {5, 151936, 4}}) {
      for (double temperature : {1.0, 0.7}) {
        const std::string what = std::string(c10::toString(dtype)) + " rows " + std::to_string(rows) + " vocab " +
                                 std::to_string(vocab) + " T " + std::to_string(temperature);
        CAPTURE(what);
        const std::int64_t hidden = 64;
        auto h = torch::randn({rows, hidden}, on_gpu(torch::kFloat)).to(dtype).requires_grad_(true);
        auto w = (0.3 * torch::randn({vocab, hidden}, on_gpu(torch::kFloat))).to(dtype).requires_grad_(true);
        auto targets = torch::randint(0, vocab, {rows}, on_gpu(torch::kLong));
        targets.narrow(0, 0, rows / 4).fill_(-1);
        auto weights = torch::rand({rows}, on_gpu(torch::kFloat));

        auto lp = chunked_target_log_probs(h, w, targets, temperature, chunk, /*fused=*/true);
        auto grads = torch::autograd::grad({(lp * weights).sum()}, {h, w});

        // float64 on the same (rounded) operands: logits as the GEMM rounds them.
        auto h64 = h.detach().to(torch::kDouble).requires_grad_(true);
        auto w64 = w.detach().to(torch::kDouble).requires_grad_(true);
        auto logits = at::linear(h64, w64) / temperature;
        auto want = torch::log_softmax(logits, -1).gather(1, targets.clamp_min(0).unsqueeze(1)).squeeze(1);
        want = want.masked_fill(targets < 0, 0.0);
        auto want_grads = torch::autograd::grad({(want * weights.to(torch::kDouble)).sum()}, {h64, w64});

        CHECK(torch::equal(lp.masked_select(targets < 0).cpu(), torch::zeros({rows / 4})));
        // Both paths take the logits as the GEMM rounds them to the dtype (unit roundoff u), so a
        // log-prob may be off by the target logit's rounding and the log-sum-exp's: 2 u max|x|.
        const double u = dtype == torch::kFloat ? 1e-6 : dtype == torch::kHalf ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
        const double max_x = logits.abs().max().item<double>();
        auto err = (lp.to(torch::kCPU, torch::kDouble) - want.to(torch::kCPU)).abs().max().item<double>();
        MESSAGE(what << ": log-prob max abs error " << err << " (max |x| " << max_x << ")");
        CHECK(err <= 2 * u * max_x + 1e-5);

        // The LibTorch path on the same operands (float32 logits and gradient, float32 weight
        // gradient GEMM): the fused path's forward equals it up to the order of float32 sums, and
        // its gradients are as close to float64 as that path's, but for one more rounding to the
        // dtype (the logits' gradient, the GEMMs' operands).
        auto lp_ref = chunked_target_log_probs(h, w, targets, temperature, chunk, /*fused=*/false);
        auto grads_ref = torch::autograd::grad({(lp_ref * weights).sum()}, {h, w});
        CHECK((lp_ref - lp).abs().max().item<double>() <= 1e-5 * (1.0 + want.abs().max().item<double>()));
        for (int i = 0; i < 2; ++i) {
          const double e = relative_error(grads[i], want_grads[i]), e_ref = relative_error(grads_ref[i], want_grads[i]);
          MESSAGE(what << ": relative error of d/d" << (i == 0 ? "hidden" : "weight") << " " << e << " (LibTorch path "
                       << e_ref << ")");
          CHECK(e <= 1.25 * e_ref + 2 * u);
          CHECK(e <= 0.05);
        }
      }
    }
  }
}

TEST_CASE("the training forward and backward with the fused kernels equal LibTorch's, against float32 on the CPU") {
  // RMSNorm, RoPE, silu * up and the output log-softmax, forward and backward, on whole models:
  // log-probs and every parameter's gradient as close to a float32 CPU run of the same weights as
  // the LibTorch ops on the GPU are, but for one more rounding to the dtype.
  std::vector<std::pair<std::string, model_config>> variants;
  variants.emplace_back("qwen2 tiny", tiny_config(model_family::qwen2, 128, 4, 2));
  auto yarn = tiny_config(model_family::llama, 256, 4, 4);
  yarn.qkv_bias = false, yarn.mlp_bias = true;
  yarn.rope.type = rope_type::yarn, yarn.rope.factor = 4.0, yarn.rope.original_max_position_embeddings = 32;
  variants.emplace_back("llama yarn, MLP bias", yarn);
  for (auto& [name, config] : variants) {
    REQUIRE_MESSAGE(config.validate().ok(), name);
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      const std::string what = name + ", " + c10::toString(dtype);
      CAPTURE(what);
      torch::manual_seed(23);
      auto ids = torch::randint(0, 1000, {3, 41}, torch::kLong);
      auto targets = torch::randint(0, 1000, {3, 41}, torch::kLong);
      targets.narrow(1, 0, 9).fill_(-1); // prompt positions: no target
      auto weights = torch::rand({3, 41});
      auto run = [&](const std::string& where, bool fused) {
        auto m = scaled_random_model(config, 7, 2.0);
        const auto device = where == "cpu" ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA, 0);
        // The CPU reference takes the dtype's rounded weights in float32.
        m->to(device, dtype);
        if (where == "cpu")
          m->to(device, torch::kFloat);
        m->set_fused_training(fused);
        token_batch b{ids.to(device), {}, {}, {}};
        auto lp = m->token_log_probs(b, targets.to(device), 0.9, /*chunk_tokens=*/32);
        (lp * weights.to(device)).sum().backward();
        std::vector<torch::Tensor> out{lp.detach().to(torch::kCPU, torch::kDouble)};
        for (auto& p : m->parameters())
          out.push_back(p.grad().to(torch::kCPU, torch::kDouble));
        return out;
      };
      auto ref = run("cpu", false), fused = run("cuda", true), plain = run("cuda", false);
      REQUIRE(fused.size() == ref.size());
      const double u = dtype == torch::kFloat ? 1e-6 : dtype == torch::kHalf ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
      // Gradients that are zero but for rounding (a key bias's) are measured against the largest.
      double largest = 0;
      for (const auto& r : ref)
        largest = std::max(largest, r.norm().item<double>());
      auto error = [&](const torch::Tensor& got, const torch::Tensor& want) {
        return (got - want).norm().item<double>() / std::max(want.norm().item<double>(), 1e-3 * largest);
      };
      double worst = 0, worst_plain = 0;
      for (std::size_t i = 0; i < ref.size(); ++i) {
        const double e = error(fused[i], ref[i]), e_plain = error(plain[i], ref[i]);
        worst = std::max(worst, e);
        worst_plain = std::max(worst_plain, e_plain);
        CHECK_MESSAGE(e <= 1.25 * e_plain + 4 * u, what << ": tensor " << i << " relative error " << e << " (LibTorch "
                                                        << e_plain << ")");
      }
      MESSAGE(what << ": worst relative error over log-probs and gradients: fused " << worst << ", LibTorch " << worst_plain);
    }
  }
}

TEST_CASE("silu_mul_pair and its gradients equal LibTorch's ops, per dtype, 8 at a time and one at a time") {
  torch::manual_seed(29);
  for (auto dtype : all_dtypes) {
    for (std::int64_t n : {std::int64_t{4096}, std::int64_t{1003}}) {
      const std::string what = std::string(c10::toString(dtype)) + " n " + std::to_string(n);
      CAPTURE(what);
      auto g = (3.0 * torch::randn({n}, on_gpu(torch::kFloat))).to(dtype).requires_grad_(true);
      auto u = torch::randn({n}, on_gpu(torch::kFloat)).to(dtype).requires_grad_(true);
      auto dy = torch::randn({n}, on_gpu(torch::kFloat)).to(dtype);
      auto want = torch::silu(g) * u;
      auto want_grads = torch::autograd::grad({want}, {g, u}, {dy});
      torch::NoGradGuard no_grad;
      check_close(fused::silu_mul_pair(g.detach(), u.detach()), want, rtol(dtype), 1e-6, what + " forward");
      auto [dg, du] = fused::silu_mul_pair_backward(g.detach(), u.detach(), dy);
      check_close(du, want_grads[1], rtol(dtype), 1e-6, what + " d/dup");
      check_close(dg, want_grads[0], 2 * rtol(dtype), 1e-5, what + " d/dgate");
    }
  }
}

TEST_CASE("the fused log-softmax gives NaN for a row with a NaN logit and -inf logits no weight") {
  auto logits = torch::zeros({3, 24}, on_gpu(torch::kBFloat16));
  logits.index_put_({0, 5}, NAN);
  logits.index_put_({1, 3}, -INFINITY);
  logits.index_put_({2}, -INFINITY);
  auto targets = torch::tensor({int64_t{1}, int64_t{2}, int64_t{0}}, on_gpu(torch::kLong));
  auto [lp, lse] = fused::target_logprobs(logits, targets, 1.0);
  auto l = lse.cpu();
  CHECK(std::isnan(l[0].item<float>()));
  CHECK(l[1].item<float>() == doctest::Approx(std::log(23.0)).epsilon(1e-6));
  CHECK(std::isinf(l[2].item<float>()));
  CHECK(l[2].item<float>() < 0);
  CHECK(lp.cpu()[1].item<float>() == doctest::Approx(-std::log(23.0)).epsilon(1e-6));
}

TEST_CASE("a fused decoding step equals the LibTorch step: logits, keys, values, lengths") {
  struct variant {
    std::string name;
    model_config config;
  };
  std::vector<variant> variants;
  {
    auto c = tiny_config(model_family::qwen2, 128, 4, 2); // q/k/v bias
    variants.push_back({"qwen2 tiny", c});
    c = tiny_config(model_family::qwen2, 896, 14, 2);     // Qwen2.5-0.5B's heads: 64 wide, 7 per KV head
    variants.push_back({"qwen2 0.5b heads", c});
    c = tiny_config(model_family::llama, 256, 8, 2);      // no q/k/v bias; o and MLP biases; dynamic RoPE
    c.qkv_bias = false, c.o_bias = true, c.mlp_bias = true;
    c.rope.type = rope_type::dynamic, c.rope.factor = 2.0, c.max_position_embeddings = 16;
    variants.push_back({"llama biases dynamic", c});
    c = tiny_config(model_family::llama, 256, 4, 4);      // YaRN: cos and sin scaled
    c.qkv_bias = false;
    c.rope.type = rope_type::yarn, c.rope.factor = 4.0, c.rope.original_max_position_embeddings = 32;
    variants.push_back({"llama yarn, no GQA", c});
  }
  for (auto& v : variants) {
    REQUIRE_MESSAGE(v.config.validate().ok(), v.name);
    for (auto dtype : {torch::kFloat, torch::kBFloat16})
    for (bool small : {true, false})
    for (std::int64_t rows : {1, 3}) {
      const std::string what = v.name + ", " + c10::toString(dtype) + (small ? ", small-batch" : ", cuBLAS") +
                               " projections, rows " + std::to_string(rows);
      CAPTURE(what);
      auto m = scaled_random_model(v.config, 5, 4.0);
      m->to(torch::Device(torch::kCUDA, 0), dtype);
      REQUIRE(m->fused_decode_ready());
      torch::NoGradGuard g;
      const std::int64_t width = 17;
      auto ids = torch::randint(0, 1000, {rows, width}, on_gpu(torch::kLong));
      auto counts = torch::tensor({5L, 17L, 1L}, on_gpu(torch::kLong)).narrow(0, 0, rows).contiguous();
      auto cache = m->make_cache(rows, 64);
      m->prefill(ids, cache, counts);
      double worst_logits = 0.0;
      for (int step = 0; step < 12; ++step) {
        auto next = torch::randint(0, 1000, {rows, 1}, on_gpu(torch::kLong));
        auto a = deep_copy(cache), b = deep_copy(cache);
        auto va = a.view(rows, 48), vb = b.view(rows, 48); // views, as the engine's graphs use
        auto want = m->forward_step(next, va, {}, /*fused=*/false);
        auto got = m->forward_step(next, vb, {}, /*fused=*/true, small);
        REQUIRE(torch::equal(a.lengths, b.lengths));
        const double scale = std::max(1.0, want.abs().max().item<double>());
        worst_logits = std::max(worst_logits, max_abs_diff(got, want) / scale);
        for (std::size_t l = 0; l < a.keys.size(); ++l) {
          const double tol = dtype == torch::kFloat ? 1e-4 : 5e-2;
          CHECK(max_abs_diff(b.keys[l], a.keys[l]) <= tol * std::max(1.0, a.keys[l].abs().max().item<double>()));
          CHECK(max_abs_diff(b.values[l], a.values[l]) <= tol * std::max(1.0, a.values[l].abs().max().item<double>()));
        }
        cache = std::move(b); // go on from the fused step's cache, so differences do not compound
      }
      MESSAGE(what << ": max |fused - LibTorch| logits / max |logits| over 12 steps = " << worst_logits);
      CHECK(worst_logits <= (dtype == torch::kFloat ? 1e-4 : 3e-2));
    }
  }
}

TEST_CASE("without joined projections or with LoRA adapters the fused step runs the LibTorch ops") {
  auto c = tiny_config(model_family::qwen2, 128, 4, 2);
  auto m = scaled_random_model(c, 6, 4.0);
  m->to(torch::Device(torch::kCUDA, 0), torch::kFloat);
  REQUIRE(m->fused_decode_ready());
  auto cpu = scaled_random_model(c, 6, 4.0);
  CHECK_FALSE(cpu->fused_decode_ready()); // parameters on the CPU
  auto& k = m->model->blocks[1]->self_attn->k_proj->weight;
  {
    torch::NoGradGuard g;
    k.set_data(k.detach().clone()); // a tensor of its own: q/k/v no longer back to back
  }
  CHECK_FALSE(m->fused_decode_ready());
  torch::NoGradGuard g;
  auto ids = torch::randint(0, 1000, {2, 1}, on_gpu(torch::kLong));
  auto cache = m->make_cache(2, 8);
  auto a = deep_copy(cache), b = deep_copy(cache);
  CHECK(torch::equal(m->forward_step(ids, a, {}, true), m->forward_step(ids, b, {}, false)));
  m->model->blocks[1]->self_attn->join_projections();
  CHECK(m->fused_decode_ready());
  lora_options lo;
  lo.rank = 2;
  REQUIRE(m->add_lora(lo).ok());
  CHECK_FALSE(m->fused_decode_ready());
}

TEST_CASE("greedy decoding with the fused kernels equals the LibTorch decoding, graphs on and off, 10 and 4 rows") {
  for (auto dtype : {torch::kFloat, torch::kBFloat16})
  for (std::size_t prompt_count : {5, 2}) { // 2 samples each: 10 rows (cuBLAS projections), 4 (small-batch kernels)
    for (bool graphs : {true, false}) {
      const std::string what = std::string(c10::toString(dtype)) + (graphs ? ", graphs" : ", eager") + ", " +
                               std::to_string(2 * prompt_count) + " rows";
      CAPTURE(what);
      auto c = preset_config("tiny", model_family::qwen2, 1000);
      REQUIRE(c.ok());
      auto m = scaled_random_model(*c, 1, 4.0);
      m->to(torch::Device(torch::kCUDA, 0), dtype);
      engine_options on, off;
      on.cuda_graphs = off.cuda_graphs = graphs;
      off.fused_kernels = false;
      on.fused_max_rows = 1024; // every call fused, whatever the default bound
      on.small_batch_max_rows = 4; // and the small-batch projections at up to 4 rows
      engine with_kernels(m.ptr(), on), plain(m.ptr(), off);
      torch::manual_seed(7);
      std::vector<std::vector<std::int32_t>> prompts;
      for (int n : {5, 40, 17, 3, 64}) {
        auto t = torch::randint(0, 1000, {n}, torch::kInt);
        prompts.emplace_back(t.data_ptr<std::int32_t>(), t.data_ptr<std::int32_t>() + n);
      }
      prompts.resize(prompt_count);
      sampling_options o;
      o.temperature = 0.0;
      o.max_new_tokens = 300; // past the first 256-slot bucket
      o.samples_per_prompt = 2;
      auto a = with_kernels.generate(prompts, o);
      auto b = plain.generate(prompts, o);
      REQUIRE((a.ok() && b.ok()));
      CHECK(with_kernels.last_stats().fused_steps == with_kernels.last_stats().decode_steps);
      CHECK(with_kernels.last_stats().fused_steps > 0);
      CHECK(plain.last_stats().fused_steps == 0);
      std::size_t same = 0, total = 0;
      double worst = 0.0;
      for (std::size_t i = 0; i < a->size(); ++i) {
        const auto& x = (*a)[i].tokens;
        const auto& y = (*b)[i].tokens;
        std::size_t k = 0;
        while (k < x.size() && k < y.size() && x[k] == y[k])
          ++k;
        same += k;
        total += y.size();
        for (std::size_t j = 0; j < k; ++j)
          worst = std::max(worst, static_cast<double>(std::abs((*a)[i].logprobs[j] - (*b)[i].logprobs[j])));
      }
      MESSAGE(what << ": fused vs LibTorch greedy tokens equal: " << same << " / " << total
                   << ", max |log-prob difference| on the shared prefix " << worst);
      if (dtype == torch::kFloat) {
        CHECK(same == total);
        CHECK(worst <= 1e-3);
      } else {
        // bf16: a different summation order moves a logit by a unit in the last place, and a random
        // model's near-uniform logits make greedy near-ties common, so paths part after a while (on
        // an H100: 800 of 3000 tokens shared). Up to the parting the log-probs must agree within
        // bf16's resolution.
        CHECK(same > 0);
        CHECK(worst <= 5e-2);
      }
    }
  }
}

TEST_CASE("benchmark: 0.5b preset, bf16, batch 1, 512-token prompt, 128 new tokens, fused and LibTorch steps") {
  auto c = preset_config("0.5b", model_family::qwen2, 151936);
  REQUIRE(c.ok());
  auto m = scaled_random_model(*c, 1, 4.0);
  m->to(torch::Device(torch::kCUDA, 0), torch::kBFloat16);
  torch::manual_seed(7);
  auto t = torch::randint(0, 151936, {512}, torch::kInt);
  std::vector<std::vector<std::int32_t>> prompts{{t.data_ptr<std::int32_t>(), t.data_ptr<std::int32_t>() + 512}};
  sampling_options o;
  o.temperature = 0.0;
  o.max_new_tokens = 128;
  for (bool use_kernels : {true, false}) {
    engine_options eo;
    eo.fused_kernels = use_kernels;
    engine e(m.ptr(), eo);
    REQUIRE(e.generate(prompts, o).ok()); // warm-up: captures the graphs
    auto out = e.generate(prompts, o);
    REQUIRE(out.ok());
    const auto& st = e.last_stats();
    MESSAGE((use_kernels ? "fused" : "LibTorch") << ": " << st.decode_steps << " steps in " << st.decode_seconds << " s = "
                                           << 1e3 * st.decode_seconds / static_cast<double>(st.decode_steps)
                                           << " ms a step, " << st.host_syncs << " host copies");
    CHECK(st.fused_steps == (use_kernels ? st.decode_steps : 0));
  }
}
