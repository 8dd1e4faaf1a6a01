// policy/kernels/kernel_launch.cuh (internal to policy/kernels/*.cu): what the decoding step's and
// the learner's kernels share: block reductions (sums, maxima, and (max, index, sum of exp) for
// sampling and log-probabilities), programmatic dependent launches (launch_early), and the decoding
// kernels' switches and timeline (set by the kernels.hpp setters in kernels.cu, read by every
// decoding kernel's launch).
#pragma once

#include "policy/kernels/kernel_math.cuh"
#include "policy/kernels/kernels.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <utility>

namespace crucible::policy::kernels::detail {

// Bytes of one element of `t` (float32, or the 16-bit types).
inline std::size_t element_bytes(dtype t) { return t == dtype::f32 ? 4 : 2; }

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

inline __device__ float block_sum(float v, float* scratch) { return block_reduce<false>(v, scratch); }
inline __device__ float block_max(float v, float* scratch) { return block_reduce<true>(v, scratch); }

// Whether the current device takes programmatic dependent launches (compute capability 9.0 or
// newer), asked once per device.
inline bool programmatic_launch() {
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

// (max, first index of it, sum of exp(x - max)) merged: the larger maximum wins, the lower index
// on ties, and the sums are rescaled to the common maximum.
// (The greedy sampling's reduction; the learner's log-probabilities reduce the same way.)
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

inline __device__ greedy_part block_merge(greedy_part p) {
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

// The record of a launch of `blocks` blocks at `rows` rows in o's timeline, or null (none, more
// rows or blocks than it records, or a kernel that records nothing: `recorded` false, its record
// taken).
inline unsigned long long* timeline_record(const decode_options& o, long long blocks, long long rows,
                                           bool recorded = true) {
  return o.timeline == nullptr ? nullptr : o.timeline->record(blocks, rows, recorded, decode_timeline_entries);
}

// Whether a decoding kernel launches the next as it begins (decode_options::early_launch): with
// early reads, at one row only.
inline bool launch_early_at(const decode_options& o, bool early_reads, std::int64_t rows) {
  return early_reads && rows == 1 && o.early_launch;
}

} // namespace crucible::policy::kernels::detail
