// policy/kernels.cu: the fused kernels of a decoding step and of the learner's training forward
// (output log-softmax, RMSNorm, RoPE, silu * up; see policy/kernels.hpp). Called by
// policy/fused.cpp, which checks shapes. The elementwise kernels are plain loops, one block per
// row or head, float32 arithmetic with the reference's rounding points spelled out (__fmul_rn
// and __fadd_rn are never contracted to FMA); the decode attention is written for latency (see
// its section).
#include "policy/kernels.hpp"
#include "policy/kernel_math.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <type_traits>
#include <utility>

namespace crucible::policy::kernels {

namespace {

// The sum (MAX false) or maximum (MAX true) over the block (blockDim.x a multiple of 32, at most
// 1024); every thread gets the result. `scratch` holds 32 floats.
template <bool MAX>
__device__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = MAX ? warp_max(v) : warp_sum(v);
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : (MAX ? -INFINITY : 0.0f);
    v = MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0)
      scratch[0] = v;
  }
  __syncthreads();
  const float total = scratch[0];
  __syncthreads(); // scratch may be reused by the caller
  return total;
}

__device__ float block_sum(float v, float* scratch) { return block_reduce<false>(v, scratch); }
__device__ float block_max(float v, float* scratch) { return block_reduce<true>(v, scratch); }

// Whether the current device takes programmatic dependent launches (compute capability 9.0 or
// newer), asked once per device.
bool programmatic_launch() {
  static std::atomic<int> known[64] = {}; // 0 unknown, 1 no, 2 yes; launches come from several threads
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64)
    return false;
  int k = known[device].load(std::memory_order_relaxed);
  if (k == 0) {
    int major = 0;
    k = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9 ? 2 : 1;
    known[device].store(k, std::memory_order_relaxed);
  }
  return k == 2;
}

// kernel<<<grid, block, shared, stream>>>(args...), allowed to start before the previous kernel in
// the stream ends where the device can (the kernel must call grid_dependency_wait() before reading
// anything a kernel wrote). Captured into CUDA graphs as programmatic edges.
template <class... Params, class... Args>
cudaError_t launch_early(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared, cudaStream_t stream,
                         Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic_launch() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

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

// ---- decode attention ---------------------------------------------------------------------------
//
// Flash-decoding for one query token per row. A block serves one row, KV head and up to GM of
// that KV head's query heads (blockIdx.x) and one split of `chunk` slots (blockIdx.y). Its four
// warps each take a contiguous quarter of the chunk (decode_attention_warp_slots) and keep their
// own online softmax, so no barrier is crossed until the warps' results are merged once at the
// end. Within a warp, `lanes_per_key` lanes share a key row, each loading `vec` elements (16
// bytes, or one element where the data is not so aligned) at a time, and the warp reads
// keys_per_step keys per step; a round loads
// decode_attention_steps steps of keys and values before any arithmetic so that their loads are
// in flight together. Every lane computes the dot products of its elements with all GM query
// heads (q in registers), reduces them over its key's lanes with shuffles, and accumulates
// p * v into registers for the same elements (the lane layout of values is that of keys). With
// splits > 1 each block leaves its unnormalised sums and (max, sum) in float32 and
// decode_attention_combine_kernel merges the splits that hold slots. A wide launch (a.wide) has
// one block of 16 warps per (row, query head) over all of the row's visible slots, cut evenly
// (decode_attention_even_slots), eight steps a round: no splits and no combine.
//
// Scores are kept in log2 units (q is scaled by scale * log2(e)) so that exp2f serves.

constexpr int max_head_dim = static_cast<int>(decode_attention_max_head_dim);
constexpr float log2_e = 1.4426950408889634f;

// What one load brings: 16 bytes as a uint4 when VEC elements fill them, else one element,
// converted to float at once.
template <class T, int VEC>
using load_t = std::conditional_t<VEC * sizeof(T) == 16, uint4, float>;

template <class T, int VEC>
__device__ __forceinline__ load_t<T, VEC> load_elements(const T* p) {
  if constexpr (VEC * sizeof(T) == 16)
    return __ldg(reinterpret_cast<const uint4*>(p)); // p is 16-byte aligned (the plan's `aligned`)
  else
    return to_float(*p);
}

// Zeros as one load brings them.
template <class T, int VEC>
__device__ __forceinline__ load_t<T, VEC> zero_elements() {
  if constexpr (VEC * sizeof(T) == 16)
    return make_uint4(0u, 0u, 0u, 0u);
  else
    return 0.0f;
}

template <class T, int VEC>
__device__ __forceinline__ void unpack(const load_t<T, VEC>& raw, float* out) {
  if constexpr (VEC * sizeof(T) == 16) {
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int c = 0; c < VEC; ++c)
      out[c] = to_float(e[c]);
  } else {
    out[0] = raw;
  }
}

// T: storage type; VEC: elements per load (the plan's vec); GM: query heads per block (the
// plan's heads_per_block); EARLY: a.early_reads; W: warps (the plan's warps: decode_attention_warps, or
// decode_attention_wide_warps for one block per query head over all slots); STEPS: the plan's
// steps. Registers per lane: q and the accumulators, GM * E floats each (E = 8: 32 each at GM =
// 4), the loads of a round and the scores; 128 registers in all with no spills on sm_80 and
// sm_90 for 16-byte loads, so four blocks of four warps fit an SM (a wide block of 16 warps
// holds one head and twice the loads, one block an SM). The element-load variant (data not
// 16-byte aligned) keeps its 8 loads a key as floats and gets about 160 (three blocks).
//
// With a.early_reads the previous kernel in the stream wrote neither the lengths nor any slot
// below a row's length (the decoding step: it wrote q and the new token's slot), so the block
// loads those keys and values of its first round before waiting for that kernel; q and the new
// token's slot come after the wait.
template <class T, int VEC, int GM, int W, int STEPS, bool EARLY, bool TIMED>
__device__ __forceinline__ void decode_attention_block(const decode_attention_args& a, const decode_attention_plan& plan) {
  constexpr bool wide = W != decode_attention_warps;
  constexpr bool early = EARLY; // a.early_reads, compiled in: without it the kernel keeps no state across the wait
  if (a.early_launch)
    grid_dependents_launch(); // the next kernel's blocks may take free SMs and load their weights now
  if (!early) { // a.early_launch is set only with early reads
    grid_dependency_wait(); // q and the cache come from the previous kernel
    if constexpr (TIMED)
      timeline_stamp(a.timeline, 1);
    grid_dependents_launch();
  }
  constexpr int max_vectors = decode_attention_lane_vectors(VEC); // loads per lane and key
  constexpr int E = max_vectors * VEC;                            // elements per lane and key
  constexpr int steps = STEPS;
  using raw_t = load_t<T, VEC>;

  const int d = static_cast<int>(a.head_dim);
  const int heads = static_cast<int>(a.heads), kv_heads = static_cast<int>(a.kv_heads);
  const int group = heads / kv_heads;
  const int lanes_per_key = plan.lanes_per_key;
  long long pair = blockIdx.x;
  const int head_block = static_cast<int>(pair % plan.head_blocks);
  pair /= plan.head_blocks;
  const int kv_head = static_cast<int>(pair % kv_heads);
  const long long row = pair / kv_heads;
  const long long split = blockIdx.y;
  const int g0 = head_block * GM;                        // the block's first query head within the group
  const int gn = group - g0 < GM ? group - g0 : GM;      // its query heads (at least 1)
  const long long first_head = row * heads + static_cast<long long>(kv_head) * group + g0;

  const long long length = a.lengths[row];
  const long long n = decode_attention_visible(length, a.slots);
  if (split * a.chunk >= n) { // no slot of this row here (a wide block of one split: n <= 0)
    if (early) {
      grid_dependency_wait(); // every block waits before it lets the next kernel start or exits
      if constexpr (TIMED)
        timeline_stamp(a.timeline, 1);
      if (!a.early_launch)
        grid_dependents_launch();
    }
    if (a.splits == 1) {      // n == 0: nothing to attend to; zeros, as the combine kernel writes
      T* out = static_cast<T*>(a.out) + first_head * d;
      for (int i = threadIdx.x; i < gn * d; i += blockDim.x)
        out[i] = from_float<T>(0.0f);
    }
    return;
  }

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int key_lane = lane / lanes_per_key; // which key of a step this lane reads
  // The first element of each of the lane's loads, or -1 past head_dim.
  int element[max_vectors];
#pragma unroll
  for (int i = 0; i < max_vectors; ++i) {
    const int e = decode_attention_lane_element(plan, lane, i);
    element[i] = e < d ? e : -1;
  }

  const T* k_base = static_cast<const T*>(a.k_cache) + row * a.row_stride + kv_head * a.head_stride;
  const T* v_base = static_cast<const T*>(a.v_cache) + row * a.row_stride + kv_head * a.head_stride;
  const slot_range run =
    wide ? decode_attention_wide_slots(n, a.chunk, split, W, warp) : decode_attention_warp_slots(n, a.chunk, split, warp);

  // A round's keys and values: zeros for slots past the warp's range (a weight of 0 times a
  // value must stay 0), then the loads of the slots in [from, to).
  raw_t k_raw[steps][max_vectors], v_raw[steps][max_vectors];
  auto clear_round = [&]() {
#pragma unroll
    for (int u = 0; u < steps; ++u) {
#pragma unroll
      for (int i = 0; i < max_vectors; ++i) {
        k_raw[u][i] = zero_elements<T, VEC>();
        v_raw[u][i] = zero_elements<T, VEC>();
      }
    }
  };
  auto load_round = [&](long long round, long long from, long long to) {
#pragma unroll
    for (int u = 0; u < steps; ++u) {
      const long long slot = decode_attention_lane_slot(plan, round, u, lane);
      if (slot < run.end && slot >= from && slot < to) {
#pragma unroll
        for (int i = 0; i < max_vectors; ++i) {
          if (element[i] >= 0) {
            k_raw[u][i] = load_elements<T, VEC>(k_base + slot * a.slot_stride + element[i]);
            v_raw[u][i] = load_elements<T, VEC>(v_base + slot * a.slot_stride + element[i]);
          }
        }
      }
    }
  };
  constexpr long long every = 0x7fffffffffffffffLL;
  if constexpr (early) {
    if (run.begin < run.end) {
      clear_round();
      load_round(run.begin, 0, length); // slots written by earlier steps
    }
    grid_dependency_wait(); // q and the new token's slot come from the previous kernel
    if constexpr (TIMED)
      timeline_stamp(a.timeline, 1);
    if (!a.early_launch)
      grid_dependents_launch();
    if (run.begin < run.end)
      load_round(run.begin, length, every);
  }

  const float q_scale = a.scale * log2_e;
  const T* q_ptr = static_cast<const T*>(a.q) + first_head * d;
  float q[GM][E];
#pragma unroll
  for (int g = 0; g < GM; ++g)
#pragma unroll
    for (int i = 0; i < max_vectors; ++i) {
      float f[VEC];
      if (g < gn && element[i] >= 0) {
        unpack<T, VEC>(load_elements<T, VEC>(q_ptr + g * d + element[i]), f);
      } else {
#pragma unroll
        for (int c = 0; c < VEC; ++c)
          f[c] = 0.0f;
      }
#pragma unroll
      for (int c = 0; c < VEC; ++c)
        q[g][i * VEC + c] = f[c] * q_scale;
    }

  float m[GM], l[GM], acc[GM][E]; // running max (log2 units), sum of weights, weighted values
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e)
      acc[g][e] = 0.0f;
  }

  // Each round's first slot is below run.end, so every round has a finite maximum and the
  // first round's rescale factor exp2(-inf - max) is 0. With early reads the first round's
  // loads are in already.
  for (long long round = run.begin; round < run.end; round += plan.warp_tile) {
    if (!early || round != run.begin) {
      clear_round();
      load_round(round, 0, every);
    }
    float s[steps][GM]; // scores, then weights
#pragma unroll
    for (int u = 0; u < steps; ++u) {
      float k[E];
#pragma unroll
      for (int i = 0; i < max_vectors; ++i)
        unpack<T, VEC>(k_raw[u][i], k + i * VEC);
#pragma unroll
      for (int g = 0; g < GM; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e)
          dot = fmaf(q[g][e], k[e], dot);
        for (int offset = lanes_per_key >> 1; offset > 0; offset >>= 1) // within the key's lanes
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        s[u][g] = decode_attention_lane_slot(plan, round, u, lane) < run.end ? dot : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      float round_max = s[0][g];
#pragma unroll
      for (int u = 1; u < steps; ++u)
        round_max = fmaxf(round_max, s[u][g]);
      for (int offset = lanes_per_key; offset < 32; offset <<= 1) // across the step's keys
        round_max = fmaxf(round_max, __shfl_xor_sync(0xffffffffu, round_max, offset));
      const float m_new = fmaxf(m[g], round_max); // the same in every lane of the warp
      const float alpha = exp2f(m[g] - m_new);
      m[g] = m_new;
      l[g] *= alpha;
#pragma unroll
      for (int e = 0; e < E; ++e)
        acc[g][e] *= alpha;
#pragma unroll
      for (int u = 0; u < steps; ++u) {
        s[u][g] = exp2f(s[u][g] - m_new); // 0 for invalid slots
        l[g] += s[u][g];
      }
    }
#pragma unroll
    for (int u = 0; u < steps; ++u) {
      float v[E];
#pragma unroll
      for (int i = 0; i < max_vectors; ++i)
        unpack<T, VEC>(v_raw[u][i], v + i * VEC);
#pragma unroll
      for (int g = 0; g < GM; ++g)
#pragma unroll
        for (int e = 0; e < E; ++e)
          acc[g][e] = fmaf(s[u][g], v[e], acc[g][e]);
    }
  }

  if constexpr (TIMED)
    timeline_stamp(a.timeline, 2);
  // The warp's keys were spread over keys_per_step lane groups, all against the same max: sum them.
  for (int offset = lanes_per_key; offset < 32; offset <<= 1) {
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      l[g] += __shfl_xor_sync(0xffffffffu, l[g], offset);
#pragma unroll
      for (int e = 0; e < E; ++e)
        acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], offset);
    }
  }

  // Merge the warps: one barrier.
  extern __shared__ float shared[];
  float* acc_s = shared;                                  // [warps][GM][d]
  float* m_s = acc_s + W * GM * d;   // [warps][GM]
  float* l_s = m_s + W * GM;         // [warps][GM]
  if (key_lane == 0) {
#pragma unroll
    for (int g = 0; g < GM; ++g)
#pragma unroll
      for (int i = 0; i < max_vectors; ++i)
        if (g < gn && element[i] >= 0)
#pragma unroll
          for (int c = 0; c < VEC; ++c)
            acc_s[(warp * GM + g) * d + element[i] + c] = acc[g][i * VEC + c];
  }
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      m_s[warp * GM + g] = m[g];
      l_s[warp * GM + g] = l[g];
    }
  }
  __syncthreads();
  for (int o = threadIdx.x; o < gn * d; o += blockDim.x) {
    const int g = o / d, e = o - g * d;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w)
      mx = fmaxf(mx, m_s[w * GM + g]); // finite: warp 0 read the split's (or row's) first slot
    float sum = 0.0f, weight = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float mw = m_s[w * GM + g];
      if (mw == -INFINITY) // a warp past the row's slots
        continue;
      const float f = exp2f(mw - mx);
      sum += f * acc_s[(w * GM + g) * d + e];
      weight += f * l_s[w * GM + g];
    }
    if (a.splits == 1) {
      // weight >= 1: the key holding the maximum contributes exp2(0).
      static_cast<T*>(a.out)[(first_head + g) * d + e] = from_float<T>(sum / weight);
    } else {
      const long long at = (first_head + g) * a.splits + split;
      a.partial_out[at * d + e] = sum;
      if (e == 0) {
        a.partial_ml[2 * at] = mx;
        a.partial_ml[2 * at + 1] = weight;
      }
    }
  }
}

// TIMED: as small_gemm_kernel's.
template <class T, int VEC, int GM, int W, int STEPS, bool EARLY, bool TIMED = false>
__global__ void __launch_bounds__(32 * W, W == decode_attention_wide_warps ? 1
                                          : W == decode_attention_half_wide_warps ? 2
                                          : VEC == 1 ? 3 : 4)
  decode_attention_kernel(decode_attention_args a, decode_attention_plan plan) {
  if constexpr (TIMED)
    timeline_stamp(a.timeline, 0);
  decode_attention_block<T, VEC, GM, W, STEPS, EARLY, TIMED>(a, plan);
  if constexpr (TIMED)
    timeline_ended(a.timeline);
}

constexpr int combine_threads = 128;

// One block per (row, query head): the splits that hold slots of the row, rescaled to their
// common max. Threads are (split group, pair of elements): head_dim / 2 threads cover a split's
// row, and the block's threads cover combine_threads / (head_dim / 2) splits at once, with a
// barrier-separated sum over those groups at the end.
template <class T>
__global__ void __launch_bounds__(combine_threads) decode_attention_combine_kernel(decode_attention_args a) {
  grid_dependency_wait();
  grid_dependents_launch();
  __shared__ float2 part[combine_threads];
  __shared__ float part_weight[combine_threads];
  __shared__ float scratch[32];
  const long long head = blockIdx.x; // row * heads + h
  const long long row = head / a.heads;
  const int d = static_cast<int>(a.head_dim), pairs = d / 2;
  const long long n = decode_attention_visible(a.lengths[row], a.slots);
  const long long used = decode_attention_used_splits(n, a.chunk); // the splits that wrote partials
  const float* ml = a.partial_ml + head * a.splits * 2;
  float mx = -INFINITY;
  for (long long s = threadIdx.x; s < used; s += blockDim.x)
    mx = fmaxf(mx, ml[2 * s]);
  mx = block_max(mx, scratch);
  const int groups = static_cast<int>(blockDim.x) / pairs; // >= 1: head_dim <= 2 * combine_threads
  const int group = threadIdx.x / pairs, pair = threadIdx.x - group * pairs;
  if (group < groups) {
    const float2* po = reinterpret_cast<const float2*>(a.partial_out + head * a.splits * d) + pair;
    float2 acc = make_float2(0.0f, 0.0f);
    float weight = 0.0f;
#pragma unroll 4
    for (long long s = group; s < used; s += groups) {
      const float f = exp2f(ml[2 * s] - mx);
      const float2 x = po[s * pairs];
      acc.x += f * x.x;
      acc.y += f * x.y;
      weight += f * ml[2 * s + 1];
    }
    part[threadIdx.x] = acc; // threadIdx.x == group * pairs + pair
    if (pair == 0)
      part_weight[group] = weight;
  }
  __syncthreads();
  if (group == 0) {
    float2 total = make_float2(0.0f, 0.0f);
    float weight = 0.0f;
    for (int j = 0; j < groups; ++j) {
      total.x += part[j * pairs + pair].x;
      total.y += part[j * pairs + pair].y;
      weight += part_weight[j];
    }
    T* out = static_cast<T*>(a.out) + head * d + 2 * pair;
    out[0] = from_float<T>(weight > 0.0f ? total.x / weight : 0.0f); // weight 0: no slot visible
    out[1] = from_float<T>(weight > 0.0f ? total.y / weight : 0.0f);
  }
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
// HALF: each half-warp takes a unit (one row, split 1; set_small_gemm_half_warps), so that a
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

// TIMED: the blocks record their times in a.timeline (set_decode_timeline); a separate
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

// (max, first index of it, sum of exp(x - max)) merged: the larger maximum wins, the lower index
// on ties, and the sums are rescaled to the common maximum.
struct greedy_part {
  float max;
  long long index;
  float sum;
};

__device__ __forceinline__ greedy_part merge(greedy_part a, greedy_part b) {
  if (b.max > a.max || (b.max == a.max && b.index < a.index) || a.index < 0) {
    greedy_part t = a;
    a = b;
    b = t;
  }
  if (b.index < 0)
    return a;
  const float sum = a.sum + (b.max == -INFINITY ? 0.0f : b.sum * expf(b.max - a.max));
  return {a.max, a.index, sum};
}

// Element i with value v added to p: a new maximum rescales the sum (the first index kept on ties).
__device__ __forceinline__ void add(greedy_part& p, float v, long long i) {
  if (p.index < 0 || v > p.max) {
    p.sum = p.index < 0 || p.max == -INFINITY ? 1.0f : p.sum * expf(p.max - v) + 1.0f;
    p.max = v;
    p.index = i;
  } else {
    p.sum += v == -INFINITY ? 0.0f : expf(v - p.max);
  }
}

__device__ greedy_part block_merge(greedy_part p) {
  __shared__ float m[32], s_[32];
  __shared__ long long i_[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) {
    greedy_part o{__shfl_xor_sync(0xffffffffu, p.max, offset), __shfl_xor_sync(0xffffffffu, p.index, offset),
                  __shfl_xor_sync(0xffffffffu, p.sum, offset)};
    p = merge(p, o);
  }
  if (lane == 0) {
    m[warp] = p.max;
    i_[warp] = p.index;
    s_[warp] = p.sum;
  }
  __syncthreads();
  if (warp == 0) {
    p = lane < warps ? greedy_part{m[lane], i_[lane], s_[lane]} : greedy_part{-INFINITY, -1, 0.0f};
    for (int offset = 16; offset > 0; offset >>= 1) {
      greedy_part o{__shfl_xor_sync(0xffffffffu, p.max, offset), __shfl_xor_sync(0xffffffffu, p.index, offset),
                    __shfl_xor_sync(0xffffffffu, p.sum, offset)};
      p = merge(p, o);
    }
  }
  return p; // valid in thread 0
}

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

// ---- the learner's target log-probabilities --------------------------------------------------

constexpr int logprob_threads = 512;

// Eight elements of a row from 16 bytes (or fewer for float32: two 16-byte loads).
template <class T>
struct pack8 {
  alignas(16) T v[8];
};

template <class T>
__device__ __forceinline__ void load8(const T* p, float (&out)[8]) {
  const pack8<T> in = *reinterpret_cast<const pack8<T>*>(p);
#pragma unroll
  for (int i = 0; i < 8; ++i)
    out[i] = to_float(in.v[i]);
}

// VEC: the row is read 8 elements (16 bytes of bf16/fp16) at a time (eight_wide: vocab % 8 == 0
// and 16-byte aligned pointers, so every row starts aligned).
template <class T, bool VEC>
__global__ void __launch_bounds__(logprob_threads)
  target_logprob_forward_kernel(const T* __restrict__ logits, const std::int64_t* __restrict__ targets, long long vocab,
                                float inv_t, float* __restrict__ out, float* __restrict__ lse) {
  // The log-sum-exp runs as greedy sampling's (max, index, sum) merge; the index goes unused.
  const long long row = blockIdx.x;
  const T* x = logits + row * vocab;
  greedy_part p{-INFINITY, -1, 0.0f};
  bool nan = false;
  if (VEC) {
    for (long long i = 8LL * threadIdx.x; i < vocab; i += 8LL * blockDim.x) {
      float v[8];
      load8(x + i, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        nan |= v[k] != v[k];
        add(p, v[k] * inv_t, i + k);
      }
    }
  } else {
    for (long long i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float v = to_float(x[i]);
      nan |= v != v;
      add(p, v * inv_t, i);
    }
  }
  nan = __syncthreads_or(nan);
  p = block_merge(p);
  if (threadIdx.x == 0) {
    // All -inf: log(0) = -inf; a NaN anywhere: NaN (torch::logsumexp gives both).
    const float l = nan ? NAN : p.max == -INFINITY ? -INFINITY : p.max + logf(p.sum);
    lse[row] = l;
    const long long t = targets[row];
    out[row] = t < 0 ? 0.0f : to_float(x[t]) * inv_t - l;
  }
}

template <class T, bool VEC>
__global__ void __launch_bounds__(logprob_threads)
  target_logprob_backward_kernel(const T* logits, const std::int64_t* __restrict__ targets,
                                 const float* __restrict__ lse, const float* __restrict__ grad, long long vocab,
                                 float inv_t, T* grad_logits) {
  const long long row = blockIdx.x;
  const long long t = targets[row];
  const float g = t < 0 ? 0.0f : grad[row] * inv_t, l = lse[row];
  const T* x = logits + row * vocab;
  T* y = grad_logits + row * vocab;
  // d(x_t - lse)/d logit_j = (1[j = t] - softmax_j) / T
  auto value = [&](long long j, float logit) {
    const float p = expf(logit * inv_t - l);
    return from_float<T>(g * ((j == t ? 1.0f : 0.0f) - p));
  };
  if (VEC) {
    for (long long i = 8LL * threadIdx.x; i < vocab; i += 8LL * blockDim.x) {
      float v[8];
      load8(x + i, v);
      pack8<T> o;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        o.v[k] = value(i + k, v[k]);
      *reinterpret_cast<pack8<T>*>(y + i) = o;
    }
  } else {
    for (long long i = threadIdx.x; i < vocab; i += blockDim.x)
      y[i] = value(i, to_float(x[i]));
  }
}

// ---- the training forward's elementwise pieces and their gradients ----------------------------

constexpr int train_threads = 256;

// One block per row at a time (grid-stride over rows); the weight's gradient summed per block in
// shared memory (dim floats), written once per block.
template <class T>
__global__ void __launch_bounds__(train_threads)
  rms_norm_backward_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ dy,
                           T* __restrict__ dx, float* __restrict__ dweight_partial, long long rows, int dim, float eps,
                           float inv_dim) {
  extern __shared__ float dw[];
  __shared__ float scratch[32];
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    dw[i] = 0.0f;
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * dim;
    const T* gr = dy + row * dim;
    float sum = 0.0f, dot = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
      const float v = to_float(xr[i]);
      sum += __fmul_rn(v, v);
      dot += rounded<T>(__fmul_rn(to_float(gr[i]), to_float(weight[i]))) * v; // dn = dy * weight, in T
    }
    const float s = rms_inverse(block_sum(sum, scratch), inv_dim, eps);
    dot = block_sum(dot, scratch);
    // dx = s dn - (s^3 / dim) x (dn . x)
    const float k = s * s * s * inv_dim * dot;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
      const float v = to_float(xr[i]), g = to_float(gr[i]);
      const float dn = rounded<T>(__fmul_rn(g, to_float(weight[i])));
      dx[row * dim + i] = from_float<T>(s * dn - k * v);
      dw[i] += g * rounded<T>(__fmul_rn(v, s));
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    dweight_partial[blockIdx.x * static_cast<long long>(dim) + i] = dw[i];
}

// One thread per rotated pair (entries i and i + half of one head of one token).
template <class T, bool BACKWARD>
__global__ void __launch_bounds__(train_threads)
  rope_rotate_kernel(const T* __restrict__ x, const T* __restrict__ cos, const T* __restrict__ sin, T* __restrict__ out,
                     long long tokens, int heads, int head_dim) {
  const int half = head_dim / 2;
  const long long pairs = tokens * heads * half;
  for (long long p = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(p % half);
    const long long th = p / half; // token * heads + head
    const long long token = th / heads;
    const long long at = th * head_dim + i;
    const float x1 = to_float(x[at]), x2 = to_float(x[at + half]);
    const T* c = cos + token * head_dim;
    const T* s = sin + token * head_dim;
    const float c1 = to_float(c[i]), c2 = to_float(c[i + half]), s1 = to_float(s[i]), s2 = to_float(s[i + half]);
    if (!BACKWARD) {
      // x * cos + cat(-x2, x1) * sin
      out[at] = from_float<T>(__fadd_rn(rounded<T>(__fmul_rn(x1, c1)), rounded<T>(__fmul_rn(-x2, s1))));
      out[at + half] = from_float<T>(__fadd_rn(rounded<T>(__fmul_rn(x2, c2)), rounded<T>(__fmul_rn(x1, s2))));
    } else {
      // dy * cos + rotate_half^T(dy * sin), rotate_half^T(g) = cat(g2, -g1)
      out[at] = from_float<T>(__fadd_rn(rounded<T>(__fmul_rn(x1, c1)), rounded<T>(__fmul_rn(x2, s2))));
      out[at + half] = from_float<T>(__fadd_rn(rounded<T>(__fmul_rn(x2, c2)), -rounded<T>(__fmul_rn(x1, s1))));
    }
  }
}

// Both kernels go 8 elements a thread at a time (16-byte loads of bfloat16/float16) when n is a
// multiple of 8 and every pointer is 16-byte aligned (VEC), else one at a time.
template <class T, bool VEC>
__global__ void __launch_bounds__(train_threads)
  silu_mul_pair_kernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out, long long n) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (VEC) {
    for (long long i = 8 * first; i < n; i += 8 * step) {
      float g[8], u[8];
      load8(gate + i, g);
      load8(up + i, u);
      pack8<T> o;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        o.v[k] = silu_times<T>(g[k], u[k]);
      *reinterpret_cast<pack8<T>*>(out + i) = o;
    }
  } else {
    for (long long i = first; i < n; i += step)
      out[i] = silu_times<T>(to_float(gate[i]), to_float(up[i]));
  }
}

// dup = dy * silu(g) and dgate = (dy * up) * silu'(g), rounded as autograd rounds them.
template <class T>
__device__ __forceinline__ void silu_mul_grads(float g, float u, float d, T& dgate, T& dup) {
  const float e = __fadd_rn(1.0f, expf(-g));
  const float sig = 1.0f / e;
  const float act = rounded<T>(__fdiv_rn(g, e)); // torch::silu(gate) in T, as silu_times computes it
  dup = from_float<T>(__fmul_rn(d, act));
  const float da = rounded<T>(__fmul_rn(d, u));
  dgate = from_float<T>(da * (sig * (1.0f + g * (1.0f - sig))));
}

template <class T, bool VEC>
__global__ void __launch_bounds__(train_threads)
  silu_mul_pair_backward_kernel(const T* __restrict__ gate, const T* __restrict__ up, const T* __restrict__ dy,
                                T* __restrict__ dgate, T* __restrict__ dup, long long n) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (VEC) {
    for (long long i = 8 * first; i < n; i += 8 * step) {
      float g[8], u[8], d[8];
      load8(gate + i, g);
      load8(up + i, u);
      load8(dy + i, d);
      pack8<T> og, ou;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        silu_mul_grads<T>(g[k], u[k], d[k], og.v[k], ou.v[k]);
      *reinterpret_cast<pack8<T>*>(dgate + i) = og;
      *reinterpret_cast<pack8<T>*>(dup + i) = ou;
    }
  } else {
    for (long long i = first; i < n; i += step)
      silu_mul_grads<T>(to_float(gate[i]), to_float(up[i]), to_float(dy[i]), dgate[i], dup[i]);
  }
}

// Whether n elements at each of `pointers` can go 8 at a time with 16-byte accesses.
bool eight_wide(long long n, std::initializer_list<const void*> pointers) {
  if (n % 8 != 0)
    return false;
  for (const void* p : pointers)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
      return false;
  return true;
}

// Blocks for a grid-stride loop over n items: enough to fill the device, at most 65535 x 16.
unsigned stride_blocks(long long n) {
  return static_cast<unsigned>(std::max<long long>(1, std::min<long long>((n + train_threads - 1) / train_threads, 16 * 65535)));
}

} // namespace

cudaError_t target_logprob_forward(dtype t, const void* logits, const std::int64_t* targets, std::int64_t rows,
                                   std::int64_t vocab, float inv_temperature, float* out, float* lse,
                                   cudaStream_t stream) {
  if (rows <= 0)
    return cudaSuccess;
  if (vocab <= 0 || rows > 0x7fffffff || logits == nullptr || targets == nullptr || out == nullptr || lse == nullptr)
    return cudaErrorInvalidValue;
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* x = static_cast<const T*>(logits);
    if (eight_wide(vocab, {logits}))
      target_logprob_forward_kernel<T, true><<<static_cast<unsigned>(rows), logprob_threads, 0, stream>>>(
        x, targets, vocab, inv_temperature, out, lse);
    else
      target_logprob_forward_kernel<T, false><<<static_cast<unsigned>(rows), logprob_threads, 0, stream>>>(
        x, targets, vocab, inv_temperature, out, lse);
    return cudaGetLastError();
  });
}

cudaError_t target_logprob_backward(dtype t, const void* logits, const std::int64_t* targets, const float* lse,
                                    const float* grad, std::int64_t rows, std::int64_t vocab, float inv_temperature,
                                    void* grad_logits, cudaStream_t stream) {
  if (rows <= 0)
    return cudaSuccess;
  if (vocab <= 0 || rows > 0x7fffffff || logits == nullptr || targets == nullptr || lse == nullptr || grad == nullptr
      || grad_logits == nullptr)
    return cudaErrorInvalidValue;
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* x = static_cast<const T*>(logits);
    auto* y = static_cast<T*>(grad_logits);
    if (eight_wide(vocab, {logits, grad_logits}))
      target_logprob_backward_kernel<T, true><<<static_cast<unsigned>(rows), logprob_threads, 0, stream>>>(
        x, targets, lse, grad, vocab, inv_temperature, y);
    else
      target_logprob_backward_kernel<T, false><<<static_cast<unsigned>(rows), logprob_threads, 0, stream>>>(
        x, targets, lse, grad, vocab, inv_temperature, y);
    return cudaGetLastError();
  });
}

cudaError_t rms_norm_backward(dtype t, const void* x, const void* weight, const void* dy, void* dx,
                              float* dweight_partial, std::int64_t rows, std::int64_t dim, float eps, std::int64_t blocks,
                              cudaStream_t stream) {
  if (rows <= 0)
    return cudaSuccess;
  if (dim <= 0 || dim > rms_norm_backward_max_dim || blocks < 1 || blocks > rows || blocks > 0x7fffffff)
    return cudaErrorInvalidValue;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  const std::size_t shared = static_cast<std::size_t>(dim) * sizeof(float);
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (shared > 48 * 1024)
      if (auto e = cudaFuncSetAttribute(&rms_norm_backward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared));
          e != cudaSuccess)
        return e;
    rms_norm_backward_kernel<T><<<static_cast<unsigned>(blocks), train_threads, shared, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(dy), static_cast<T*>(dx),
      dweight_partial, rows, static_cast<int>(dim), eps, inv_dim);
    return cudaGetLastError();
  });
}

cudaError_t rope_rotate(dtype t, const void* x, const void* cos, const void* sin, void* out, std::int64_t tokens,
                        std::int64_t heads, std::int64_t head_dim, bool backward, cudaStream_t stream) {
  if (tokens <= 0 || heads <= 0)
    return cudaSuccess;
  if (head_dim <= 0 || head_dim % 2 != 0 || heads > 0x7fffffff || head_dim > 0x7fffffff)
    return cudaErrorInvalidValue;
  const long long pairs = static_cast<long long>(tokens) * heads * (head_dim / 2);
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto kernel = backward ? &rope_rotate_kernel<T, true> : &rope_rotate_kernel<T, false>;
    kernel<<<stride_blocks(pairs), train_threads, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(cos),
                                                               static_cast<const T*>(sin), static_cast<T*>(out), tokens,
                                                               static_cast<int>(heads), static_cast<int>(head_dim));
    return cudaGetLastError();
  });
}

cudaError_t silu_mul_pair(dtype t, const void* gate, const void* up, void* out, std::int64_t n, cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (eight_wide(n, {gate, up, out}))
      silu_mul_pair_kernel<T, true><<<stride_blocks(n / 8), train_threads, 0, stream>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n);
    else
      silu_mul_pair_kernel<T, false><<<stride_blocks(n), train_threads, 0, stream>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n);
    return cudaGetLastError();
  });
}

cudaError_t silu_mul_pair_backward(dtype t, const void* gate, const void* up, const void* dy, void* dgate, void* dup,
                                   std::int64_t n, cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const bool wide = eight_wide(n, {gate, up, dy, dgate, dup});
    auto kernel = wide ? &silu_mul_pair_backward_kernel<T, true> : &silu_mul_pair_backward_kernel<T, false>;
    const long long items = wide ? n / 8 : n;
    kernel<<<stride_blocks(items), train_threads, 0, stream>>>(static_cast<const T*>(gate), static_cast<const T*>(up),
                                                               static_cast<const T*>(dy), static_cast<T*>(dgate),
                                                               static_cast<T*>(dup), n);
    return cudaGetLastError();
  });
}

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

decode_attention_plan plan_decode_attention(dtype t, const decode_attention_args& a) {
  const int bytes = t == dtype::f32 ? 4 : 2;
  const long long per_16 = 16 / bytes;
  auto at_16 = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  const bool aligned = at_16(a.q) && at_16(a.k_cache) && at_16(a.v_cache) && a.head_dim % per_16 == 0
                       && a.row_stride % per_16 == 0 && a.head_stride % per_16 == 0 && a.slot_stride % per_16 == 0;
  const long long group = a.kv_heads > 0 ? a.heads / a.kv_heads : 0;
  return plan_decode_attention(bytes, aligned, static_cast<int>(group), static_cast<int>(a.head_dim));
}

std::size_t decode_attention_shared_bytes(std::int64_t heads_per_block, std::int64_t head_dim, int warps) {
  return sizeof(float) * static_cast<std::size_t>(warps * heads_per_block * (head_dim + 2));
}

namespace {
// Whether the decoding kernels may read settled data before waiting (set_decode_early_reads), and
// whether fused::decode_attention may choose the wide kernel (set_decode_wide_attention).
std::atomic<bool> decode_early_reads{true};
std::atomic<bool> decode_wide{true};
std::atomic<bool> decode_early_launch{true}; // set_decode_early_launch
std::atomic<bool> decode_merge{true};        // set_decode_attention_merge
std::atomic<int> decode_merge_splits{decode_attention_merge_max_splits}; // set_decode_attention_merge_splits
std::atomic<int> decode_merge_warps{decode_attention_half_wide_warps};   // set_decode_attention_merge_warps

// set_decode_timeline's buffer and the next record a one-row launch takes.
struct decode_timeline_state {
  std::mutex mutex;
  unsigned long long* buffer = nullptr;
  long long launches = 0, max_blocks = 0, next = 0;
};
decode_timeline_state decode_timeline;

// The record of a launch of `blocks` blocks at `rows` rows, or null (no timeline, more rows or
// blocks than it records, or a kernel that records nothing: `recorded` false, its record taken).
unsigned long long* timeline_record(long long blocks, long long rows, bool recorded = true) {
  if (rows != 1)
    return nullptr;
  std::lock_guard<std::mutex> lock(decode_timeline.mutex);
  auto& d = decode_timeline;
  if (d.buffer == nullptr)
    return nullptr;
  const long long record = d.next++ % d.launches;
  return recorded && blocks <= d.max_blocks ? d.buffer + record * d.max_blocks * decode_timeline_entries : nullptr;
}

// Whether a decoding kernel launches the next as it begins (set_decode_early_launch): with early
// reads, at one row only.
bool launch_early_at(bool early_reads, std::int64_t rows) {
  return early_reads && rows == 1 && decode_early_launch.load(std::memory_order_relaxed);
}
} // namespace

void set_decode_early_reads(bool on) { decode_early_reads.store(on, std::memory_order_relaxed); }
void set_decode_early_launch(bool on) { decode_early_launch.store(on, std::memory_order_relaxed); }
void set_decode_wide_attention(bool on) { decode_wide.store(on, std::memory_order_relaxed); }
bool decode_wide_attention() { return decode_wide.load(std::memory_order_relaxed); }

void set_decode_timeline(unsigned long long* buffer, std::int64_t launches, std::int64_t max_blocks) {
  std::lock_guard<std::mutex> lock(decode_timeline.mutex);
  auto& d = decode_timeline;
  const bool usable = buffer != nullptr && launches > 0 && max_blocks > 0;
  d.buffer = usable ? buffer : nullptr;
  d.launches = usable ? launches : 0;
  d.max_blocks = usable ? max_blocks : 0;
  d.next = 0;
}

void set_decode_attention_merge(bool on) { decode_merge.store(on, std::memory_order_relaxed); }
bool decode_attention_merge() { return decode_merge.load(std::memory_order_relaxed); }
void set_decode_attention_merge_splits(int most) {
  decode_merge_splits.store(std::clamp(most, 2, decode_attention_merge_max_splits), std::memory_order_relaxed);
}
int decode_attention_merge_splits() { return decode_merge_splits.load(std::memory_order_relaxed); }
void set_decode_attention_merge_warps(int warps) {
  decode_merge_warps.store(warps == decode_attention_wide_warps ? warps : decode_attention_half_wide_warps,
                           std::memory_order_relaxed);
}
int decode_attention_merge_warps() { return decode_merge_warps.load(std::memory_order_relaxed); }

cudaError_t decode_attention(dtype t, const decode_attention_args& args, cudaStream_t stream) {
  decode_attention_args a = args;
  a.early_reads = a.early_reads && decode_early_reads.load(std::memory_order_relaxed);
  a.early_launch = launch_early_at(a.early_reads, a.rows);
  if (a.rows <= 0)
    return cudaSuccess;
  if (a.head_dim <= 0 || a.head_dim > max_head_dim || a.head_dim % 2 != 0 || a.heads <= 0 || a.kv_heads <= 0
      || a.heads % a.kv_heads != 0 || a.slots < 1 || a.splits < 1 || a.splits > 65535 || a.chunk <= 0
      || a.chunk % decode_attention_warps != 0 || a.chunk * a.splits < a.slots || a.rows * a.heads > 0x7fffffff
      || (a.splits > 1 && (a.partial_out == nullptr || a.partial_ml == nullptr))
      || (a.merge_later && (!a.wide || a.splits < 2 || a.splits > decode_attention_merge_max_splits))
      || (a.wide_warps != 0 && a.wide_warps != decode_attention_wide_warps && a.wide_warps != decode_attention_half_wide_warps))
    return cudaErrorInvalidValue;
  const bool half_wide = a.wide_warps == decode_attention_half_wide_warps;
  const decode_attention_plan narrow = plan_decode_attention(t, a);
  const decode_attention_plan plan =
    a.wide ? plan_decode_attention_wide(t == dtype::f32 ? 4 : 2, narrow.vec > 1, static_cast<int>(a.heads / a.kv_heads),
                                        static_cast<int>(a.head_dim),
                                        half_wide ? decode_attention_half_wide_warps : decode_attention_wide_warps)
           : narrow;
  if (a.wide && plan.vec == 1)
    return cudaErrorInvalidValue; // the wide kernel loads 16 bytes at a time
  const long long blocks = a.rows * a.kv_heads * plan.head_blocks; // per split
  if (blocks > 0x7fffffff)
    return cudaErrorInvalidValue;
  const std::size_t shared = decode_attention_shared_bytes(plan.heads_per_block, a.head_dim, plan.warps);
  if (shared > 48 * 1024)
    return cudaErrorInvalidValue; // not reached: at most 16 warps * 4 heads * 258 floats
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(a.splits));
  // Recorded: the wide kernel with early reads, a decoding step's at one row (others take the record and write nothing).
  a.timeline = timeline_record(blocks * a.splits, a.rows, a.wide && a.early_reads);
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int vec = 16 / sizeof(T);
    constexpr int most = decode_attention_max_heads_per_block;
    constexpr int narrow_warps = decode_attention_warps, wide_warps = decode_attention_wide_warps;
    constexpr int steps = decode_attention_steps, wide_steps = decode_attention_wide_steps(vec);
    auto pick_wide = [&](auto warps) {
      constexpr int W = decltype(warps)::value;
      return a.timeline != nullptr ? &decode_attention_kernel<T, vec, 1, W, wide_steps, true, true>
             : a.early_reads       ? &decode_attention_kernel<T, vec, 1, W, wide_steps, true>
                                   : &decode_attention_kernel<T, vec, 1, W, wide_steps, false>;
    };
    auto pick = [&](auto early) {
      constexpr bool E = decltype(early)::value;
      if (plan.vec != vec)
        return &decode_attention_kernel<T, 1, most, narrow_warps, steps, E>; // unaligned data: element loads
      return plan.heads_per_block == 1   ? &decode_attention_kernel<T, vec, 1, narrow_warps, steps, E>
             : plan.heads_per_block == 2 ? &decode_attention_kernel<T, vec, 2, narrow_warps, steps, E>
                                         : &decode_attention_kernel<T, vec, most, narrow_warps, steps, E>;
    };
    auto kernel = !a.wide        ? (a.early_reads ? pick(std::true_type{}) : pick(std::false_type{}))
                  : half_wide    ? pick_wide(std::integral_constant<int, decode_attention_half_wide_warps>{})
                                 : pick_wide(std::integral_constant<int, wide_warps>{});
    if (auto e = launch_early(kernel, grid, dim3(32 * plan.warps), shared, stream, a, plan);
        e != cudaSuccess || a.splits == 1 || a.merge_later)
      return e;
    return launch_early(&decode_attention_combine_kernel<T>, dim3(static_cast<unsigned>(a.rows * a.heads)),
                        dim3(combine_threads), 0, stream, a);
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

std::size_t element_bytes(dtype t) { return t == dtype::f32 ? 4 : 2; }

// Whether one-row projections may keep eight loads a row in flight (set_small_gemm_one_round).
std::atomic<bool> small_gemm_one_round{true};
// Whether the one-row gate/up projection gives each half-warp a unit (set_small_gemm_half_warps).
std::atomic<bool> small_gemm_half{true};
// Whether copied inputs are loaded before any is stored (set_small_gemm_batched_staging).
std::atomic<bool> small_gemm_batched{true};

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
cudaError_t launch_small_gemm(dtype t, const small_gemm_args& a, cudaStream_t stream) {
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
                    && small_gemm_half.load(std::memory_order_relaxed);
  const long long per_block = half ? 2LL * small_gemm_warps : small_gemm_warps / split;
  const long long blocks = (units + per_block - 1) / per_block;
  if (blocks > 0x7fffffff)
    return cudaErrorInvalidValue;
  const std::size_t shared = static_cast<std::size_t>(a.rows * a.k) * element_bytes(t);
  // One row: every lane's loads of a row in one round where four do not cover k.
  const bool eight_loads = a.rows == 1 && small_gemm_one_round && kv > 4LL * 32 * split;
  small_gemm_args args = a;
  args.early_reads = a.early_reads && decode_early_reads.load(std::memory_order_relaxed);
  args.early_launch = launch_early_at(args.early_reads, a.rows);
  args.timeline = timeline_record(blocks, a.rows);
  args.batched_staging = a.rows == 1 && small_gemm_batched.load(std::memory_order_relaxed);
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

void set_small_gemm_one_round(bool on) { small_gemm_one_round.store(on, std::memory_order_relaxed); }
void set_small_gemm_half_warps(bool on) { small_gemm_half.store(on, std::memory_order_relaxed); }
void set_small_gemm_batched_staging(bool on) { small_gemm_batched.store(on, std::memory_order_relaxed); }

bool small_gemm_supported(dtype t, std::int64_t rows, std::int64_t k) {
  const auto bytes = element_bytes(t);
  return rows >= 1 && rows <= small_gemm_max_rows && k > 0 && (k * static_cast<std::int64_t>(bytes)) % 16 == 0
         && static_cast<std::size_t>(rows * k) * bytes <= small_gemm_max_shared;
}

cudaError_t small_gemm_residual_add(dtype t, const small_gemm_args& a, cudaStream_t stream) {
  return launch_small_gemm<gemm_out::residual_add>(t, a, stream);
}

cudaError_t small_gemm_silu_mul(dtype t, const small_gemm_args& a, cudaStream_t stream) {
  return launch_small_gemm<gemm_out::silu_mul>(t, a, stream);
}

cudaError_t small_gemm_rope_kv(dtype t, const small_gemm_args& a, cudaStream_t stream) {
  return launch_small_gemm<gemm_out::rope_kv>(t, a, stream);
}

namespace {
std::atomic<bool> greedy_head_on{true}; // set_decode_greedy_head
} // namespace

void set_decode_greedy_head(bool on) { greedy_head_on.store(on, std::memory_order_relaxed); }
bool decode_greedy_head() { return greedy_head_on.load(std::memory_order_relaxed); }

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
