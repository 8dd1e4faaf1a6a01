// policy/kernels.cu: the fused kernels of a decoding step (see policy/kernels.hpp). Called by
// policy/fused.cpp, which checks shapes; written to be obviously correct first: one block per
// row (norms) or per (row, KV head, split) (attention), plain loops, float32 arithmetic with the
// reference's rounding points spelled out (__fmul_rn and __fadd_rn are never contracted to FMA).
#include "policy/kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace crucible::policy::kernels {

namespace {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// x rounded to T and back: what storing an intermediate result in a T tensor does.
template <class T>
__device__ __forceinline__ float rounded(float x) { return to_float(from_float<T>(x)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// `scratch` holds 32 floats.
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0)
      scratch[0] = v;
  }
  __syncthreads();
  const float total = scratch[0];
  __syncthreads(); // scratch may be reused by the caller
  return total;
}

// Calls f with a null T* for the storage type t.
template <class F>
cudaError_t dispatch(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: return f(static_cast<float*>(nullptr));
    case dtype::f16: return f(static_cast<__half*>(nullptr));
    case dtype::bf16: return f(static_cast<__nv_bfloat16*>(nullptr));
  }
  return cudaErrorInvalidValue;
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
  sum = block_sum(sum, scratch);
  // mean = sum * (1 / dim) as LibTorch's mean kernel computes it; rsqrt(mean + eps).
  const float r = rsqrtf(__fadd_rn(__fmul_rn(sum, inv_dim), eps));
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float normed = rounded<T>(__fmul_rn(to_float(res[i]), r)); // (h * rsqrt(...)).to(dtype)
    out[base + i] = from_float<T>(__fmul_rn(to_float(weight[i]), normed)); // weight * h
  }
}

// ---- RoPE + KV-cache write ----------------------------------------------------------------------

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
  const long long pos = a.lengths[row];
  const bool in_cache = pos >= 0 && pos < a.slots;
  if (head >= heads + kv_heads) { // values: copied to the cache as they are
    if (!in_cache)
      return;
    T* dst = static_cast<T*>(a.v_cache) + row * a.row_stride + static_cast<long long>(head - heads - kv_heads) * a.head_stride
             + pos * a.slot_stride;
    for (int i = threadIdx.x; i < d; i += blockDim.x)
      dst[i] = src[i];
    return;
  }
  T* dst = nullptr;
  if (head < heads) {
    dst = static_cast<T*>(a.q_out) + (row * heads + head) * d;
  } else {
    if (!in_cache)
      return;
    dst = static_cast<T*>(a.k_cache) + row * a.row_stride + static_cast<long long>(head - heads) * a.head_stride
          + pos * a.slot_stride;
  }
  const float* inv = a.inv_freq + row * a.inv_row_stride;
  const float p = static_cast<float>(pos);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // CausalLMImpl::rope: freqs = position * inv_freq (float32), emb = cat(freqs, freqs),
    // cos = (cos(emb) * scaling).to(dtype); entries i and i + half share a frequency.
    const float f = __fmul_rn(p, inv[i]);
    const float c = rounded<T>(__fmul_rn(cosf(f), a.attention_scaling));
    const float s = rounded<T>(__fmul_rn(sinf(f), a.attention_scaling));
    const float x1 = to_float(src[i]), x2 = to_float(src[i + half]);
    // x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1); each product rounded, then the sum.
    dst[i] = from_float<T>(__fadd_rn(rounded<T>(__fmul_rn(x1, c)), -rounded<T>(__fmul_rn(x2, s))));
    dst[i + half] = from_float<T>(__fadd_rn(rounded<T>(__fmul_rn(x2, c)), rounded<T>(__fmul_rn(x1, s))));
  }
}

// ---- decode attention ---------------------------------------------------------------------------

constexpr int attention_threads = 128;
constexpr int tile = static_cast<int>(decode_attention_tile);
constexpr int max_head_dim = static_cast<int>(decode_attention_max_head_dim);
constexpr int per_lane = max_head_dim / 32; // head_dim elements each lane holds of one key

// One block per (row, KV head) (blockIdx.x) and split of the slots (blockIdx.y); it serves the
// `group` query heads of that KV head, so each key and value is read once per group. Online
// softmax over tiles of `tile` slots. Shared memory: q and the accumulators [group][head_dim],
// the tile's scores [group][tile], and per query head its running max, sum and rescale factor.
template <class T>
__global__ void decode_attention_kernel(decode_attention_args a) {
  extern __shared__ float shared[];
  const int d = static_cast<int>(a.head_dim);
  const int heads = static_cast<int>(a.heads), kv_heads = static_cast<int>(a.kv_heads);
  const int group = heads / kv_heads;
  const int kv_head = blockIdx.x % kv_heads;
  const long long row = blockIdx.x / kv_heads;
  const int split = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;

  float* q_s = shared;                    // [group * d]
  float* acc_s = q_s + group * d;         // [group * d]
  float* p_s = acc_s + group * d;         // [group * tile]
  float* m_s = p_s + group * tile;        // [group]
  float* l_s = m_s + group;               // [group]
  float* alpha_s = l_s + group;           // [group]

  const long long length = a.lengths[row] + 1; // the new token's slot included
  const long long n = length < 0 ? 0 : (length > a.slots ? a.slots : length);
  const long long begin = static_cast<long long>(split) * a.chunk;
  const long long end = begin + a.chunk < n ? begin + a.chunk : n;

  const T* q = static_cast<const T*>(a.q) + (row * heads + static_cast<long long>(kv_head) * group) * d;
  const T* k_base = static_cast<const T*>(a.k_cache) + row * a.row_stride + kv_head * a.head_stride;
  const T* v_base = static_cast<const T*>(a.v_cache) + row * a.row_stride + kv_head * a.head_stride;
  for (int i = threadIdx.x; i < group * d; i += blockDim.x) {
    q_s[i] = to_float(q[i]); // query heads kv_head * group + g are adjacent in q
    acc_s[i] = 0.0f;
  }
  for (int g = threadIdx.x; g < group; g += blockDim.x) {
    m_s[g] = -INFINITY;
    l_s[g] = 0.0f;
  }
  __syncthreads();

  for (long long t0 = begin; t0 < end; t0 += tile) { // the same trip count in every thread
    const int count = static_cast<int>(end - t0 < tile ? end - t0 : tile);
    // Scores: one warp per slot; each lane holds head_dim / 32 elements of the key.
    for (int j = warp; j < count; j += warps) {
      const T* key = k_base + (t0 + j) * a.slot_stride;
      float k_reg[per_lane];
#pragma unroll
      for (int c = 0; c < per_lane; ++c) {
        const int e = lane + 32 * c;
        k_reg[c] = e < d ? to_float(key[e]) : 0.0f;
      }
      for (int g = 0; g < group; ++g) {
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < per_lane; ++c) {
          const int e = lane + 32 * c;
          if (e < d)
            s += q_s[g * d + e] * k_reg[c];
        }
        s = warp_sum(s);
        if (lane == 0)
          p_s[g * tile + j] = s * a.scale;
      }
    }
    __syncthreads();
    // Online softmax: one warp per query head rescales its running sum and turns scores into weights.
    for (int g = warp; g < group; g += warps) {
      float* p = p_s + g * tile;
      float tile_max = -INFINITY;
      for (int j = lane; j < count; j += 32)
        tile_max = fmaxf(tile_max, p[j]);
      tile_max = warp_max(tile_max);
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, tile_max);
      float sum = 0.0f;
      for (int j = lane; j < count; j += 32) {
        const float w = expf(p[j] - m_new);
        p[j] = w;
        sum += w;
      }
      sum = warp_sum(sum); // every lane has read m_s[g] before lane 0 writes it below
      if (lane == 0) {
        const float alpha = expf(m_old - m_new); // 0 for the first tile (m_old = -inf)
        alpha_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
    // Accumulators: each thread owns fixed (g, e) entries; values read across a warp are adjacent.
    for (int i = threadIdx.x; i < group * d; i += blockDim.x) {
      const int g = i / d, e = i - g * d;
      const float* p = p_s + g * tile;
      const T* value = v_base + t0 * a.slot_stride + e;
      float acc = acc_s[i] * alpha_s[g];
      for (int j = 0; j < count; ++j)
        acc += p[j] * to_float(value[j * a.slot_stride]);
      acc_s[i] = acc;
    }
    __syncthreads();
  }

  const long long first_head = row * heads + static_cast<long long>(kv_head) * group;
  if (a.splits == 1) {
    T* out = static_cast<T*>(a.out) + first_head * d;
    for (int i = threadIdx.x; i < group * d; i += blockDim.x) {
      const float l = l_s[i / d];
      out[i] = from_float<T>(l > 0.0f ? acc_s[i] / l : 0.0f);
    }
    return;
  }
  for (int i = threadIdx.x; i < group * d; i += blockDim.x) {
    const int g = i / d, e = i - g * d;
    a.partial_out[((first_head + g) * a.splits + split) * d + e] = acc_s[i];
  }
  for (int g = threadIdx.x; g < group; g += blockDim.x) {
    const long long at = (first_head + g) * a.splits + split;
    a.partial_ml[2 * at] = m_s[g];
    a.partial_ml[2 * at + 1] = l_s[g];
  }
}

// One block per (row, query head): the splits' partial results, rescaled to the common max.
template <class T>
__global__ void decode_attention_combine_kernel(decode_attention_args a) {
  const long long head = blockIdx.x; // row * heads + h
  const int d = static_cast<int>(a.head_dim);
  const int splits = static_cast<int>(a.splits);
  const float* ml = a.partial_ml + head * splits * 2;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s)
    if (ml[2 * s + 1] > 0.0f) // empty splits (past the row's length) hold m = -inf, l = 0
      m = fmaxf(m, ml[2 * s]);
  float l = 0.0f;
  for (int s = 0; s < splits; ++s)
    if (ml[2 * s + 1] > 0.0f)
      l += ml[2 * s + 1] * expf(ml[2 * s] - m);
  T* out = static_cast<T*>(a.out) + head * d;
  const float* po = a.partial_out + head * splits * d;
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s)
      if (ml[2 * s + 1] > 0.0f)
        acc += po[static_cast<long long>(s) * d + e] * expf(ml[2 * s] - m);
    out[e] = from_float<T>(l > 0.0f ? acc / l : 0.0f);
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
    const float silu = rounded<T>(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g)))); // torch::silu, in T
    out[i] = from_float<T>(__fmul_rn(silu, u));
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

std::size_t decode_attention_shared_bytes(std::int64_t group, std::int64_t head_dim) {
  return sizeof(float) * static_cast<std::size_t>(2 * group * head_dim + group * tile + 3 * group);
}

cudaError_t decode_attention(dtype t, const decode_attention_args& a, cudaStream_t stream) {
  if (a.rows <= 0)
    return cudaSuccess;
  if (a.head_dim <= 0 || a.head_dim > max_head_dim || a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads != 0
      || a.splits < 1 || a.splits > 65535 || a.chunk <= 0 || a.chunk % tile != 0 || a.chunk * a.splits < a.slots
      || a.rows * a.heads > 0x7fffffff || (a.splits > 1 && (a.partial_out == nullptr || a.partial_ml == nullptr)))
    return cudaErrorInvalidValue;
  const std::size_t shared = decode_attention_shared_bytes(a.heads / a.kv_heads, a.head_dim);
  if (shared > 48 * 1024)
    return cudaErrorInvalidValue; // beyond the default limit; decode_attention_shared_bytes lets callers check first
  const dim3 grid(static_cast<unsigned>(a.rows * a.kv_heads), static_cast<unsigned>(a.splits));
  return dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    decode_attention_kernel<T><<<grid, attention_threads, shared, stream>>>(a);
    if (auto e = cudaGetLastError(); e != cudaSuccess || a.splits == 1)
      return e;
    decode_attention_combine_kernel<T><<<static_cast<unsigned>(a.rows * a.heads), 64, 0, stream>>>(a);
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

} // namespace crucible::policy::kernels
