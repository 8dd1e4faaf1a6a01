// tests/gpu/gpu_kernels_util.hpp: what the fused kernels' GPU tests share (test_gpu_kernels.cpp,
// test_gpu_fused_step.cpp): dtypes and tolerances, a closeness check that reports its margin, tiny
// model configs, a float64 attention reference.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include "policy/model/engine.hpp"
#include "policy/kernels/fused.hpp"
#include "policy/kernels/kernels.hpp"
#include "policy/model/model.hpp"
#include "policy/runtime.hpp"
#include "../unit/policy/policy_test_util.hpp"

namespace crucible::policy::gpu_testing {

using namespace crucible::policy::testing;

inline const torch::ScalarType all_dtypes[] = {torch::kFloat, torch::kHalf, torch::kBFloat16};

inline torch::TensorOptions on_gpu(torch::ScalarType dtype) {
  return torch::TensorOptions().dtype(dtype).device(torch::kCUDA, 0);
}

// Relative tolerance per dtype: two units in the last place of float16 and bfloat16 (a rounding
// point seeing an input one unit off), float32 for sums taken in another order.
inline double rtol(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kHalf: return std::ldexp(1.0, -9);
    case torch::kBFloat16: return std::ldexp(1.0, -6);
    default: return 1e-5;
  }
}

// Every element of `got` within atol + rtol * |want|; reports the worst excess and the share of
// elements that are bit for bit equal.
inline void check_close(const torch::Tensor& got, const torch::Tensor& want, double rel, double atol, const std::string& what) {
  REQUIRE_MESSAGE(got.sizes() == want.sizes(), what << ": shape " << got.sizes() << " vs " << want.sizes());
  auto g = got.to(torch::kCPU, torch::kDouble), w = want.to(torch::kCPU, torch::kDouble);
  auto excess = ((g - w).abs() - (atol + rel * w.abs())).max().item<double>();
  auto exact = (got.to(torch::kCPU) == want.to(torch::kCPU, got.scalar_type())).to(torch::kDouble).mean().item<double>();
  MESSAGE(what << ": max excess over tolerance " << excess << ", bitwise equal " << 100.0 * exact << "%");
  CHECK_MESSAGE(excess <= 0.0, what);
}

inline torch::Tensor rotate_half(const torch::Tensor& x) {
  auto half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

inline kv_cache deep_copy(const kv_cache& c) {
  kv_cache out;
  for (std::size_t l = 0; l < c.keys.size(); ++l) {
    out.keys.push_back(c.keys[l].clone());
    out.values.push_back(c.values[l].clone());
  }
  out.lengths = c.lengths.clone();
  return out;
}

inline model_config tiny_config(model_family family, std::int64_t hidden, std::int64_t heads, std::int64_t kv_heads) {
  auto c = preset_config("tiny", family, 1000);
  REQUIRE(c.ok());
  c->hidden_size = hidden;
  c->num_heads = heads;
  c->num_kv_heads = kv_heads;
  c->head_dim = hidden / heads;
  c->num_layers = 3;
  c->intermediate_size = 2 * hidden + 64;
  return *c;
}

// softmax(q k^T / sqrt(d)) v over slots [0, min(length + 1, slots)) in float64, query head h on
// KV head h / group; rows with no visible slot (length -1) are zeros, as the kernel writes them.
inline torch::Tensor attention_reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& lengths) {
  const auto rows = q.size(0), heads = q.size(1), dim = q.size(2), slots = k.size(2);
  const auto group = heads / k.size(1);
  auto qd = q.to(torch::kDouble), kd = k.to(torch::kDouble).repeat_interleave(group, 1),
       vd = v.to(torch::kDouble).repeat_interleave(group, 1);
  auto scores = (qd.unsqueeze(2) * kd).sum(-1) / std::sqrt(static_cast<double>(dim)); // [R, H, S]
  auto visible = torch::arange(slots, lengths.options()).view({1, 1, slots}) <= lengths.view({rows, 1, 1});
  auto p = scores.masked_fill(visible.logical_not(), -INFINITY).softmax(-1).nan_to_num(0.0);
  return (p.unsqueeze(-1) * vd).sum(2).reshape({rows, heads * dim});
}

// The decoding variants with the one-row projections' single round of weight loads
// (kernels::decode_options::small_gemm_one_round) and gate/up's unit a half-warp
// (small_gemm_half_warps) both on (the defaults) or both off.
inline kernels::decode_options projections(bool on) {
  kernels::decode_options o;
  o.small_gemm_one_round = on;
  o.small_gemm_half_warps = on;
  return o;
}

// ||got - want|| / ||want|| over all elements.
inline double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  auto w = want.to(torch::kCPU, torch::kDouble);
  return (got.to(torch::kCPU, torch::kDouble) - w).norm().item<double>() / w.norm().item<double>();
}

} // namespace crucible::policy::gpu_testing
