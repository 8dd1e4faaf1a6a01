// The fused decoding kernels (policy/kernels/kernels.cu, decode_attention.cu through
// policy/kernels/fused.hpp) against the LibTorch ops they replace, kernel by kernel and per dtype:
// norms, RoPE and the cache write, the attention, silu * up, the small-batch projections, the
// persistent layers, greedy sampling. The learner's kernels and the whole fused step are in
// test_gpu_fused_step.cpp.
#include "gpu_kernels_util.hpp"

using namespace crucible;
using namespace crucible::policy;
using namespace crucible::policy::testing;
using namespace crucible::policy::gpu_testing;

TEST_CASE("add_rms_norm equals x + delta and RMSNormImpl, per dtype") {
  torch::manual_seed(11);
  torch::NoGradGuard g;
  const double eps = 1e-6;
  for (auto dtype : all_dtypes) {
    for (auto [rows, dim] : {std::pair<std::int64_t, std::int64_t>{1, 896}, {3, 128}, {64, 1000}, {2, 4096}}) {
      const std::string what = std::string(c10::toString(dtype)) + " rows " + std::to_string(rows) + " dim " +
                               std::to_string(dim);
      CAPTURE(what);
      auto residual = torch::randn({rows, dim}, on_gpu(dtype));
      auto delta = 0.5 * torch::randn({rows, dim}, on_gpu(dtype));
      RMSNorm norm(dim, eps);
      norm->to(torch::Device(torch::kCUDA, 0), dtype);
      norm->weight.copy_(1.0 + 0.2 * torch::randn({dim}, on_gpu(dtype)));

      auto h = residual + delta; // the reference's rounded sum
      auto want = norm(h);
      auto res = residual.clone();
      auto got = fused::add_rms_norm(delta, res, norm->weight, eps);
      CHECK(torch::equal(res, h)); // the residual is updated in place, rounded as x + delta is
      check_close(got, want, rtol(dtype), 1e-6, "add + norm, " + what);

      auto untouched = residual.clone();
      auto plain = fused::add_rms_norm({}, untouched, norm->weight, eps);
      CHECK(torch::equal(untouched, residual)); // no delta: the residual is only read
      check_close(plain, norm(residual), rtol(dtype), 1e-6, "norm, " + what);
    }
  }
}

TEST_CASE("rope_write_kv equals the q/k/v bias, RoPE of q and k and the cache scatter, per dtype and table") {
  torch::manual_seed(12);
  torch::NoGradGuard g;
  for (auto dtype : all_dtypes) {
    for (auto [heads, kv_heads, dim] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{14, 2, 64}, {4, 4, 32},
                                        {8, 2, 128}}) {
      for (bool per_row : {false, true}) {
        for (auto [scaling, biased] : {std::pair<double, bool>{1.0, false}, {1.25, false}, {1.0, true}, {1.25, true}}) {
          const std::int64_t rows = 5, slots = 40;
          const std::string what = std::string(c10::toString(dtype)) + " heads " + std::to_string(heads) + "/" +
                                   std::to_string(kv_heads) + " dim " + std::to_string(dim) +
                                   (per_row ? " per-row table" : " shared table") + " scaling " +
                                   std::to_string(scaling) + (biased ? " with bias" : "");
          CAPTURE(what);
          auto f32 = on_gpu(torch::kFloat);
          auto qkv = torch::randn({rows, (heads + 2 * kv_heads) * dim}, on_gpu(dtype));
          torch::Tensor bias;
          if (biased)
            bias = torch::randn({(heads + 2 * kv_heads) * dim}, on_gpu(dtype));
          auto x = biased ? qkv + bias : qkv; // the projection's output with its bias, rounded to the dtype
          // Positions: random, the last slot, and the first.
          auto lengths = torch::randint(0, slots, {rows}, f32.dtype(torch::kLong));
          lengths[0] = slots - 1;
          lengths[1] = 0;
          auto exponents = torch::arange(0, dim, 2, f32) / static_cast<double>(dim);
          auto inv = 1.0 / torch::pow(10000.0, exponents); // [D/2]
          if (per_row)
            inv = inv.unsqueeze(0) * (1.0 + torch::rand({rows, 1}, f32)); // [R, D/2], as dynamic RoPE makes
          // Views of a larger cache, as the engine's graphs use.
          auto k_full = torch::randn({rows + 2, kv_heads, slots + 8, dim}, on_gpu(dtype));
          auto v_full = torch::randn({rows + 2, kv_heads, slots + 8, dim}, on_gpu(dtype));

          // Reference: CausalLMImpl::rope, apply_rope and the scatter of AttentionImpl::forward_cached.
          auto positions = lengths.unsqueeze(1); // [R, 1]
          auto freqs = positions.unsqueeze(-1).to(torch::kFloat) * (per_row ? inv.unsqueeze(1) : inv);
          auto emb = torch::cat({freqs, freqs}, -1);
          auto cos = (emb.cos() * scaling).to(dtype).unsqueeze(1), sin = (emb.sin() * scaling).to(dtype).unsqueeze(1);
          auto q = x.narrow(1, 0, heads * dim).reshape({rows, 1, heads, dim}).transpose(1, 2);
          auto k = x.narrow(1, heads * dim, kv_heads * dim).reshape({rows, 1, kv_heads, dim}).transpose(1, 2);
          auto v = x.narrow(1, (heads + kv_heads) * dim, kv_heads * dim).reshape({rows, 1, kv_heads, dim}).transpose(1, 2);
          auto q_want = (q * cos + rotate_half(q) * sin).squeeze(2); // [R, H, D]
          auto k_want = k * cos + rotate_half(k) * sin;
          auto k_ref = k_full.clone(), v_ref = v_full.clone();
          auto index = positions.view({rows, 1, 1, 1}).expand({rows, kv_heads, 1, dim});
          k_ref.narrow(0, 0, rows).narrow(2, 0, slots).scatter_(2, index, k_want);
          v_ref.narrow(0, 0, rows).narrow(2, 0, slots).scatter_(2, index, v);

          auto k_got = k_full.clone(), v_got = v_full.clone();
          auto k_view = k_got.narrow(0, 0, rows).narrow(2, 0, slots);
          auto v_view = v_got.narrow(0, 0, rows).narrow(2, 0, slots);
          auto q_got =
            fused::rope_write_kv(qkv, bias, inv.contiguous(), scaling, lengths, k_view, v_view, heads, kv_heads, dim);
          check_close(q_got, q_want, rtol(dtype), 1e-6, "q, " + what);
          check_close(k_got, k_ref, rtol(dtype), 1e-6, "k cache, " + what);
          CHECK(torch::equal(v_got, v_ref)); // values are copied as they are (plus the bias, rounded once)
          // Nothing but the new token's slot changed.
          auto written = torch::zeros({rows + 2, kv_heads, slots + 8, 1}, f32.dtype(torch::kBool));
          written.narrow(0, 0, rows).narrow(2, 0, slots).scatter_(2, positions.view({rows, 1, 1, 1}).expand({rows, kv_heads, 1, 1}), true);
          auto others = written.logical_not().expand_as(k_got);
          CHECK(torch::equal(k_got.masked_select(others), k_full.masked_select(others)));
        }
      }
    }
  }
}

TEST_CASE("decode_attention equals masked softmax attention in float64, per dtype, GQA, any split count, wide") {
  torch::manual_seed(13);
  torch::NoGradGuard g;
  struct shape {
    std::int64_t rows, heads, kv_heads, dim, slots;
  };
  for (auto dtype : all_dtypes) {
    for (auto s : {shape{1, 14, 2, 64, 1024}, shape{3, 4, 2, 32, 100}, shape{5, 8, 8, 128, 300}, shape{2, 12, 2, 64, 33},
                   shape{4, 16, 1, 256, 70}}) {
      for (std::int64_t splits : {std::int64_t{0}, std::int64_t{1}, std::int64_t{3}, std::int64_t{1000}, fused::attention_wide}) {
        const std::string what = std::string(c10::toString(dtype)) + " rows " + std::to_string(s.rows) + " heads " +
                                 std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + " dim " +
                                 std::to_string(s.dim) + " slots " + std::to_string(s.slots) + " splits " +
                                 std::to_string(splits);
        CAPTURE(what);
        auto k_full = torch::randn({s.rows + 1, s.kv_heads, s.slots + 16, s.dim}, on_gpu(dtype));
        auto v_full = torch::randn({s.rows + 1, s.kv_heads, s.slots + 16, s.dim}, on_gpu(dtype));
        auto k = k_full.narrow(0, 0, s.rows).narrow(2, 0, s.slots);
        auto v = v_full.narrow(0, 0, s.rows).narrow(2, 0, s.slots);
        auto q = torch::randn({s.rows, s.heads, s.dim}, on_gpu(dtype));
        auto lengths = torch::randint(0, s.slots, {s.rows}, on_gpu(torch::kLong));
        lengths[0] = s.slots - 1; // every slot
        if (s.rows > 1)
          lengths[1] = 0;          // one slot
        auto got = fused::decode_attention(q, k, v, lengths, splits);
        check_close(got, attention_reference(q, k, v, lengths), rtol(dtype), 1e-5, "attention, " + what);
      }
    }
  }
}

TEST_CASE("decode_attention at the edges: lengths 0, 1 and granule bounds, empty splits, groups 1 to 12, 64 rows") {
  torch::manual_seed(15);
  torch::NoGradGuard g;
  struct shape {
    std::int64_t rows, heads, kv_heads, dim, slots;
  };
  // Group 7 at 64 (Qwen2.5-0.5B), 1 at 128, 8 (two blocks of four heads) at 64, 3 at 256, 12 at
  // 40 (5 of 8 lanes of a key), 2 at 36 (bf16 and f16: element loads), 64 rows of group 7.
  const shape shapes[] = {{18, 14, 2, 64, 1024}, {18, 4, 4, 128, 300}, {18, 8, 1, 64, 97}, {18, 6, 2, 256, 64},
                          {18, 12, 1, 40, 33},   {18, 4, 2, 36, 70},   {64, 14, 2, 64, 520}};
  for (auto dtype : all_dtypes) {
    for (const auto& s : shapes) {
      for (bool offset : {false, true}) { // a cache view 16 bytes off the allocation, or one element off
        for (std::int64_t splits : {std::int64_t{0}, std::int64_t{1}, std::int64_t{2}, std::int64_t{1000}, fused::attention_wide}) {
          const std::string what = std::string(c10::toString(dtype)) + " rows " + std::to_string(s.rows) + " heads " +
                                   std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + " dim " +
                                   std::to_string(s.dim) + " slots " + std::to_string(s.slots) + " splits " +
                                   std::to_string(splits) + (offset ? " misaligned view" : "");
          CAPTURE(what);
          const std::int64_t cached = s.slots + 7; // a larger cache, as the engine's graphs view
          auto k_store = torch::randn({(s.rows + 1) * s.kv_heads * cached * s.dim + 8}, on_gpu(dtype));
          auto v_store = torch::randn_like(k_store);
          const std::vector<std::int64_t> sizes{s.rows, s.kv_heads, s.slots, s.dim};
          const std::vector<std::int64_t> strides{s.kv_heads * cached * s.dim, cached * s.dim, s.dim, 1};
          const std::int64_t start = offset ? 1 : 16 / static_cast<std::int64_t>(k_store.element_size());
          auto k = k_store.as_strided(sizes, strides, start), v = v_store.as_strided(sizes, strides, start);
          auto q = 2.0 * torch::randn({s.rows, s.heads, s.dim}, on_gpu(dtype)); // sharper softmaxes
          // Row r's length: edges[r % 18]: none visible, one slot, around the granules (8, 16 or
          // 32 slots, by dtype, alignment and head_dim), all slots, past the end.
          const std::int64_t edges[] = {-1, 0, 1, 6, 7, 8, 14, 15, 16, 30, 31, 32, 33, 63, 64, s.slots - 2, s.slots - 1,
                                        s.slots + 3};
          std::vector<std::int64_t> row_lengths;
          for (std::int64_t r = 0; r < s.rows; ++r)
            row_lengths.push_back(edges[r % 18]);
          auto lengths = torch::tensor(row_lengths).to(torch::kCUDA);
          CAPTURE(lengths.cpu());
          auto got = fused::decode_attention(q, k, v, lengths, splits);
          REQUIRE(torch::isfinite(got).all().item<bool>());
          check_close(got, attention_reference(q, k, v, lengths), rtol(dtype), 1e-5, "attention, " + what);
        }
      }
    }
  }
}

TEST_CASE("decode_attention in a CUDA graph reads the lengths at each replay, split, wide and with early reads") {
  torch::manual_seed(16);
  torch::NoGradGuard g;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (std::int64_t splits : {std::int64_t{0}, std::int64_t{4}, fused::attention_wide}) {
      for (bool early : {false, true}) {
        // 1024 slots: two rounds of a wide block's warps past 512 visible slots (bf16), so with early
        // reads the second round is prefetched to shared memory before the wait.
        const std::int64_t rows = 3, heads = 14, kv_heads = 2, dim = 64, slots = 1024;
        const std::string what = std::string(c10::toString(dtype)) + " splits " + std::to_string(splits) +
                                  (early ? " early reads" : "");
        CAPTURE(what);
        auto k = torch::randn({rows, kv_heads, slots, dim}, on_gpu(dtype));
        auto v = torch::randn_like(k);
        auto q_next = torch::randn({rows, heads, dim}, on_gpu(dtype));
        auto q = torch::empty_like(q_next);
        auto lengths = torch::full({rows}, slots - 1, on_gpu(torch::kLong));
        auto stream = at::cuda::getStreamFromPool();
        c10::cuda::CUDAStreamGuard guard(stream);
        q.copy_(q_next);
        auto warm = fused::decode_attention(q, k, v, lengths, splits, early); // allocations before capture
        stream.synchronize();
        // As in a decoding step: the kernel just before the attention writes q (and, there, the new
        // token's slot), never the lengths or the older slots, which early reads load before waiting.
        at::cuda::CUDAGraph graph;
        graph.capture_begin();
        q.copy_(q_next);
        auto out = fused::decode_attention(q, k, v, lengths, splits, early);
        graph.capture_end();
        for (auto row_lengths : {std::vector<std::int64_t>{0, 1, 2}, {1023, 31, -1}, {600, 200, 900}, {512, 513, 96}}) {
          lengths.copy_(torch::tensor(row_lengths));
          q_next.normal_();
          graph.replay();
          stream.synchronize();
          check_close(out, attention_reference(q_next, k, v, lengths), rtol(dtype), 1e-5,
                      "graph replay, " + what + " lengths " + std::to_string(row_lengths[0]) + ", " +
                        std::to_string(row_lengths[1]) + ", " + std::to_string(row_lengths[2]));
        }
      }
    }
  }
}

TEST_CASE("the wide attention kernel equals the split one where both run") {
  torch::manual_seed(17);
  torch::NoGradGuard g;
  for (auto dtype : all_dtypes) {
    const std::int64_t rows = 2, heads = 14, kv_heads = 2, dim = 64, slots = 1024;
    const std::string what = c10::toString(dtype);
    CAPTURE(what);
    auto k = torch::randn({rows, kv_heads, slots, dim}, on_gpu(dtype));
    auto v = torch::randn_like(k);
    auto q = 2.0 * torch::randn({rows, heads, dim}, on_gpu(dtype));
    for (std::int64_t length : {0, 1, 17, 511, 512, 700, 1023}) {
      auto lengths = torch::full({rows}, length, on_gpu(torch::kLong));
      auto wide = fused::decode_attention(q, k, v, lengths, fused::attention_wide);
      auto split = fused::decode_attention(q, k, v, lengths, 8);
      auto want = attention_reference(q, k, v, lengths);
      check_close(wide, want, rtol(dtype), 1e-5, "wide, " + what + " length " + std::to_string(length));
      // Both round once from float32 sums taken in different orders: within a unit of the last place.
      check_close(wide, split, rtol(dtype), 1e-5, "wide against split, " + what + " length " + std::to_string(length));
    }
  }
}

TEST_CASE("silu_mul equals torch::silu(gate) * up, per dtype") {
  torch::manual_seed(14);
  torch::NoGradGuard g;
  for (auto dtype : all_dtypes) {
    for (auto [rows, inter] : {std::pair<std::int64_t, std::int64_t>{1, 4864}, {7, 100}, {64, 1408}}) {
      const std::string what = std::string(c10::toString(dtype)) + " rows " + std::to_string(rows) + " inter " +
                               std::to_string(inter);
      CAPTURE(what);
      auto gate_up = 3.0 * torch::randn({rows, 2 * inter}, on_gpu(dtype));
      auto want = torch::silu(gate_up.narrow(1, 0, inter)) * gate_up.narrow(1, inter, inter);
      check_close(fused::silu_mul(gate_up), want, rtol(dtype), 1e-6, "silu * up, " + what);
    }
  }
}

namespace {

// A GEMM's outputs in another summation order: within the dtype's tolerance of the largest
// output (cancellation makes small outputs' relative error meaningless).
void check_gemm_close(const torch::Tensor& got, const torch::Tensor& want, torch::ScalarType dtype,
                      const std::string& what) {
  const double scale = std::max(1.0, want.abs().max().item<double>());
  check_close(got, want, rtol(dtype), rtol(dtype) * scale, what);
}

} // namespace

TEST_CASE("small-batch projections equal norm, linear and what follows them, per dtype, 1 to 4 rows") {
  torch::manual_seed(15);
  torch::NoGradGuard g;
  const double eps = 1e-6;
  struct shape {
    std::int64_t hidden, inter, heads, kv_heads, dim;
  };
  // At one row, the down projection's k of 4864 in one round of eight loads a lane, or in two of
  // four (decode_options::small_gemm_one_round); gate/up a unit a half-warp, or a warp
  // (decode_options::small_gemm_half_warps; every k here takes the half-warps).
  for (bool one_round : {true, false})
  for (auto dtype : all_dtypes) {
    const auto proj = projections(one_round);
    for (auto sh : {shape{896, 4864, 14, 2, 64}, shape{128, 352, 4, 4, 32}, shape{256, 688, 2, 1, 128}}) {
      for (std::int64_t rows : {1, 2, 3, 4}) {
        for (bool biased : {false, true}) {
          const std::string what = std::string(c10::toString(dtype)) + " hidden " + std::to_string(sh.hidden) + " inter " +
                                   std::to_string(sh.inter) + " rows " + std::to_string(rows) +
                                   (biased ? " with bias" : "") +
                                   (one_round ? ", one round, half-warps" : ", two rounds, warps");
          CAPTURE(what);
          const auto opts = on_gpu(dtype);
          const bool fits = fused::small_batch_supported(dtype, rows, sh.inter);
          // float32 rows of 4864 take 19 KiB of shared memory each: three do not fit.
          CHECK(fits == (dtype != torch::kFloat || rows * sh.inter * 4 <= 48 * 1024));
          auto residual = torch::randn({rows, sh.hidden}, opts);
          RMSNorm norm(sh.hidden, eps);
          norm->to(torch::Device(torch::kCUDA, 0), dtype);
          norm->weight.copy_(1.0 + 0.2 * torch::randn({sh.hidden}, opts));
          const auto n_qkv = (sh.heads + 2 * sh.kv_heads) * sh.dim;
          auto w_qkv = torch::randn({n_qkv, sh.hidden}, opts) / std::sqrt(static_cast<double>(sh.hidden));
          auto w_gu = torch::randn({2 * sh.inter, sh.hidden}, opts) / std::sqrt(static_cast<double>(sh.hidden));
          auto w_down = torch::randn({sh.hidden, sh.inter}, opts) / std::sqrt(static_cast<double>(sh.inter));
          torch::Tensor b_qkv, b_gu, b_down;
          if (biased) {
            b_qkv = 0.5 * torch::randn({n_qkv}, opts);
            b_gu = 0.5 * torch::randn({2 * sh.inter}, opts);
            b_down = 0.5 * torch::randn({sh.hidden}, opts);
          }
          auto act = torch::randn({rows, sh.inter}, opts);
          if (!fits) {
            auto res = residual.clone();
            CHECK_THROWS(fused::project_add(act, w_down, b_down, res, false, proj));
            continue;
          }

          // q/k/v: the norm, linear with its bias, then rope_write_kv (tested above) on the result.
          const std::int64_t slots = 24;
          auto lengths = torch::randint(0, slots, {rows}, opts.dtype(torch::kLong));
          lengths[0] = slots - 1;
          auto inv = 1.0 / torch::pow(10000.0, torch::arange(0, sh.dim, 2, on_gpu(torch::kFloat)) / static_cast<double>(sh.dim));
          auto k_full = torch::randn({rows + 1, sh.kv_heads, slots + 4, sh.dim}, opts);
          auto v_full = torch::randn({rows + 1, sh.kv_heads, slots + 4, sh.dim}, opts);
          auto k_ref = k_full.clone(), v_ref = v_full.clone(), k_got = k_full.clone(), v_got = v_full.clone();
          auto view = [&](torch::Tensor& t) { return t.narrow(0, 0, rows).narrow(2, 0, slots); };
          auto kr = view(k_ref), vr = view(v_ref), kg = view(k_got), vg = view(v_got);
          auto qkv = torch::linear(norm(residual), w_qkv, b_qkv);
          auto q_want = fused::rope_write_kv(qkv, {}, inv, 1.0, lengths, kr, vr, sh.heads, sh.kv_heads, sh.dim);
          auto untouched = residual.clone();
          auto q_got = fused::norm_qkv_rope(untouched, norm->weight, eps, w_qkv, b_qkv, inv, 1.0, lengths, kg, vg,
                                            sh.heads, sh.kv_heads, sh.dim, false, proj);
          CHECK(torch::equal(untouched, residual));
          check_gemm_close(q_got, q_want, dtype, "q, " + what);
          check_gemm_close(k_got, k_ref, dtype, "k cache, " + what);
          check_gemm_close(v_got, v_ref, dtype, "v cache, " + what);
          // Only the new tokens' slots changed.
          auto changed = (k_got != k_full).any(-1) | (v_got != v_full).any(-1); // [R+1, KV, S+4]
          auto allowed = torch::zeros_like(changed);
          allowed.narrow(0, 0, rows).narrow(2, 0, slots)
            .scatter_(2, lengths.view({rows, 1, 1}).expand({rows, sh.kv_heads, 1}), true);
          CHECK((changed & allowed.logical_not()).any().item<bool>() == false);

          // gate/up: the norm, linear, silu(gate) * up.
          auto gu = torch::linear(norm(residual), w_gu, b_gu);
          auto act_want = torch::silu(gu.narrow(1, 0, sh.inter)) * gu.narrow(1, sh.inter, sh.inter);
          check_gemm_close(fused::norm_gate_up_silu(residual, norm->weight, eps, w_gu, b_gu, proj), act_want, dtype,
                           "silu(gate) * up, " + what);

          // down (k = inter, split over warps at 4864) and o (k = hidden), each added to the residual.
          for (auto [x, w, b, name] : {std::tuple{act, w_down, b_down, "down"},
                                       std::tuple{residual.narrow(1, 0, sh.hidden).clone(), w_down.narrow(1, 0, sh.hidden).contiguous(), b_down, "o"}}) {
            auto base = torch::randn({rows, sh.hidden}, opts);
            auto want = base + torch::linear(x, w, b);
            auto got = base.clone();
            fused::project_add(x, w, b, got, false, proj);
            check_gemm_close(got, want, dtype, std::string(name) + " + residual, " + what);
          }
        }
      }
    }
  }
  // One row, k that one round of eight loads a lane covers with a ragged end (3000), and one it
  // does not (16000: two rounds of eight), against the rounds of four.
  for (bool one_round : {true, false}) {
    const auto proj = projections(one_round);
    for (std::int64_t k : {3000, 16000}) {
      auto x = torch::randn({1, k}, on_gpu(torch::kBFloat16));
      auto w = torch::randn({96, k}, on_gpu(torch::kBFloat16)) / std::sqrt(static_cast<double>(k));
      auto base = torch::randn({1, 96}, on_gpu(torch::kBFloat16));
      auto want = base + torch::linear(x, w);
      auto got = base.clone();
      fused::project_add(x, w, {}, got, false, proj);
      check_gemm_close(got, want, torch::kBFloat16,
                       "k " + std::to_string(k) + " at one row, " + (one_round ? "one round" : "two rounds"));
    }
  }
  // An odd number of output rows: the last warp has one row.
  auto x = torch::randn({2, 128}, on_gpu(torch::kBFloat16));
  auto w = torch::randn({129, 128}, on_gpu(torch::kBFloat16)) / 11.0;
  auto base = torch::randn({2, 129}, on_gpu(torch::kBFloat16));
  auto want = base + torch::linear(x, w);
  auto got = base.clone();
  fused::project_add(x, w, {}, got);
  check_gemm_close(got, want, torch::kBFloat16, "odd n");
  // Bad input: a weight whose k does not match the input's.
  CHECK_THROWS_WITH_AS(fused::project_add(x, torch::randn({129, 64}, on_gpu(torch::kBFloat16)), {}, got),
                       doctest::Contains("weight must be contiguous"), c10::Error);
}

namespace {

// One of the decoding variants (a bool of kernels::decode_options).
using decode_switch = bool kernels::decode_options::*;

// The defaults with `field` at `value`.
kernels::decode_options switched(decode_switch field, bool value) {
  kernels::decode_options o;
  o.*field = value;
  return o;
}

// A tiny bf16 model with Qwen2.5-0.5B's heads (14 of 64 over 2 KV heads), on the GPU.
CausalLM tiny_05b_heads(std::uint64_t seed) {
  auto m = scaled_random_model(tiny_config(model_family::qwen2, 896, 14, 2), seed, 4.0);
  m->to(torch::Device(torch::kCUDA, 0), torch::kBFloat16);
  REQUIRE(m->fused_decode_ready());
  return m;
}

// `steps` fused decoding steps at 1 and 3 rows after a `prompt`-token prefill into `slots` slots,
// each from the same cache with the model's decoding variant `field` at its default and at the
// other value: the logits, the caches and the lengths equal bit for bit.
void check_switch_changes_nothing(decode_switch field, std::uint64_t seed, int steps, std::int64_t prompt = 9,
                                  std::int64_t slots = 64) {
  const bool default_value = kernels::decode_options{}.*field;
  auto m = tiny_05b_heads(seed);
  torch::NoGradGuard g;
  for (std::int64_t rows : {1, 3}) {
    CAPTURE(rows);
    auto ids = torch::randint(0, 1000, {rows, prompt}, on_gpu(torch::kLong));
    auto cache = m->make_cache(rows, slots);
    m->prefill(ids, cache, torch::full({rows}, prompt, on_gpu(torch::kLong)));
    for (int step = 0; step < steps; ++step) {
      auto next = torch::randint(0, 1000, {rows, 1}, on_gpu(torch::kLong));
      auto a = deep_copy(cache), b = deep_copy(cache);
      auto by_default = m->forward_step(next, a, {}, /*fused=*/true, /*small_batch=*/true);
      m->set_decode_options(switched(field, !default_value));
      auto other = m->forward_step(next, b, {}, /*fused=*/true, /*small_batch=*/true);
      m->set_decode_options({});
      CHECK(torch::equal(by_default, other));
      CHECK(torch::equal(a.lengths, b.lengths));
      for (std::size_t l = 0; l < a.keys.size(); ++l) {
        CHECK(torch::equal(a.keys[l], b.keys[l]));
        CHECK(torch::equal(a.values[l], b.values[l]));
      }
      cache = std::move(a);
    }
  }
}

// One-row decoding steps of tiny_05b_heads(seed) after a `prompt`-token prefill into `slots`
// slots, replayed from a CUDA graph `steps` times as the engine runs them: each replay's logits
// and lengths, and the caches at the end, equal eager steps' bit for bit.
void check_graph_equals_eager(std::uint64_t seed, std::int64_t prompt, std::int64_t slots, int steps) {
  auto m = tiny_05b_heads(seed);
  torch::NoGradGuard g;
  auto ids = torch::randint(0, 1000, {1, prompt}, on_gpu(torch::kLong));
  auto cache = m->make_cache(1, slots);
  m->prefill(ids, cache, torch::full({1}, prompt, on_gpu(torch::kLong)));
  auto eager_cache = deep_copy(cache);
  auto next = torch::randint(0, 1000, {1, 1}, on_gpu(torch::kLong));
  auto stream = c10::cuda::getStreamFromPool();
  at::cuda::CUDAGraph graph;
  torch::Tensor logits;
  {
    c10::cuda::CUDAStreamGuard guard(stream);
    auto warm = deep_copy(cache);
    m->forward_step(next, warm, {}, true, true); // allocations and first-call work outside the capture
    graph.capture_begin();
    logits = m->forward_step(next, cache, {}, true, true);
    graph.capture_end();
  }
  torch::cuda::synchronize();
  // The capture ran nothing: the graph's first replay is the first step.
  for (int step = 0; step < steps; ++step) {
    graph.replay();
    auto want = m->forward_step(next, eager_cache, {}, true, true);
    torch::cuda::synchronize();
    CHECK(torch::equal(logits, want));
    CHECK(torch::equal(cache.lengths, eager_cache.lengths));
  }
  for (std::size_t l = 0; l < cache.keys.size(); ++l) {
    CHECK(torch::equal(cache.keys[l], eager_cache.keys[l]));
    CHECK(torch::equal(cache.values[l], eager_cache.values[l]));
  }
}

} // namespace

TEST_CASE("the attention's splits merged by the o projection equal the combine kernel and project_add bit for bit") {
  // Qwen2.5-0.5B's heads (14 over 2, 64 wide) at one row. The wide kernel over the merge's splits,
  // then once its combine kernel and project_add, once the o projection merging the splits as it
  // stages them (fused::attention_project_add): with at most four splits, each gets a thread
  // group of its own in the combine, whose sums are then the merge's, in the same order.
  torch::manual_seed(17);
  torch::NoGradGuard g;
  const std::int64_t heads = 14, kv_heads = 2, dim = 64, hidden = 896;
  const auto sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  for (int warps : {kernels::decode_attention_wide_warps, kernels::decode_attention_half_wide_warps})
  for (auto dtype : all_dtypes) {
    for (std::int64_t slots : {64, 256, 1000}) {
      const auto elem = static_cast<int>(torch::elementSize(dtype));
      const auto plan =
        kernels::plan_decode_attention_wide(elem, true, static_cast<int>(heads / kv_heads), static_cast<int>(dim), warps);
      const auto split = kernels::choose_decode_attention_merge_split(plan, 1, heads, slots, sms);
      const std::string what = std::string(c10::toString(dtype)) + " slots " + std::to_string(slots) + " splits " +
                               std::to_string(split.splits) + " of " + std::to_string(split.chunk) + ", " +
                               std::to_string(warps) + " warps a block";
      kernels::decode_options o;
      o.merge_warps = warps;
      CAPTURE(what);
      if (split.splits < 2 || split.splits > 4) {
        MESSAGE("no merge of two to four splits on this device: ", what);
        continue;
      }
      auto k = torch::randn({1, kv_heads, slots, dim}, on_gpu(dtype));
      auto v = torch::randn_like(k);
      auto q = 2.0 * torch::randn({1, heads, dim}, on_gpu(dtype));
      auto weight = torch::randn({hidden, heads * dim}, on_gpu(dtype)) / 16.0;
      auto bias = torch::randn({hidden}, on_gpu(dtype));
      auto base = torch::randn({1, hidden}, on_gpu(dtype));
      for (std::int64_t length : {std::int64_t{-1}, std::int64_t{0}, split.chunk - 1, split.chunk, slots / 2, slots - 1}) {
        CAPTURE(length);
        auto lengths = torch::full({1}, length, on_gpu(torch::kLong));
        // The combine kernel's result of the same wide launch.
        kernels::decode_attention_args a;
        a.q = q.data_ptr();
        a.k_cache = k.data_ptr();
        a.v_cache = v.data_ptr();
        a.row_stride = k.stride(0), a.head_stride = k.stride(1), a.slot_stride = k.stride(2);
        a.lengths = lengths.data_ptr<std::int64_t>();
        a.rows = 1, a.heads = heads, a.kv_heads = kv_heads, a.head_dim = dim, a.slots = slots;
        a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
        a.wide = true, a.splits = split.splits, a.chunk = split.chunk, a.wide_warps = warps;
        auto combined = torch::empty({1, heads * dim}, on_gpu(dtype));
        auto partial_out = torch::empty({1, heads, split.splits, dim}, on_gpu(torch::kFloat));
        auto partial_ml = torch::empty({1, heads, split.splits, 2}, on_gpu(torch::kFloat));
        a.out = combined.data_ptr();
        a.partial_out = partial_out.data_ptr<float>();
        a.partial_ml = partial_ml.data_ptr<float>();
        const auto t = dtype == torch::kFloat ? kernels::dtype::f32 : dtype == torch::kHalf ? kernels::dtype::f16 : kernels::dtype::bf16;
        REQUIRE(kernels::decode_attention(t, a, at::cuda::getCurrentCUDAStream()) == cudaSuccess);
        auto want = base.clone();
        fused::project_add(combined, weight, bias, want);
        auto got = base.clone();
        fused::attention_project_add(q, k, v, lengths, weight, bias, got, false, o);
        CHECK(torch::equal(got, want));
        // And both against float64 attention through the same projection: the attention's output
        // rounded to the dtype feeds a sum of 896 products, so near zero the error is absolute,
        // on the scale of the largest output.
        auto reference = attention_reference(q, k, v, lengths);
        auto ref_out = base.to(torch::kDouble) + torch::linear(reference, weight.to(torch::kDouble), bias.to(torch::kDouble));
        const double scale = ref_out.abs().max().item<double>();
        check_close(got, ref_out, 4 * rtol(dtype), rtol(dtype) * scale + 1e-5, "merged o projection, " + what);
      }
      // Switched off, the same call runs decode_attention and project_add.
      auto lengths = torch::full({1}, slots - 1, on_gpu(torch::kLong));
      auto want = base.clone();
      fused::project_add(fused::decode_attention(q, k, v, lengths), weight, bias, want);
      auto got = base.clone();
      o.attention_merge = false;
      fused::attention_project_add(q, k, v, lengths, weight, bias, got, false, o);
      CHECK(torch::equal(got, want));
    }
  }
}

namespace {

// The largest differences over `steps` fused one-row steps of `m` from `cache`, each run with
// `base` and with `other` as the model's decoding variants (`base` again after): the logits
// relative to the other step's largest logit, the caches relative to their largest entries. Each
// step goes on from the other step's cache, so differences do not compound.
struct step_difference {
  double logits = 0.0, cache = 0.0;
};
step_difference switched_step_difference(CausalLM& m, kv_cache& cache, const kernels::decode_options& base,
                                         const kernels::decode_options& other, int steps) {
  step_difference d;
  for (int step = 0; step < steps; ++step) {
    auto next = torch::randint(0, 1000, {1, 1}, on_gpu(torch::kLong));
    auto a = deep_copy(cache), b = deep_copy(cache);
    m->set_decode_options(base);
    auto by_default = m->forward_step(next, a, {}, /*fused=*/true, /*small_batch=*/true);
    m->set_decode_options(other);
    auto switched = m->forward_step(next, b, {}, /*fused=*/true, /*small_batch=*/true);
    m->set_decode_options(base);
    REQUIRE(torch::equal(a.lengths, b.lengths));
    d.logits = std::max(d.logits, max_abs_diff(by_default, switched) / std::max(1.0, switched.abs().max().item<double>()));
    for (std::size_t l = 0; l < a.keys.size(); ++l) {
      const double ks = std::max(1.0, b.keys[l].abs().max().item<double>());
      const double vs = std::max(1.0, b.values[l].abs().max().item<double>());
      d.cache = std::max({d.cache, max_abs_diff(a.keys[l], b.keys[l]) / ks, max_abs_diff(a.values[l], b.values[l]) / vs});
    }
    cache = std::move(b);
  }
  return d;
}

} // namespace

TEST_CASE("a one-row step with the attention merged by the o projection equals the whole-row attention within rounding") {
  // 256 slots: four splits of 64 on an H100; prompts filling one split, and three.
  for (int warps : {kernels::decode_attention_wide_warps, kernels::decode_attention_half_wide_warps})
  for (auto dtype : all_dtypes) {
    for (std::int64_t prompt : {9, 150}) {
      const std::string what = std::string(c10::toString(dtype)) + ", prompt " + std::to_string(prompt) + ", " +
                               std::to_string(warps) + " warps a block";
      CAPTURE(what);
      kernels::decode_options merged;
      merged.merge_warps = warps;
      auto whole = merged;
      whole.attention_merge = false;
      auto m = scaled_random_model(tiny_config(model_family::qwen2, 896, 14, 2), 19, 4.0);
      m->to(torch::Device(torch::kCUDA, 0), dtype);
      torch::NoGradGuard g;
      auto cache = m->make_cache(1, 256);
      m->prefill(torch::randint(0, 1000, {1, prompt}, on_gpu(torch::kLong)), cache,
                 torch::full({1}, prompt, on_gpu(torch::kLong)));
      const auto d = switched_step_difference(m, cache, merged, whole, 4);
      MESSAGE(what << ": max |merged - whole| / max |logits| over 4 steps = " << d.logits << ", caches " << d.cache);
      CHECK(d.logits <= (dtype == torch::kFloat ? 1e-4 : 3e-2));
    }
  }
  // In a CUDA graph, as the engine runs it: replays equal eager steps bit for bit.
  check_graph_equals_eager(21, 150, 256, 4);
}

TEST_CASE("the o and down projections' inputs staged by loads at once or one at a time: the same step") {
  // 150 tokens in 256 slots: the attention in three splits of the four that the o projection merges.
  check_switch_changes_nothing(&kernels::decode_options::small_gemm_batched_staging, 23, 4, 150, 256);
  check_switch_changes_nothing(&kernels::decode_options::small_gemm_batched_staging, 23, 2); // no merge: the inputs copied
}

TEST_CASE("a decoding step whose kernels launch the next as they begin equals one that launches after the wait") {
  // The early launch is the default at one row; at three rows both run the same kernels.
  check_switch_changes_nothing(&kernels::decode_options::early_launch, 7, 6);
  // In a CUDA graph, as the engine runs it: replays with early launches equal eager steps.
  check_graph_equals_eager(7, 9, 64, 4);
}

TEST_CASE("the five kernels' timeline records every block of every layer in order and changes no result") {
  auto m = tiny_05b_heads(11);
  torch::NoGradGuard g;
  auto ids = torch::randint(0, 1000, {1, 9}, on_gpu(torch::kLong));
  auto cache = m->make_cache(1, 64);
  m->prefill(ids, cache, torch::full({1}, 9L, on_gpu(torch::kLong)));
  auto next = torch::randint(0, 1000, {1, 1}, on_gpu(torch::kLong));
  auto a = deep_copy(cache), b = deep_copy(cache);
  auto untimed = m->forward_step(next, a, {}, /*fused=*/true, /*small_batch=*/true);
  torch::Tensor timed;
  const auto layers = m->config().num_layers;
  auto kernels = time_decode_kernels(*m, [&] { timed = m->forward_step(next, b, {}, true, true); }, layers);
  REQUIRE_MESSAGE(kernels.ok(), (kernels.ok() ? std::string{} : kernels.error().message)); // -s renders it on success too
  CHECK(torch::equal(untimed, timed));
  CHECK(torch::equal(a.lengths, b.lengths));
  for (std::size_t l = 0; l < a.keys.size(); ++l) {
    CHECK(torch::equal(a.keys[l], b.keys[l]));
    CHECK(torch::equal(a.values[l], b.values[l]));
  }
  REQUIRE(kernels->size() == 5);
  const char* names[] = {"qkv", "attention", "o", "gate_up", "down"};
  for (std::size_t k = 0; k < 5; ++k) {
    const auto& t = (*kernels)[k];
    CAPTURE(t.kernel);
    CHECK(t.kernel == names[k]);
    CHECK(t.blocks > 0);
    // A wait returns only once the kernel before has ended, and a block ends after its wait.
    CHECK(t.first_wait_us >= 0.0);
    CHECK(t.first_start_us <= t.last_start_us);
    CHECK(t.first_wait_us <= t.last_wait_us);
    CHECK(t.last_wait_us <= t.end_us);
    CHECK(t.after_wait_us >= 0.0);
    CHECK(t.after_wait_us <= t.slowest_after_wait_us);
    CHECK(t.to_midpoint_us >= 0.0); // the midpoint comes after the wait and before the end
    CHECK(t.from_midpoint_us >= 0.0);
    CHECK(t.late_blocks <= t.blocks);
  }
  // The wide attention: a block a query head, for each of the splits the o projection merges.
  CHECK((*kernels)[1].blocks % 14 == 0);
  // A call that launches no decoding kernel records nothing, and says so.
  auto none = time_decode_kernels(*m, [] {}, layers);
  CHECK_FALSE(none.ok());
  CHECK(m->decode_options().timeline == nullptr); // the model's own variants again
}

TEST_CASE("greedy_logprob equals argmax and log_softmax, per dtype, with ties and -inf") {
  torch::manual_seed(16);
  torch::NoGradGuard g;
  for (auto dtype : all_dtypes) {
    for (auto [rows, vocab] : {std::pair<std::int64_t, std::int64_t>{1, 151936}, {3, 1000}, {64, 32768}, {2, 7}}) {
      const std::string what = std::string(c10::toString(dtype)) + " rows " + std::to_string(rows) + " vocab " +
                               std::to_string(vocab);
      CAPTURE(what);
      auto logits = (4.0 * torch::randn({rows, vocab}, on_gpu(torch::kFloat))).to(dtype);
      if (vocab > 100) {
        logits.index_put_({0, 17}, 40.0); // a tie: the first index wins
        logits.index_put_({0, vocab - 3}, 40.0);
        logits.index_put_({rows - 1, 5}, -INFINITY);
      }
      auto [tokens, lp] = fused::greedy_logprob(logits);
      auto f = logits.to(torch::kFloat);
      auto want_tokens = f.argmax(-1);
      CHECK(torch::equal(tokens, want_tokens));
      if (vocab > 100)
        CHECK(tokens[0].item<std::int64_t>() == 17);
      auto want_lp = torch::log_softmax(f, -1).gather(1, want_tokens.unsqueeze(1)).squeeze(1);
      check_close(lp, want_lp, 1e-5, 1e-5, "log-prob, " + what);
    }
  }
}

TEST_CASE("greedy_record writes greedy_logprob's results at the counted step and advances it") {
  torch::manual_seed(18);
  torch::NoGradGuard g;
  for (auto dtype : all_dtypes) {
    for (std::int64_t rows : {1, 5, 300}) {
      const std::string what = std::string(c10::toString(dtype)) + " rows " + std::to_string(rows);
      CAPTURE(what);
      const std::int64_t capacity = 3, vocab = 4099;
      // Rows strided past their capacity, as the engine's narrowed buffer is.
      auto history = torch::full({rows, capacity + 2, 2}, -7.0, on_gpu(torch::kDouble)).narrow(1, 0, capacity);
      auto counters = torch::zeros({2}, on_gpu(torch::kInt));
      auto next = torch::full({rows}, -1, on_gpu(torch::kLong));
      std::vector<torch::Tensor> want_tokens, want_lp;
      for (int step = 0; step < capacity + 1; ++step) {
        auto logits = (4.0 * torch::randn({rows, vocab}, on_gpu(torch::kFloat))).to(dtype);
        auto [tokens, lp] = fused::greedy_logprob(logits);
        fused::greedy_record(logits, next, history, counters);
        CHECK(torch::equal(next, tokens));
        want_tokens.push_back(tokens);
        want_lp.push_back(lp);
        auto c = counters.cpu();
        CHECK(c[0].item<int>() == step + 1);
        CHECK(c[1].item<int>() == 0);
      }
      auto h = history.cpu();
      for (int step = 0; step < capacity; ++step) {
        CHECK(torch::equal(h.select(1, step).select(1, 0), want_tokens[step].cpu().to(torch::kDouble)));
        CHECK(torch::equal(h.select(1, step).select(1, 1), want_lp[step].cpu().to(torch::kDouble)));
      }
      // The step past the capacity was not recorded, nor anything beyond a row's capacity.
      auto whole = history.as_strided({rows, capacity + 2, 2}, history.strides()).cpu();
      CHECK(torch::all(whole.narrow(1, capacity, 2) == -7.0).item<bool>());
    }
  }
  auto logits = torch::randn({2, 100}, on_gpu(torch::kFloat));
  auto counters = torch::zeros({2}, on_gpu(torch::kInt));
  CHECK_THROWS_WITH_AS(fused::greedy_record(logits, torch::zeros({3}, on_gpu(torch::kLong)),
                                            torch::zeros({2, 4, 2}, on_gpu(torch::kDouble)), counters),
                       doctest::Contains("next must be"), c10::Error);
  CHECK_THROWS_WITH_AS(fused::greedy_record(logits, torch::zeros({2}, on_gpu(torch::kLong)),
                                            torch::zeros({2, 4, 2}, on_gpu(torch::kFloat)), counters),
                       doctest::Contains("history must be"), c10::Error);
}

TEST_CASE("greedy_head samples the normed row's logits as greedy_logprob samples them rounded from float64") {
  torch::manual_seed(19);
  torch::NoGradGuard g;
  for (auto dtype : all_dtypes) {
    for (auto [k, vocab] : {std::pair<std::int64_t, std::int64_t>{896, 151936}, {64, 1001}, {4096, 5003}}) {
      const std::string what = std::string(c10::toString(dtype)) + " k " + std::to_string(k) + " vocab " +
                               std::to_string(vocab);
      CAPTURE(what);
      auto residual = (2.0 * torch::randn({1, k}, on_gpu(torch::kFloat))).to(dtype);
      auto norm_weight = (1.0 + 0.1 * torch::randn({k}, on_gpu(torch::kFloat))).to(dtype);
      auto weight = (0.1 * torch::randn({vocab, k}, on_gpu(torch::kFloat))).to(dtype);
      const double eps = 1e-6;
      // The reference: the same normed row (add_rms_norm), logits in float64 rounded to the dtype.
      auto copy = residual.clone();
      auto xn = fused::add_rms_norm(torch::Tensor{}, copy, norm_weight, eps);
      auto want_logits = at::linear(xn.to(torch::kDouble), weight.to(torch::kDouble)).to(dtype);
      auto [want_token, want_lp] = fused::greedy_logprob(want_logits.contiguous());
      auto lengths = torch::full({1}, 41, on_gpu(torch::kLong));
      auto next = torch::full({1}, -1, on_gpu(torch::kLong));
      auto history = torch::full({1, 4, 2}, -7.0, on_gpu(torch::kDouble));
      auto counters = torch::tensor({2, 0}, on_gpu(torch::kInt));
      REQUIRE(fused::greedy_head_ready(dtype, k, vocab));
      for (int call = 0; call < 2; ++call)
        fused::greedy_head(residual, norm_weight, eps, weight, lengths, next, history, counters);
      const auto token = next.item<std::int64_t>();
      const auto want = want_token.item<std::int64_t>();
      auto ref = want_logits.to(torch::kFloat).squeeze(0);
      // Float32 sums in another order may move a logit by one rounding step of the dtype: the
      // token is the reference's or within that step of its maximum.
      const double top = ref.max().item<double>();
      const double step = dtype == torch::kFloat ? 1e-4 * std::abs(top) : std::abs(top) * (dtype == torch::kHalf ? 0x1p-10 : 0x1p-7);
      CHECK(ref[token].item<double>() >= top - 2 * step);
      auto sorted = std::get<0>(ref.topk(2));
      if (sorted[0].item<double>() - sorted[1].item<double>() > 4 * step)
        CHECK(token == want);
      auto want_at = torch::log_softmax(ref, -1)[token].item<double>();
      auto h = history.cpu();
      CHECK(h[0][2][0].item<double>() == static_cast<double>(token));
      CHECK(h[0][3][0].item<double>() == static_cast<double>(token));
      CHECK(std::abs(h[0][2][1].item<double>() - want_at) <= (dtype == torch::kFloat ? 1e-4 : 3e-2));
      CHECK(h[0][0][0].item<double>() == -7.0);
      CHECK(lengths.item<std::int64_t>() == 43);
      auto c = counters.cpu();
      CHECK(c[0].item<int>() == 4);
      CHECK(c[1].item<int>() == 0);
      MESSAGE(what << ": token " << token << " (reference " << want << "), log-prob " << h[0][2][1].item<double>()
                   << " against " << want_lp.item<float>());
    }
  }
  auto residual = torch::randn({1, 64}, on_gpu(torch::kFloat));
  auto w = torch::ones({64}, on_gpu(torch::kFloat));
  auto counters = torch::zeros({2}, on_gpu(torch::kInt));
  CHECK_THROWS_WITH_AS(fused::greedy_head(residual, w, 1e-6, torch::randn({100, 63}, on_gpu(torch::kFloat)), {},
                                          torch::zeros({1}, on_gpu(torch::kLong)),
                                          torch::zeros({1, 4, 2}, on_gpu(torch::kDouble)), counters),
                       doctest::Contains("weight must be"), c10::Error);
}
