// policy/kernels/train_kernels.cu: the learner's training-forward kernels
// (policy/kernels/kernels.hpp): the target tokens' log-probabilities over the vocabulary and their
// gradient, RMSNorm's and silu * up's backward, RoPE's rotation. Called by policy/kernels/fused.cpp
// for the autograd functions of policy/model/model.cpp; float32 arithmetic with the reference's
// rounding points.
#include "policy/kernels/kernel_launch.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace crucible::policy::kernels {

using namespace detail;

namespace {

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

} // namespace crucible::policy::kernels
