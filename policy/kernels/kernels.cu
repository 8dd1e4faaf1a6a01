// policy/kernels/kernels.cu: the fused kernels of a decoding step (see policy/kernels/kernels.hpp)
// but its attention: residual add + RMSNorm, RoPE with the KV-cache write, silu * up, the small
// GEMMs of a few rows with their neighbours fused, greedy sampling, and the final norm, output
// matrix and sampling of one row; with the decoding switches' setters. Called by
// policy/kernels/fused.cpp, which checks shapes. The elementwise kernels are plain loops, one block
// per row or head, float32 arithmetic with the reference's rounding points spelled out (__fmul_rn
// and __fadd_rn are never contracted to FMA). The attention is in decode_attention.cu, the
// learner's kernels in train_kernels.cu, what they share in kernel_launch.cuh.
#include "policy/kernels/kernel_launch.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

namespace crucible::policy::kernels {

using namespace detail;

namespace {

// ---- residual add + RMSNorm ---------------------------------------------------------------------

constexpr int norm_threads = 256;

template <class T>
__global__ void add_rms_norm_kernel(const T* __restrict__ delta, T* __restrict__ residual, const T* __restrict__ weight,
                                    T* __restrict__ out, int dim, float eps, float inv_dim) {
  __shared__ float scratch[32];
  const long long base = static_cast<long long>(blockIdx.x) * dim;
  T* res = residual + base;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = to_float(res[i]);
    if (delta != nullptr) {
      const T r = from_float<T>(__fadd_rn(v, to_float(delta[base + i]))); // x + delta, in T
      res[i] = r;
      v = to_float(r);
    }
    sum += __fmul_rn(v, v); // h.pow(2): a rounded square, then the mean's sum
  }
  const float r = rms_inverse(block_sum(sum, scratch), inv_dim, eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    out[base + i] = rms_normed<T>(to_float(res[i]), to_float(weight[i]), r);
}

// ---- RoPE + KV-cache write ----------------------------------------------------------------------

// Where head `head` (q heads, then k heads, then v heads) of row `row` goes: q_out, or the cache
// slot at position `pos`; null for a key or value whose position is outside the cache.
template <class T>
__device__ __forceinline__ T* rope_destination(const rope_kv_args& a, long long row, long long head, long long pos) {
  if (head < a.heads)
    return static_cast<T*>(a.q_out) + (row * a.heads + head) * a.head_dim;
  if (pos < 0 || pos >= a.slots)
    return nullptr;
  const bool value = head >= a.heads + a.kv_heads;
  const long long kv_head = head - a.heads - (value ? a.kv_heads : 0);
  return static_cast<T*>(value ? a.v_cache : a.k_cache) + row * a.row_stride + kv_head * a.head_stride
         + pos * a.slot_stride;
}

constexpr int rope_threads = 128;

// One block per (head of q, k or v, row). blockIdx.x: q heads [0, heads), then k heads, then v heads.
template <class T>
__global__ void rope_kv_kernel(rope_kv_args a) {
  const T* qkv = static_cast<const T*>(a.qkv);
  const int head = blockIdx.x;
  const long long row = blockIdx.y;
  const int d = static_cast<int>(a.head_dim), half = d / 2;
  const int heads = static_cast<int>(a.heads), kv_heads = static_cast<int>(a.kv_heads);
  const long long width = static_cast<long long>(heads + 2 * kv_heads) * d;
  const T* src = qkv + row * width + static_cast<long long>(head) * d; // this head's d inputs
  const T* bias = a.qkv_bias == nullptr ? nullptr
                                         : static_cast<const T*>(a.qkv_bias) + static_cast<long long>(head) * d;
  // qkv + bias in T, as a projection's output with its bias added in a kernel of its own.
  auto input = [&](int i) {
    return bias == nullptr ? to_float(src[i]) : rounded<T>(__fadd_rn(to_float(src[i]), to_float(bias[i])));
  };
  const long long pos = a.lengths[row];
  T* dst = rope_destination<T>(a, row, head, pos);
  if (dst == nullptr)
    return;
  if (head >= heads + kv_heads) { // values: copied to the cache as they are (with the bias)
    for (int i = threadIdx.x; i < d; i += blockDim.x)
      dst[i] = from_float<T>(input(i)); // exact without a bias: T to float and back
    return;
  }
  const float* inv = a.inv_freq + row * a.inv_row_stride;
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    rope_pair<T>(input(i), input(i + half), static_cast<float>(pos), inv[i], a.attention_scaling, dst, i, half);
}

// ---- SiLU * mul ---------------------------------------------------------------------------------

constexpr int silu_threads = 256;

template <class T>
__global__ void silu_mul_kernel(const T* __restrict__ gate_up, T* __restrict__ out, long long rows, long long inter) {
  const long long total = rows * inter;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long r = i / inter, c = i - r * inter;
    const float g = to_float(gate_up[r * 2 * inter + c]);
    const float u = to_float(gate_up[r * 2 * inter + inter + c]);
    out[i] = silu_times<T>(g, u);
  }
}

// ---- small GEMMs: projections of a few rows with their neighbours fused -------------------------
//
// A warp computes two output rows (a "unit": rows 2u and 2u + 1, or the gate and up rows of one
// intermediate column, or the pair of a head's rows that RoPE rotates together), its lanes
// reading 16 bytes of each weight row at a time, four loads of each in flight; `split` warps of
// the block share a unit's k when units are too few to fill the device. The block first stages
// its inputs (rows x k, normalised when a norm weight is given) in shared memory as the storage
// type, which is what the LibTorch ops would hand the GEMM.

constexpr int small_gemm_threads = 128;
constexpr int small_gemm_warps = small_gemm_threads / 32;
constexpr int small_gemm_max_rows = 4;
constexpr std::size_t small_gemm_max_shared = 48 * 1024;

enum class gemm_out { residual_add, silu_mul, rope_kv };

// One row's attention output staged as T (k / vec 16-byte vectors) from the `used` splits of
// partial sums a wide attention launch with merge_later left: per element, the splits' weighted
// values over their weighted sums against their common maximum, each product rounded and the
// products added in split order, as decode_attention_combine_kernel adds them (bit for bit where
// it gives every split a thread group of its own: used <= 2 * combine_threads / head_dim). All of
// a thread's loads are issued before any arithmetic. `out` and `ml_all`: the row's partial_out
// and partial_ml.
template <class T>
__device__ __forceinline__ void merge_attention_splits(const float* out, const float* ml_all, long long splits, int d,
                                                       long long used, int kv, uint4* staged) {
  constexpr int vec = 16 / sizeof(T), quads = vec / 4, most = decode_attention_merge_max_splits;
  for (int i = threadIdx.x; i < kv; i += blockDim.x) {
    const int e0 = i * vec, head = e0 / d;
    const float* ml = ml_all + head * splits * 2;
    const float4* po = reinterpret_cast<const float4*>(out + head * splits * d + (e0 - head * d));
    float m[most], l[most];
    float4 x[most][quads];
#pragma unroll
    for (int s = 0; s < most; ++s) {
      if (s < used) {
        m[s] = ml[2 * s];
        l[s] = ml[2 * s + 1];
#pragma unroll
        for (int q = 0; q < quads; ++q)
          x[s][q] = po[s * (d / 4) + q];
      }
    }
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < most; ++s)
      if (s < used)
        mx = fmaxf(mx, m[s]);
    float total[vec], weight = 0.0f;
#pragma unroll
    for (int c = 0; c < vec; ++c)
      total[c] = 0.0f;
#pragma unroll
    for (int s = 0; s < most; ++s) {
      if (s < used) {
        const float f = exp2f(m[s] - mx);
        const float* xs = reinterpret_cast<const float*>(x[s]);
#pragma unroll
        for (int c = 0; c < vec; ++c)
          total[c] = __fadd_rn(total[c], __fmul_rn(f, xs[c]));
        weight = __fadd_rn(weight, __fmul_rn(f, l[s]));
      }
    }
    uint4 o;
    T* op = reinterpret_cast<T*>(&o);
#pragma unroll
    for (int c = 0; c < vec; ++c)
      op[c] = from_float<T>(weight > 0.0f ? total[c] / weight : 0.0f); // weight 0: no slot visible
    staged[i] = o;
  }
}

// The unit's two weight rows (b < 0: none, n odd).
template <gemm_out MODE>
__device__ __forceinline__ void unit_rows(const small_gemm_args& a, long long unit, long long& ra, long long& rb) {
  if constexpr (MODE == gemm_out::residual_add) {
    ra = 2 * unit;
    rb = ra + 1 < a.n ? ra + 1 : -1;
  } else if constexpr (MODE == gemm_out::silu_mul) {
    ra = unit;
    rb = a.n / 2 + unit;
  } else {
    const long long half = a.rope.head_dim / 2, head = unit / half, i = unit - head * half;
    ra = head * a.rope.head_dim + i;
    rb = ra + half;
  }
}

template <gemm_out MODE>
__host__ __device__ __forceinline__ long long gemm_units(const small_gemm_args& a) {
  if constexpr (MODE == gemm_out::residual_add)
    return (a.n + 1) / 2;
  else
    return a.n / 2;
}

// R: rows the kernel is compiled for (1, or up to small_gemm_max_rows with a.rows of them used).
// U: 16-byte loads of each weight row a lane keeps in flight (8 lets one round cover a long k).
// HALF: each half-warp takes a unit (one row, split 1; decode_options::small_gemm_half_warps), so that a
// block holds eight units and one wave of blocks the gate/up projection's 4864 of Qwen2.5-0.5B.
template <class T, int R, gemm_out MODE, int U, bool HALF, bool TIMED, bool MERGE>
__device__ __forceinline__ void small_gemm(const small_gemm_args& a, int split) {
  static_assert(!MERGE || (R == 1 && MODE == gemm_out::residual_add), "attention splits are merged for one row's o projection");
  static_assert(!HALF || R == 1, "a half-warp unit serves one row");
  extern __shared__ uint4 staged[]; // [rows][k] of T
  __shared__ float partial[small_gemm_warps][2][R];
  __shared__ float scratch[32];
  constexpr int vec = 16 / sizeof(T);
  const int rows = R == 1 ? 1 : static_cast<int>(a.rows);
  const int k = static_cast<int>(a.k), kv = k / vec;
  const uint4* x = static_cast<const uint4*>(a.x);
  if (a.early_launch)
    grid_dependents_launch(); // the next kernel's blocks may take free SMs and load their weights now

  // 1. The first loads of the unit's weight rows, before waiting for the previous kernel: weights
  // are no kernel's output, so under programmatic dependent launch these overlap its tail.
  constexpr int unit_lanes = HALF ? 16 : 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ulane = HALF ? lane & 15 : lane; // the lane within its unit
  const int per_block = small_gemm_warps / split, s = warp % split;
  const long long unit = HALF ? (static_cast<long long>(blockIdx.x) * small_gemm_warps + warp) * 2 + (lane >> 4)
                              : static_cast<long long>(blockIdx.x) * per_block + warp / split;
  const bool valid = unit < gemm_units<MODE>(a);
  long long ra = 0, rb = -1;
  if (valid)
    unit_rows<MODE>(a, unit, ra, rb);
  const uint4* wa = static_cast<const uint4*>(a.weight) + ra * kv;
  const uint4* wb = static_cast<const uint4*>(a.weight) + (rb < 0 ? ra : rb) * kv;
  const int stride = unit_lanes * split;
  uint4 la[U], lb[U];
  auto load = [&](int v0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = v0 + u * stride;
      if (valid && v < kv) {
        la[u] = __ldg(wa + v);
        lb[u] = __ldg(wb + v);
      }
    }
  };
  int v0 = s * unit_lanes + ulane;
  load(v0);

  // What lane r (< rows) of a unit's first warp needs at the end for input row r: the bias (a
  // weight) before the wait; the residual entries (residual_add) or RoPE's position, frequency and
  // so its cos and sin (rope_kv) before it too when no kernel that may still run writes them
  // (state_early, below), else right after it, in flight while the inputs are staged.
  const bool finisher = valid && ulane < rows && s == 0;
  const T* bias = static_cast<const T*>(a.bias);
  float bias_a = 0.0f, bias_b = 0.0f;
  if (finisher && bias != nullptr) {
    bias_a = to_float(bias[ra]);
    if (rb >= 0)
      bias_b = to_float(bias[rb]);
  }
  float res_a = 0.0f, res_b = 0.0f, rope_c = 0.0f, rope_s = 0.0f;
  long long pos = 0;
  auto read_state = [&] {
    if (!finisher)
      return;
    const long long row = ulane;
    if constexpr (MODE == gemm_out::residual_add) {
      const T* res = static_cast<const T*>(a.residual) + row * a.n;
      res_a = to_float(res[ra]);
      if (rb >= 0)
        res_b = to_float(res[rb]);
    } else if constexpr (MODE == gemm_out::rope_kv) {
      const long long half = a.rope.head_dim / 2;
      pos = a.rope.lengths[row];
      const float inv = a.rope.inv_freq[row * a.rope.inv_row_stride + unit % half];
      rope_cos_sin<T>(static_cast<float>(pos), inv, a.rope.attention_scaling, rope_c, rope_s); // before the wait with early reads
    }
  };
  // With the early launch at the start, the kernels two and more back may still run when this one
  // begins (every block of the kernel just before may have started, and so launched this one,
  // before any of them waited): the residual, which the o and down projections write, is then read
  // after the wait. No kernel of a step writes RoPE's lengths or frequencies.
  const bool state_early = a.early_reads && !(MODE == gemm_out::residual_add && a.early_launch);
  if (state_early)
    read_state();
  // MERGE: the attention's splits that hold slots of the row; no kernel of a step writes lengths.
  long long used = 0;
  auto read_used = [&] {
    const auto& at = a.attention;
    used = decode_attention_used_splits(decode_attention_visible(at.lengths[0], at.slots), at.chunk);
    used = used < at.splits ? used : at.splits;
  };
  if (MERGE && a.early_reads)
    read_used();
  grid_dependency_wait();
  if constexpr (TIMED)
    timeline_stamp(a.timeline, 1);
  if (!state_early)
    read_state();
  if (MERGE && !a.early_reads)
    read_used();

  // 2. Inputs into shared memory: merged from the attention's splits, copied, or RMSNorm of the
  // residual rows rounded as add_rms_norm's.
  if constexpr (MERGE) {
    const auto& at = a.attention;
    merge_attention_splits<T>(at.out, at.ml, at.splits, static_cast<int>(at.head_dim), used, kv, staged);
  } else if (a.norm_weight == nullptr) {
    if (MODE == gemm_out::residual_add && a.batched_staging) { // every load of a thread in flight before the first store
      constexpr int most = 8;
      for (int base = threadIdx.x; base < rows * kv; base += most * blockDim.x) {
        uint4 v[most];
#pragma unroll
        for (int j = 0; j < most; ++j)
          if (base + j * static_cast<int>(blockDim.x) < rows * kv)
            v[j] = x[base + j * blockDim.x];
#pragma unroll
        for (int j = 0; j < most; ++j)
          if (base + j * static_cast<int>(blockDim.x) < rows * kv)
            staged[base + j * blockDim.x] = v[j];
      }
    } else {
      for (int i = threadIdx.x; i < rows * kv; i += blockDim.x)
        staged[i] = x[i];
    }
  } else {
    const uint4* nw = static_cast<const uint4*>(a.norm_weight);
    const float inv_k = 1.0f / static_cast<float>(k);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= rows)
        break;
      float sum = 0.0f;
      for (int i = threadIdx.x; i < kv; i += blockDim.x) {
        const uint4 v = x[r * kv + i];
#pragma unroll
        for (int e = 0; e < vec; ++e) {
          const float f = element<T>(v, e);
          sum += __fmul_rn(f, f);
        }
      }
      const float inv = rms_inverse(block_sum(sum, scratch), inv_k, a.eps);
      for (int i = threadIdx.x; i < kv; i += blockDim.x) {
        const uint4 v = x[r * kv + i], w = nw[i];
        uint4 o;
        T* op = reinterpret_cast<T*>(&o);
#pragma unroll
        for (int e = 0; e < vec; ++e)
          op[e] = rms_normed<T>(element<T>(v, e), element<T>(w, e), inv);
        staged[r * kv + i] = o;
      }
    }
  }
  __syncthreads();
  if constexpr (TIMED)
    timeline_stamp(a.timeline, 2);
  if (!a.early_launch)
    grid_dependents_launch(); // the next kernel's weight loads may start

  // 3. Two rows' dot products with every input row.
  float acc_a[R], acc_b[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    acc_a[r] = acc_b[r] = 0.0f;
  while (valid && v0 < kv) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = v0 + u * stride;
      if (v < kv) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r < rows) {
            const uint4 xr = staged[r * kv + v];
            acc_a[r] = dot16<T>(la[u], xr, acc_a[r]);
            acc_b[r] = dot16<T>(lb[u], xr, acc_b[r]);
          }
        }
      }
    }
    v0 += stride * U;
    load(v0);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if constexpr (HALF) {
#pragma unroll
      for (int offset = 8; offset > 0; offset >>= 1) { // within the half-warp
        acc_a[r] += __shfl_xor_sync(0xffffffffu, acc_a[r], offset);
        acc_b[r] += __shfl_xor_sync(0xffffffffu, acc_b[r], offset);
      }
    } else {
      acc_a[r] = warp_sum(acc_a[r]);
      acc_b[r] = warp_sum(acc_b[r]);
    }
  }
  if (split > 1) { // the unit's warps add their parts of k, in a fixed order
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        partial[warp][0][r] = acc_a[r];
        partial[warp][1][r] = acc_b[r];
      }
    }
    __syncthreads();
    if (s != 0)
      return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float ta = 0.0f, tb = 0.0f;
      for (int j = 0; j < split; ++j) {
        ta += partial[warp + j][0][r];
        tb += partial[warp + j][1][r];
      }
      acc_a[r] = ta;
      acc_b[r] = tb;
    }
  }
  if (!valid || ulane >= rows)
    return;

  // 4. Lane r (of the unit) finishes input row r.
  float da = 0.0f, db = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r == ulane) {
      da = acc_a[r];
      db = acc_b[r];
    }
  const long long row = ulane;
  // linear(x) + bias rounded once, as LibTorch's addmm epilogue does.
  const float ya = rounded<T>(bias == nullptr ? da : __fadd_rn(da, bias_a));
  const float yb = rb < 0 ? 0.0f : rounded<T>(bias == nullptr ? db : __fadd_rn(db, bias_b));
  if constexpr (MODE == gemm_out::residual_add) {
    T* res = static_cast<T*>(a.residual) + row * a.n;
    res[ra] = from_float<T>(__fadd_rn(res_a, ya));
    if (rb >= 0)
      res[rb] = from_float<T>(__fadd_rn(res_b, yb));
  } else if constexpr (MODE == gemm_out::silu_mul) {
    static_cast<T*>(a.out)[row * (a.n / 2) + unit] = silu_times<T>(ya, yb);
  } else {
    const rope_kv_args& p = a.rope;
    const long long half = p.head_dim / 2, head = unit / half, i = unit - head * half;
    T* dst = rope_destination<T>(p, row, head, pos);
    if (dst == nullptr)
      return;
    if (head >= p.heads + p.kv_heads) { // a value: to the cache as it is
      dst[i] = from_float<T>(ya);
      dst[i + half] = from_float<T>(yb);
      return;
    }
    rope_rotate_pair<T>(ya, yb, rope_c, rope_s, dst, i, half);
  }
}

// TIMED: the blocks record their times in a.timeline (decode_options::timeline); a separate
// instantiation, so that the kernels otherwise run are compiled as if it did not exist. MERGE:
// the input is a.attention's splits (one row's o projection).
template <class T, int R, gemm_out MODE, int U, bool HALF = false, bool TIMED = false, bool MERGE = false>
__global__ void __launch_bounds__(small_gemm_threads) small_gemm_kernel(small_gemm_args a, int split) {
  if constexpr (TIMED)
    timeline_stamp(a.timeline, 0);
  small_gemm<T, R, MODE, U, HALF, TIMED, MERGE>(a, split);
  if constexpr (TIMED)
    timeline_ended(a.timeline);
}

// ---- greedy sampling with the token's log-prob ---------------------------------------------------

constexpr int greedy_threads = 256;

// grid (blocks, rows): block b of row r reduces a contiguous piece of the row.
template <class T>
__global__ void __launch_bounds__(greedy_threads) greedy_partial_kernel(const T* __restrict__ logits, long long vocab,
                                                                         float* __restrict__ partial) {
  grid_dependency_wait();
  grid_dependents_launch();
  const long long row = blockIdx.y, piece = (vocab + gridDim.x - 1) / gridDim.x;
  const long long begin = blockIdx.x * piece, end = begin + piece < vocab ? begin + piece : vocab;
  const T* x = logits + row * vocab;
  greedy_part p{-INFINITY, -1, 0.0f};
  for (long long i = begin + threadIdx.x; i < end; i += blockDim.x)
    add(p, to_float(x[i]), i);
  p = block_merge(p);
  if (threadIdx.x == 0) {
    float* out = partial + (row * gridDim.x + blockIdx.x) * 3;
    out[0] = p.max;
    out[1] = __int_as_float(static_cast<int>(p.index)); // an index below 2^31, kept bit for bit
    out[2] = p.sum;
  }
}

__global__ void __launch_bounds__(greedy_threads) greedy_combine_kernel(const float* __restrict__ partial, int blocks,
                                                                         long long* __restrict__ tokens,
                                                                         float* __restrict__ logprobs,
                                                                         greedy_record record) {
  grid_dependency_wait();
  grid_dependents_launch();
  const long long row = blockIdx.x;
  greedy_part p{-INFINITY, -1, 0.0f};
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
    const float* in = partial + (row * blocks + b) * 3;
    const long long index = __float_as_int(in[1]);
    if (index >= 0)
      p = merge(p, greedy_part{in[0], index, in[2]});
  }
  p = block_merge(p);
  if (threadIdx.x == 0) {
    const long long token = p.index < 0 ? 0 : p.index;
    // log_softmax at the maximum: (x - max) - log(sum) with x - max = 0; all -inf or NaN rows give NaN as torch's.
    const float lp = p.max == -INFINITY || p.max != p.max ? NAN : -logf(p.sum);
    tokens[row] = token;
    logprobs[row] = lp;
    if (record.history != nullptr) {
      const int step = *static_cast<volatile int*>(record.step);
      if (step < record.capacity) {
        double* slot = record.history + row * record.row_stride + 2LL * step;
        slot[0] = static_cast<double>(token);
        slot[1] = static_cast<double>(lp);
      }
      // Every row has read the step before the last one to finish advances it.
      __threadfence();
      if (atomicAdd(record.done, 1u) == gridDim.x - 1) {
        *record.done = 0;
        *static_cast<volatile int*>(record.step) = step + 1;
      }
    }
  }
}

// ---- the final norm, the output matrix and greedy sampling of one row ----------------------------

constexpr int greedy_head_threads = 256;
constexpr int greedy_head_loads = 4; // 16-byte loads of each weight row a lane has in flight a round

template <class T>
__global__ void __launch_bounds__(greedy_head_threads) greedy_head_kernel(greedy_head_args a) {
  extern __shared__ uint4 staged[]; // xn, [k] of T
  __shared__ float scratch[32];
  __shared__ bool last;
  constexpr int vec = 16 / sizeof(T), U = greedy_head_loads;
  const int kv = static_cast<int>(a.k) / vec;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const long long units = (a.vocab + 1) / 2, all_warps = static_cast<long long>(gridDim.x) * warps;
  const uint4* w = static_cast<const uint4*>(a.weight);
  uint4 la[U], lb[U];
  // Round v0 of unit u's two rows (the second row is the first again where the vocabulary is odd).
  auto load = [&](long long u, int v0) {
    const long long ra = 2 * u, rb = ra + 1 < a.vocab ? ra + 1 : ra;
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int v = v0 + i * 32;
      if (u < units && v < kv) {
        la[i] = __ldg(w + ra * kv + v);
        lb[i] = __ldg(w + rb * kv + v);
      }
    }
  };
  long long unit = static_cast<long long>(blockIdx.x) * warps + warp;
  load(unit, lane); // weights: no kernel's output, loaded before the wait
  grid_dependents_launch();
  grid_dependency_wait();

  // xn into shared memory, rounded as add_rms_norm rounds it.
  const uint4* x = static_cast<const uint4*>(a.x);
  const uint4* nw = static_cast<const uint4*>(a.norm_weight);
  float sum = 0.0f;
  for (int i = threadIdx.x; i < kv; i += blockDim.x) {
    const uint4 v = x[i];
#pragma unroll
    for (int e = 0; e < vec; ++e) {
      const float f = element<T>(v, e);
      sum += __fmul_rn(f, f);
    }
  }
  const float inv = rms_inverse(block_sum(sum, scratch), 1.0f / static_cast<float>(a.k), a.eps);
  for (int i = threadIdx.x; i < kv; i += blockDim.x) {
    const uint4 v = x[i], nwv = nw[i];
    uint4 o;
    T* op = reinterpret_cast<T*>(&o);
#pragma unroll
    for (int e = 0; e < vec; ++e)
      op[e] = rms_normed<T>(element<T>(v, e), element<T>(nwv, e), inv);
    staged[i] = o;
  }
  __syncthreads();

  // Each warp's units, the next one's first round loaded before this one's sums are reduced.
  greedy_part best{-INFINITY, -1, 0.0f};
  for (; unit < units; unit += all_warps) {
    float da = 0.0f, db = 0.0f;
    for (int v0 = lane; v0 < kv; v0 += 32 * U) {
      if (v0 != lane)
        load(unit, v0);
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const int v = v0 + i * 32;
        if (v < kv) {
          const uint4 xs = staged[v];
          da = dot16<T>(la[i], xs, da);
          db = dot16<T>(lb[i], xs, db);
        }
      }
    }
    load(unit + all_warps, lane);
    da = warp_sum(da);
    db = warp_sum(db);
    if (lane == 0) {
      const long long ra = 2 * unit;
      add(best, rounded<T>(da), ra);
      if (ra + 1 < a.vocab)
        add(best, rounded<T>(db), ra + 1);
    }
  }
  best = block_merge(best);
  if (threadIdx.x == 0) {
    float* out = a.partial + static_cast<long long>(blockIdx.x) * 3;
    out[0] = best.max;
    out[1] = __int_as_float(static_cast<int>(best.index)); // an index below 2^31, kept bit for bit
    out[2] = best.sum;
    __threadfence();
    last = atomicAdd(a.done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last)
    return;
  __threadfence();
  // The last block: every block's triple, merged as greedy_combine_kernel merges them.
  greedy_part p{-INFINITY, -1, 0.0f};
  for (int b = threadIdx.x; b < static_cast<int>(gridDim.x); b += blockDim.x) {
    const float* in = a.partial + static_cast<long long>(b) * 3;
    const long long index = __float_as_int(__ldcg(in + 1));
    if (index >= 0)
      p = merge(p, greedy_part{__ldcg(in), index, __ldcg(in + 2)});
  }
  p = block_merge(p);
  if (threadIdx.x == 0) {
    const long long token = p.index < 0 ? 0 : p.index;
    const float lp = p.max == -INFINITY || p.max != p.max ? NAN : -logf(p.sum);
    a.token[0] = token;
    a.logprob[0] = lp;
    const greedy_record& record = a.record;
    if (record.history != nullptr) {
      const int step = *record.step;
      if (step < record.capacity) {
        record.history[2LL * step] = static_cast<double>(token);
        record.history[2LL * step + 1] = static_cast<double>(lp);
      }
      *record.step = step + 1;
    }
    if (a.lengths != nullptr)
      a.lengths[0] += 1;
    *a.done = 0;
  }
}

} // namespace

cudaError_t add_rms_norm(dtype t, const void* delta, void* residual, const void* weight, void* out, std::int64_t rows,
                         std::int64_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0)
    return cudaSuccess;
  if (dim <= 0 || rows > 0x7fffffff || dim > 0x7fffffff)
    return cudaErrorInvalidValue;
  // LibTorch's mean multiplies the sum by the float (rows / (rows * dim)), i.e. 1 / dim rounded.
  const float inv_dim = 1.0f / static_cast<float>(dim);
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    add_rms_norm_kernel<T><<<static_cast<unsigned>(rows), norm_threads, 0, stream>>>(
      static_cast<const T*>(delta), static_cast<T*>(residual), static_cast<const T*>(weight), static_cast<T*>(out),
      static_cast<int>(dim), eps, inv_dim);
    return cudaGetLastError();
  });
}

cudaError_t rope_kv_write(dtype t, const rope_kv_args& a, cudaStream_t stream) {
  if (a.rows <= 0)
    return cudaSuccess;
  if (a.head_dim <= 0 || a.head_dim % 2 != 0 || a.heads <= 0 || a.kv_heads <= 0 || a.rows > 65535)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(a.heads + 2 * a.kv_heads), static_cast<unsigned>(a.rows));
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rope_kv_kernel<T><<<grid, rope_threads, 0, stream>>>(a);
    return cudaGetLastError();
  });
}

cudaError_t silu_mul(dtype t, const void* gate_up, void* out, std::int64_t rows, std::int64_t inter, cudaStream_t stream) {
  if (rows <= 0 || inter <= 0)
    return cudaSuccess;
  const long long total = static_cast<long long>(rows) * inter;
  const long long blocks = std::min<long long>((total + silu_threads - 1) / silu_threads, 4096);
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    silu_mul_kernel<T><<<static_cast<unsigned>(blocks), silu_threads, 0, stream>>>(static_cast<const T*>(gate_up),
                                                                                  static_cast<T*>(out), rows, inter);
    return cudaGetLastError();
  });
}

namespace {

// Warps sharing one unit's k: more while the units leave the device under-filled (fewer than 16
// warps an SM) and each warp keeps at least two 16-byte loads a lane per row.
int small_gemm_split(long long units, long long kv, int sms) {
  int split = 1;
  const long long want = 16LL * std::max(sms, 1);
  while (split < small_gemm_warps && units * split < want && kv >= 128LL * split)
    split *= 2;
  return split;
}

template <gemm_out MODE>
cudaError_t launch_small_gemm(dtype t, const small_gemm_args& a, cudaStream_t stream, const decode_options& o) {
  if (a.rows <= 0)
    return cudaSuccess;
  if (!small_gemm_supported(t, a.rows, a.k) || a.n <= 0 || a.x == nullptr || a.weight == nullptr
      || reinterpret_cast<std::uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<std::uintptr_t>(a.weight) % 16 != 0
      || (a.norm_weight != nullptr && reinterpret_cast<std::uintptr_t>(a.norm_weight) % 16 != 0))
    return cudaErrorInvalidValue;
  if (MODE == gemm_out::residual_add && a.residual == nullptr)
    return cudaErrorInvalidValue;
  const auto& at = a.attention;
  const bool merge = at.out != nullptr;
  if (merge && (MODE != gemm_out::residual_add || a.rows != 1 || at.ml == nullptr || at.lengths == nullptr
                || at.slots < 1 || at.splits < 1 || at.splits > decode_attention_merge_max_splits || at.chunk <= 0
                || at.head_dim <= 0 || at.head_dim % static_cast<std::int64_t>(16 / element_bytes(t)) != 0
                || a.k % at.head_dim != 0 || reinterpret_cast<std::uintptr_t>(at.out) % 16 != 0))
    return cudaErrorInvalidValue;
  if (MODE == gemm_out::silu_mul && (a.out == nullptr || a.n % 2 != 0))
    return cudaErrorInvalidValue;
  if (MODE == gemm_out::rope_kv) {
    const auto& p = a.rope;
    if (p.head_dim <= 0 || p.head_dim % 2 != 0 || p.heads <= 0 || p.kv_heads <= 0 || p.q_out == nullptr
        || p.lengths == nullptr || p.inv_freq == nullptr || a.n != (p.heads + 2 * p.kv_heads) * p.head_dim)
      return cudaErrorInvalidValue;
  }
  const long long kv = a.k / static_cast<long long>(16 / element_bytes(t));
  const long long units = gemm_units<MODE>(a);
  const int split = small_gemm_split(units, kv, a.sms);
  // gate/up at one row: a unit a half-warp where its eight loads a lane cover k.
  const bool half = MODE == gemm_out::silu_mul && a.rows == 1 && split == 1 && kv <= 16LL * 8
                    && o.small_gemm_half_warps;
  const long long per_block = half ? 2LL * small_gemm_warps : small_gemm_warps / split;
  const long long blocks = (units + per_block - 1) / per_block;
  if (blocks > 0x7fffffff)
    return cudaErrorInvalidValue;
  const std::size_t shared = static_cast<std::size_t>(a.rows * a.k) * element_bytes(t);
  // One row: every lane's loads of a row in one round where four do not cover k.
  const bool eight_loads = a.rows == 1 && o.small_gemm_one_round && kv > 4LL * 32 * split;
  small_gemm_args args = a;
  args.early_reads = a.early_reads && o.early_reads;
  args.early_launch = launch_early_at(o, args.early_reads, a.rows);
  args.timeline = timeline_record(o, blocks, a.rows);
  args.batched_staging = a.rows == 1 && o.small_gemm_batched_staging;
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto one_row = [&](auto timed) {
      constexpr bool TIMED = decltype(timed)::value;
      if constexpr (MODE == gemm_out::silu_mul)
        if (half)
          return &small_gemm_kernel<T, 1, MODE, 8, true, TIMED>;
      if constexpr (MODE == gemm_out::residual_add)
        if (merge)
          return eight_loads ? &small_gemm_kernel<T, 1, MODE, 8, false, TIMED, true>
                             : &small_gemm_kernel<T, 1, MODE, 4, false, TIMED, true>;
      return eight_loads ? &small_gemm_kernel<T, 1, MODE, 8, false, TIMED> : &small_gemm_kernel<T, 1, MODE, 4, false, TIMED>;
    };
    auto kernel = a.rows != 1                ? &small_gemm_kernel<T, small_gemm_max_rows, MODE, 4>
                  : args.timeline != nullptr ? one_row(std::true_type{})
                                             : one_row(std::false_type{});
    return launch_early(kernel, dim3(static_cast<unsigned>(blocks)), dim3(small_gemm_threads), shared, stream, args,
                        split);
  });
}

} // namespace

bool small_gemm_supported(dtype t, std::int64_t rows, std::int64_t k) {
  const auto bytes = element_bytes(t);
  return rows >= 1 && rows <= small_gemm_max_rows && k > 0 && (k * static_cast<std::int64_t>(bytes)) % 16 == 0
         && static_cast<std::size_t>(rows * k) * bytes <= small_gemm_max_shared;
}

cudaError_t small_gemm_residual_add(dtype t, const small_gemm_args& a, cudaStream_t stream, const decode_options& o) {
  return launch_small_gemm<gemm_out::residual_add>(t, a, stream, o);
}

cudaError_t small_gemm_silu_mul(dtype t, const small_gemm_args& a, cudaStream_t stream, const decode_options& o) {
  return launch_small_gemm<gemm_out::silu_mul>(t, a, stream, o);
}

cudaError_t small_gemm_rope_kv(dtype t, const small_gemm_args& a, cudaStream_t stream, const decode_options& o) {
  return launch_small_gemm<gemm_out::rope_kv>(t, a, stream, o);
}

std::int64_t greedy_head_blocks(dtype t, std::int64_t k, std::int64_t vocab) {
  const auto bytes = static_cast<std::int64_t>(element_bytes(t));
  if (k <= 0 || (k * bytes) % 16 != 0 || static_cast<std::size_t>(k * bytes) > small_gemm_max_shared || vocab <= 0
      || vocab > 0x7fffffff)
    return 0;
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess
      || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  const auto shared = static_cast<std::size_t>(k * bytes);
  const cudaError_t e = dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, &greedy_head_kernel<T>, greedy_head_threads, shared);
  });
  if (e != cudaSuccess || per_sm < 1)
    return 0;
  const std::int64_t warps = greedy_head_threads / 32, units = (vocab + 1) / 2;
  return std::min<std::int64_t>(static_cast<std::int64_t>(sms) * per_sm, (units + warps - 1) / warps);
}

cudaError_t greedy_head(dtype t, const greedy_head_args& a, cudaStream_t stream) {
  const auto blocks = greedy_head_blocks(t, a.k, a.vocab);
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if (blocks < 1 || a.x == nullptr || a.norm_weight == nullptr || a.weight == nullptr || a.token == nullptr
      || a.logprob == nullptr || a.partial == nullptr || a.done == nullptr || !aligned(a.x) || !aligned(a.norm_weight)
      || !aligned(a.weight))
    return cudaErrorInvalidValue;
  if (a.record.history != nullptr && (a.record.step == nullptr || a.record.capacity < 1))
    return cudaErrorInvalidValue;
  const auto shared = static_cast<std::size_t>(a.k) * element_bytes(t);
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return launch_early(&greedy_head_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(greedy_head_threads), shared,
                        stream, a);
  });
}

std::int64_t greedy_logprob_blocks(std::int64_t vocab) {
  // About 1024 logits a block (four a thread), at most 256 blocks a row.
  return std::max<std::int64_t>(1, std::min<std::int64_t>(256, (vocab + 1023) / 1024));
}

cudaError_t greedy_logprob(dtype t, const void* logits, std::int64_t rows, std::int64_t vocab, std::int64_t* tokens,
                           float* logprobs, float* partial, std::int64_t blocks, cudaStream_t stream,
                           const greedy_record& record) {
  if (rows <= 0)
    return cudaSuccess;
  if (vocab <= 0 || vocab > 0x7fffffff || rows > 65535 || blocks < 1 || blocks > 65535 || logits == nullptr
      || tokens == nullptr || logprobs == nullptr || partial == nullptr)
    return cudaErrorInvalidValue;
  if (record.history != nullptr
      && (record.step == nullptr || record.done == nullptr || record.capacity < 1 || record.row_stride < 2 * record.capacity))
    return cudaErrorInvalidValue;
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (auto e = launch_early(&greedy_partial_kernel<T>, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(rows)),
                              dim3(greedy_threads), 0, stream, static_cast<const T*>(logits),
                              static_cast<long long>(vocab), partial);
        e != cudaSuccess)
      return e;
    return launch_early(&greedy_combine_kernel, dim3(static_cast<unsigned>(rows)), dim3(greedy_threads), 0, stream,
                        static_cast<const float*>(partial), static_cast<int>(blocks), reinterpret_cast<long long*>(tokens),
                        logprobs, record);
  });
}

} // namespace crucible::policy::kernels
