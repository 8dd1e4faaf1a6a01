// policy/kernels/kernel_math.cuh: what policy/kernels/kernels.cu and
// policy/kernels/decode_attention.cu share: conversions, the reference's rounding points (RMSNorm,
// silu * up, RoPE), 16-byte dot products, programmatic dependent launch (also used by
// tools/bench/bench_kernel_chain.cu) and the host's dispatch on the storage type. Included by .cu
// files only; everything has internal linkage.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <type_traits>

#include "policy/kernels/kernels.hpp"

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

// The reference's rounding points, shared by every kernel that computes these pieces.

// rsqrt(mean + eps) of an RMSNorm from the sum of rounded squares: mean = sum * (1 / dim), as
// LibTorch's mean kernel computes it.
__device__ __forceinline__ float rms_inverse(float sum, float inv_dim, float eps) {
  return rsqrtf(__fadd_rn(__fmul_rn(sum, inv_dim), eps));
}

// weight * (h * rsqrt(...)).to(dtype): RMSNormImpl::forward of one element.
template <class T>
__device__ __forceinline__ T rms_normed(float h, float weight, float inverse) {
  return from_float<T>(__fmul_rn(weight, rounded<T>(__fmul_rn(h, inverse))));
}

// torch::silu(gate) * up, the silu rounded to T as its own op.
template <class T>
__device__ __forceinline__ T silu_times(float gate, float up) {
  return from_float<T>(__fmul_rn(rounded<T>(__fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate)))), up));
}

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

// Entries i and i + half of a rotated head written to dst, from x1 and x2 at position pos with
// inverse frequency inv. CausalLMImpl::rope: freqs = position * inv_freq (float32), emb =
// cat(freqs, freqs), cos = (cos(emb) * scaling).to(dtype); then x * cos + rotate_half(x) * sin,
// rotate_half(x) = cat(-x2, x1), each product rounded, then the sum. In two halves: the rounded
// cos and sin of a position (rope_cos_sin), which need no activation, so a kernel may take them
// before its wait, and the rotation of x1 and x2 by them (rope_rotate_pair).
template <class T>
__device__ __forceinline__ void rope_cos_sin(float pos, float inv, float scaling, float& c, float& s) {
  const float f = __fmul_rn(pos, inv);
  c = rounded<T>(__fmul_rn(cosf(f), scaling));
  s = rounded<T>(__fmul_rn(sinf(f), scaling));
}
template <class T>
__device__ __forceinline__ void rope_rotate_pair(float x1, float x2, float c, float s, T* dst, long long i,
                                                 long long half) {
  dst[i] = from_float<T>(__fadd_rn(rounded<T>(__fmul_rn(x1, c)), -rounded<T>(__fmul_rn(x2, s))));
  dst[i + half] = from_float<T>(__fadd_rn(rounded<T>(__fmul_rn(x2, c)), rounded<T>(__fmul_rn(x1, s))));
}
template <class T>
__device__ __forceinline__ void rope_pair(float x1, float x2, float pos, float inv, float scaling, T* dst, long long i,
                                          long long half) {
  float c, s;
  rope_cos_sin<T>(pos, inv, scaling, c, s);
  rope_rotate_pair<T>(x1, x2, c, s, dst, i, half);
}

// acc + the dot product of 16 bytes of weights with 16 bytes of inputs, both of type T.
template <class T>
__device__ __forceinline__ float dot16(const uint4& w, const uint4& x, float acc) {
  if constexpr (std::is_same_v<T, float>) {
    acc = fmaf(__uint_as_float(w.x), __uint_as_float(x.x), acc);
    acc = fmaf(__uint_as_float(w.y), __uint_as_float(x.y), acc);
    acc = fmaf(__uint_as_float(w.z), __uint_as_float(x.z), acc);
    return fmaf(__uint_as_float(w.w), __uint_as_float(x.w), acc);
  } else {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    const T2* wp = reinterpret_cast<const T2*>(&w);
    const T2* xp = reinterpret_cast<const T2*>(&x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 a, b;
      if constexpr (std::is_same_v<T, __half>) {
        a = __half22float2(wp[i]);
        b = __half22float2(xp[i]);
      } else {
        a = __bfloat1622float2(wp[i]);
        b = __bfloat1622float2(xp[i]);
      }
      acc = fmaf(a.x, b.x, acc);
      acc = fmaf(a.y, b.y, acc);
    }
    return acc;
  }
}

template <class T>
__device__ __forceinline__ float element(const uint4& v, int i) {
  return to_float(reinterpret_cast<const T*>(&v)[i]);
}

// Programmatic dependent launch (sm_90): a kernel launched with it may start while the previous
// kernel in the stream finishes; grid_dependency_wait() returns once that kernel has completed
// and its writes are visible, so only reads of data no kernel writes (weights) may come before
// it. Kernels call grid_dependents_launch() once the next kernel may start its own such reads.
// Both are no-ops on older devices and in kernels launched without the attribute.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The device's nanosecond clock (%globaltimer), one for every SM: the decoding kernels' timelines.
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A block's record in a decoding timeline (kernels::decode_timeline): when its first thread
// began, when it returned from grid_dependency_wait, when it reached the kernel's midpoint (see
// decode_timeline_entries), and (the latest of its warps) when it ended; blocks in order of
// blockIdx.y * gridDim.x + blockIdx.x.
__device__ __forceinline__ unsigned long long* timeline_block(unsigned long long* t) {
  return t + (static_cast<unsigned long long>(blockIdx.y) * gridDim.x + blockIdx.x) * decode_timeline_entries;
}
// Entry `what` of the block's record (0 began, 1 waited, 2 midpoint), by its first thread.
__device__ __forceinline__ void timeline_stamp(unsigned long long* t, int what) {
  if (t != nullptr && threadIdx.x == 0)
    timeline_block(t)[what] = global_ns();
}
__device__ __forceinline__ void timeline_ended(unsigned long long* t) {
  if (t == nullptr)
    return;
  __syncwarp();
  if ((threadIdx.x & 31) == 0)
    atomicMax(timeline_block(t) + 3, global_ns());
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

} // namespace

} // namespace crucible::policy::kernels
