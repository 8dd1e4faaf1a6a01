// The evaluator worker's own device operations (env/eval/harness/device.py, _HarnessKernels): the
// input-unchanged check and the scaling of the input distributions beside the task's own.
//
// Built into one fatbin (env/CMakeLists.txt) that each worker loads with cuModuleLoadData in
// a fraction of a millisecond. The torch operations they replace loaded lazily at their first
// launch in every worker process, 156-180 ms on an H100 (docs/performance-history.md, "The
// harness's own kernels instead of torch's lazily loaded ones"). Every kernel runs on the stream the worker passes and takes plain
// pointers; nothing here allocates.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

// splitmix64's finaliser: scale factors from (seed, index), nothing kept between
// calls, so each launch draws its own.
__device__ inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <class T> __device__ inline T scaled(T v, double f);
template <> __device__ inline float scaled(float v, double f) { return v * static_cast<float>(f); }
template <> __device__ inline double scaled(double v, double f) { return v * f; }
template <> __device__ inline __half scaled(__half v, double f) {
  return __float2half(__half2float(v) * static_cast<float>(f));
}
template <> __device__ inline __nv_bfloat16 scaled(__nv_bfloat16 v, double f) {
  return __float2bfloat16(__bfloat162float(v) * static_cast<float>(f));
}

__device__ inline std::int64_t first_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

// y[i] = x[i] * U(0.5, 2) with U drawn from (seed, i).
template <class T>
__device__ void scale_uniform(const T* x, T* y, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const double u = static_cast<double>(mix(seed ^ mix(static_cast<std::uint64_t>(i))) >> 11) * 0x1.0p-53;
    y[i] = scaled(x[i], 0.5 + 1.5 * u);
  }
}

// y[i] = x[i] * (+-U(0.5, 2)), the sign and U drawn from (seed, i): other signs (the worker's
// input distribution 2).
template <class T>
__device__ void scale_signed(const T* x, T* y, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const std::uint64_t r = mix(seed ^ mix(static_cast<std::uint64_t>(i)));
    const double u = static_cast<double>(r >> 11) * 0x1.0p-53;
    y[i] = scaled(x[i], (r & 1u) != 0 ? -(0.5 + 1.5 * u) : 0.5 + 1.5 * u);
  }
}

} // namespace

extern "C" {

// *differs = 1 when the n bytes at a and b differ anywhere; `wide` when both are 16-byte
// aligned (then the first n / 16 * 16 bytes are read 16 at a time).
__global__ void crucible_bytes_differ(const unsigned char* a, const unsigned char* b, std::int64_t n, int wide,
                                      int* differs) {
  std::int64_t head = 0;
  bool same = true;
  if (wide) {
    const std::int64_t n16 = n / 16;
    const uint4* a16 = reinterpret_cast<const uint4*>(a);
    const uint4* b16 = reinterpret_cast<const uint4*>(b);
    for (std::int64_t i = first_index(); i < n16; i += grid_stride()) {
      const uint4 x = a16[i];
      const uint4 y = b16[i];
      same = same && x.x == y.x && x.y == y.y && x.z == y.z && x.w == y.w;
    }
    head = n16 * 16;
  }
  for (std::int64_t i = head + first_index(); i < n; i += grid_stride())
    same = same && a[i] == b[i];
  if (!same)
    *differs = 1;
}

#define CRUCIBLE_FLOAT_KERNELS(SUFFIX, T)                                                                      \
  __global__ void crucible_scale_uniform_##SUFFIX(const T* x, T* y, std::int64_t n, std::uint64_t seed) {        \
    scale_uniform(x, y, n, seed);                                                                             \
  }                                                                                                            \
  __global__ void crucible_scale_signed_##SUFFIX(const T* x, T* y, std::int64_t n, std::uint64_t seed) {         \
    scale_signed(x, y, n, seed);                                                                              \
  }

CRUCIBLE_FLOAT_KERNELS(f32, float)
CRUCIBLE_FLOAT_KERNELS(f64, double)
CRUCIBLE_FLOAT_KERNELS(f16, __half)
CRUCIBLE_FLOAT_KERNELS(bf16, __nv_bfloat16)

} // extern "C"
