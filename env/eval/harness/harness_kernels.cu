// The evaluator worker's own device operations (env/eval/harness/worker.py, _HarnessKernels): the
// cache flush and the spin before each timed call, the timing rounds' output snapshot (a gather
// at positions drawn after the call) and check, the input-unchanged check, and the second input
// distribution's scaling.
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

// splitmix64's finaliser: positions and scale factors from (seed, index), nothing kept between
// calls, so each launch draws its own.
__device__ inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The i-th of `samples` positions in [0, n): every position when n <= samples, else drawn from
// `seed` (the bias of a 64-bit value modulo n is below n / 2^64).
__device__ inline std::int64_t position(std::uint64_t seed, std::int64_t i, std::int64_t n, std::int64_t samples) {
  if (n <= samples)
    return i;
  return static_cast<std::int64_t>(mix(seed ^ mix(static_cast<std::uint64_t>(i))) % static_cast<std::uint64_t>(n));
}

__device__ inline double as_double(float v) { return v; }
__device__ inline double as_double(double v) { return v; }
__device__ inline double as_double(__half v) { return __half2float(v); }
__device__ inline double as_double(__nv_bfloat16 v) { return __bfloat162float(v); }

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

// The snapshot of a timed call's output: taken[i] = src[position(seed, i, n, samples)], as bits.
template <class U>
__device__ void gather(const U* src, std::int64_t n, std::uint64_t seed, std::int64_t samples, U* taken) {
  const std::int64_t count = n < samples ? n : samples;
  for (std::int64_t i = first_index(); i < count; i += grid_stride())
    taken[i] = src[position(seed, i, n, samples)];
}

// Floating outputs: |cand - ref| <= atol + rtol * |ref| (torch.isclose(cand, ref)), NaN
// matching NaN and equal infinities matching. `taken` is the candidate's snapshot (gather, with
// the same seed): its i-th element is the candidate's value at the i-th position.
template <class T>
__device__ void check_close(const T* ref, const T* taken, std::int64_t n, std::uint64_t seed, std::int64_t samples,
                            double atol, double rtol, unsigned long long* mismatches) {
  const std::int64_t count = n < samples ? n : samples;
  unsigned long long bad = 0;
  for (std::int64_t i = first_index(); i < count; i += grid_stride()) {
    const std::int64_t j = position(seed, i, n, samples);
    const double x = as_double(ref[j]);
    const double y = as_double(taken[i]);
    bool ok;
    if (isnan(x) || isnan(y))
      ok = isnan(x) && isnan(y);
    else
      ok = x == y || fabs(y - x) <= atol + rtol * fabs(x);
    bad += ok ? 0 : 1;
  }
  if (bad != 0)
    atomicAdd(mismatches, bad);
}

// Other outputs (integers, bool): the same element bits.
template <class U>
__device__ void check_equal(const U* ref, const U* taken, std::int64_t n, std::uint64_t seed, std::int64_t samples,
                            unsigned long long* mismatches) {
  const std::int64_t count = n < samples ? n : samples;
  unsigned long long bad = 0;
  for (std::int64_t i = first_index(); i < count; i += grid_stride()) {
    const std::int64_t j = position(seed, i, n, samples);
    bad += ref[j] == taken[i] ? 0 : 1;
  }
  if (bad != 0)
    atomicAdd(mismatches, bad);
}

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

// Reads n16 16-byte words (the flush buffer) and adds what it read to *sink, so the reads stay.
__global__ void crucible_flush(const uint4* buf, std::int64_t n16, unsigned long long* sink) {
  unsigned int acc = 0;
  for (std::int64_t i = first_index(); i < n16; i += grid_stride()) {
    const uint4 v = buf[i];
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  for (int off = 16; off > 0; off >>= 1)
    acc += __shfl_down_sync(0xffffffffu, acc, off);
  if ((threadIdx.x & 31) == 0)
    atomicAdd(sink, static_cast<unsigned long long>(acc));
}

// One thread that keeps the device busy for `cycles` SM clock cycles.
__global__ void crucible_spin(std::int64_t cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// The gate before a timed sample: every thread slot of every SM held until the host writes a
// nonzero value to *open (mapped host memory) or `max_cycles` SM cycles have passed. Launched
// with as many 1024-thread blocks as the device holds at once, it leaves no room for any other
// kernel, on any stream of the context, so the host can queue a whole sample's calls while
// nothing of them runs; once open, the device runs the calls back to back, and the host's launch
// times are in no call's time. Thread 0 of each block polls; *timed_out is set when a block gave
// up waiting (the host then knows the sample's first calls may have waited for their launches).
__global__ void __launch_bounds__(1024, 2)
    crucible_gate(const volatile unsigned int* open, std::int64_t max_cycles, volatile unsigned int* timed_out) {
  if (threadIdx.x == 0) {
    const long long t0 = clock64();
    while (*open == 0) {
      if (clock64() - t0 >= max_cycles) {
        *timed_out = 1;
        break;
      }
      __nanosleep(256);
    }
  }
  __syncthreads();
}

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
  __global__ void crucible_round_check_##SUFFIX(const T* ref, const T* cand, std::int64_t n, std::uint64_t seed, \
                                                std::int64_t samples, double atol, double rtol,               \
                                                unsigned long long* mismatches) {                             \
    check_close(ref, cand, n, seed, samples, atol, rtol, mismatches);                                         \
  }                                                                                                            \
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

#define CRUCIBLE_EQUAL_KERNEL(SUFFIX, U)                                                                       \
  __global__ void crucible_round_check_##SUFFIX(const U* ref, const U* cand, std::int64_t n, std::uint64_t seed, \
                                                std::int64_t samples, unsigned long long* mismatches) {       \
    check_equal(ref, cand, n, seed, samples, mismatches);                                                     \
  }                                                                                                            \
  __global__ void crucible_gather_##SUFFIX(const U* src, std::int64_t n, std::uint64_t seed, std::int64_t samples, \
                                           U* taken) {                                                         \
    gather(src, n, seed, samples, taken);                                                                     \
  }

CRUCIBLE_EQUAL_KERNEL(b1, std::uint8_t)
CRUCIBLE_EQUAL_KERNEL(b2, std::uint16_t)
CRUCIBLE_EQUAL_KERNEL(b4, std::uint32_t)
CRUCIBLE_EQUAL_KERNEL(b8, std::uint64_t)

} // extern "C"
