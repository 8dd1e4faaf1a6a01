// policy/kernels/decode_attention.cu: the decoding step's attention over the KV cache
// (flash-decoding, one query token a row; see the section's comment), its plan and its launch.
// Called by policy/kernels/fused.cpp through policy/kernels/kernels.hpp.
#include "policy/kernels/kernel_launch.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace crucible::policy::kernels {

using namespace detail;

namespace {

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

} // namespace

decode_attention_plan plan_decode_attention(dtype t, const decode_attention_args& a) {
  const int bytes = static_cast<int>(element_bytes(t));
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

cudaError_t decode_attention(dtype t, const decode_attention_args& args, cudaStream_t stream,
                             const decode_options& o) {
  decode_attention_args a = args;
  a.early_reads = a.early_reads && o.early_reads;
  a.early_launch = launch_early_at(o, a.early_reads, a.rows);
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
    a.wide ? plan_decode_attention_wide(static_cast<int>(element_bytes(t)), narrow.vec > 1,
                                        static_cast<int>(a.heads / a.kv_heads), static_cast<int>(a.head_dim),
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
  a.timeline = timeline_record(o, blocks * a.splits, a.rows, a.wide && a.early_reads);
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

} // namespace crucible::policy::kernels
