// env/eval/device/device_bytes.cu: CUDA IPC mappings of workers' exported outputs, owned copies, and the
// comparison kernel (see device_bytes.hpp).
#include "env/eval/device/device_bytes.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "core/hex.hpp"
#include "env/eval/device/device_agent.hpp"


namespace crucible::env {

namespace {

// device_bytes_time()'s counters: nanoseconds and calls per kind of step.
struct lap_counter {
  std::atomic<std::uint64_t> ns{0}, calls{0};
};
lap_counter open_laps, close_laps, alloc_laps, copy_laps, compare_laps;

// Adds the time from construction to destruction (or to stop()) to a counter.
class lap {
public:
  explicit lap(lap_counter& c) : c_{&c} {}
  ~lap() { stop(); }
  lap(const lap&) = delete;
  lap& operator=(const lap&) = delete;
  void stop() {
    if (c_ == nullptr)
      return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count();
    c_->ns += static_cast<std::uint64_t>(ns);
    ++c_->calls;
    c_ = nullptr;
  }

private:
  lap_counter* c_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

// A failed CUDA call in a message: its name, words and where it was checked
// ("cudaErrorInvalidValue (invalid argument) at env/eval/device/device_bytes.cu:415"); cuda_text(e) below.
std::string cuda_text_at(cudaError_t e, const std::string& site) {
  return std::string{cudaGetErrorName(e)} + " (" + cudaGetErrorString(e) + ") at " + site;
}
#define cuda_text(e) cuda_text_at((e), CRUCIBLE_SITE())

result<void> select(int device) {
  if (auto e = cudaSetDevice(device); e != cudaSuccess)
    return fail(errc::device, "cannot use CUDA device ", std::to_string(device), ": ", cuda_text(e));
  return {};
}

class mapped final : public device_bytes {
public:
  mapped(int device, void* base, const std::byte* data, std::uint64_t size)
      : device_{device}, base_{base}, data_{data}, size_{size} {}
  ~mapped() override {
    lap timed{close_laps};
    if (cudaSetDevice(device_) == cudaSuccess)
      (void) cudaIpcCloseMemHandle(base_);
  }
  const void* data() const noexcept override { return data_; }
  std::uint64_t size() const noexcept override { return size_; }
  int device() const noexcept override { return device_; }

private:
  int device_;
  void* base_;
  const std::byte* data_;
  std::uint64_t size_;
};

// Memory of this process's: from the stream-ordered pool (cudaMallocAsync), or `unpooled` from
// cudaMalloc; freed when the last reference goes.
class owned final : public device_bytes {
public:
  owned(int device, void* data, std::uint64_t size, bool unpooled = false)
      : device_{device}, data_{data}, size_{size}, unpooled_{unpooled} {}
  ~owned() override {
    if (data_ == nullptr || cudaSetDevice(device_) != cudaSuccess)
      return;
    if (unpooled_)
      (void) cudaFree(data_);
    else
      (void) cudaFreeAsync(data_, cudaStreamPerThread);
  }
  const void* data() const noexcept override { return data_; }
  std::uint64_t size() const noexcept override { return size_; }
  int device() const noexcept override { return device_; }

private:
  int device_;
  void* data_;
  std::uint64_t size_;
  bool unpooled_;
};

// --- the comparison kernel -------------------------------------------------------------------

struct diff_state {
  unsigned long long mismatches;
  unsigned long long worst_bits; // a non-negative double's bits order like the double
  unsigned long long first_bad;
  // The reference's scale (scale_kernel), read by compare_kernel behind it on the same stream.
  double sumsq;             // of its finite elements
  unsigned long long finite;
  unsigned long long under; // finite elements with |want| <= atol
};

template <typename T>
__device__ double load_as_double(const void* p, unsigned long long i) {
  return static_cast<double>(static_cast<const T*>(p)[i]);
}

__device__ double load_half(const void* p, unsigned long long i) {
  unsigned int h = static_cast<const unsigned short*>(p)[i];
  unsigned int sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  return static_cast<double>(__uint_as_float(bits));
}

__device__ double load_bf16(const void* p, unsigned long long i) {
  unsigned int b = static_cast<const unsigned short*>(p)[i];
  return static_cast<double>(__uint_as_float(b << 16));
}

__device__ double load_any(const void* p, unsigned long long i, int type) {
  switch (static_cast<dtype>(type)) {
    case dtype::f64: return load_as_double<double>(p, i);
    case dtype::f32: return load_as_double<float>(p, i);
    case dtype::f16: return load_half(p, i);
    case dtype::bf16: return load_bf16(p, i);
    case dtype::i64: return load_as_double<long long>(p, i);
    case dtype::i32: return load_as_double<int>(p, i);
    case dtype::i16: return load_as_double<short>(p, i);
    case dtype::i8: return load_as_double<signed char>(p, i);
    case dtype::u8:
    case dtype::boolean: return load_as_double<unsigned char>(p, i);
  }
  return 0;
}

// The reference's scale for the scale rule (atol_for_scale): a pass over `want` alone, before
// compare_kernel on the same stream, so that the rule needs no wait on the host in between.
template <int Type>
__global__ void scale_kernel(const void* want, unsigned long long n, double atol, diff_state* out) {
  double sumsq = 0;
  unsigned long long finite = 0, under = 0;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const double w = load_any(want, i, Type);
    if (isfinite(w)) {
      sumsq += w * w;
      ++finite;
      if (fabs(w) <= atol)
        ++under;
    }
  }
  for (int s = 16; s > 0; s >>= 1) {
    sumsq += __shfl_down_sync(0xffffffffu, sumsq, s);
    finite += __shfl_down_sync(0xffffffffu, finite, s);
    under += __shfl_down_sync(0xffffffffu, under, s);
  }
  if ((threadIdx.x & 31) == 0 && finite != 0) {
    atomicAdd(&out->sumsq, sumsq);
    atomicAdd(&out->finite, finite);
    atomicAdd(&out->under, under);
  }
}

template <int Type>
__global__ void compare_kernel(const void* want, const void* got, unsigned long long n, double atol, double rtol,
                               double slack, bool scaled, diff_state* out) {
  // The scale rule from the reference's scale, measured by scale_kernel before this kernel.
  if (scaled)
    atol = atol_for_scale(atol, rtol, out->finite != 0 ? sqrt(out->sumsq / static_cast<double>(out->finite)) : 0.0);
  atol += slack;
  unsigned long long bad = 0, first = n;
  double worst = 0;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const double w = load_any(want, i, Type);
    const double g = load_any(got, i, Type);
    bool ok;
    if (isnan(w) || isnan(g)) {
      ok = isnan(w) && isnan(g);
    } else if (isinf(w) || isinf(g)) {
      ok = w == g;
    } else {
      const double d = fabs(g - w);
      worst = fmax(worst, d);
      ok = d <= atol + rtol * fabs(w);
    }
    if (!ok) {
      ++bad;
      if (first == n)
        first = i;
    }
  }
  for (int s = 16; s > 0; s >>= 1) {
    bad += __shfl_down_sync(0xffffffffu, bad, s);
    worst = fmax(worst, __shfl_down_sync(0xffffffffu, worst, s));
    first = min(first, __shfl_down_sync(0xffffffffu, first, s));
  }
  if ((threadIdx.x & 31) == 0) {
    if (bad != 0) {
      atomicAdd(&out->mismatches, bad);
      atomicMin(&out->first_bad, first);
    }
    if (worst > 0)
      atomicMax(&out->worst_bits, static_cast<unsigned long long>(__double_as_longlong(worst)));
  }
}

// Queues the scale pass (where `scaled`) and the comparison (where `compare`) of one pair.
template <int Type>
void launch(const void* want, const void* got, std::uint64_t n, double atol, double rtol, double slack, bool scaled,
            bool compare, diff_state* out, int blocks) {
  if (scaled)
    scale_kernel<Type><<<blocks, 256, 0, cudaStreamPerThread>>>(want, n, atol, out);
  if (compare)
    compare_kernel<Type><<<blocks, 256, 0, cudaStreamPerThread>>>(want, got, n, atol, rtol, slack, scaled, out);
}

constexpr bool floating(dtype t) {
  return t == dtype::f64 || t == dtype::f32 || t == dtype::f16 || t == dtype::bf16;
}

} // namespace

bool device_bytes_available() noexcept { return true; }

namespace {
// Opens `handle_hex` on `device`: the mapping's base in this process and the bytes from it to
// the end of the allocation (as this process's driver has them: the worker's word is not enough).
struct opened {
  void* base = nullptr;
  std::uint64_t extent = 0;
};
result<opened> open_handle(int device, std::string_view handle_hex) {
  cudaIpcMemHandle_t handle;
  if (handle_hex.size() != 2 * sizeof handle.reserved)
    return fail(errc::protocol, "a device handle has ", std::to_string(handle_hex.size()), " hex digits, expected ",
                std::to_string(2 * sizeof handle.reserved));
  for (size_t i = 0; i < sizeof handle.reserved; ++i) {
    int hi = hex_digit(handle_hex[2 * i]), lo = hex_digit(handle_hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return fail(errc::protocol, "a device handle is not hexadecimal");
    handle.reserved[i] = static_cast<char>(hi * 16 + lo);
  }
  if (auto r = select(device); !r)
    return r.error();
  lap timed{open_laps};
  void* base = nullptr;
  if (auto e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
    (void) cudaGetLastError();
    return fail(errc::protocol, "the worker's device handle does not open: ", cuda_text(e));
  }
  // The allocation's real extent, from this process's driver: the worker's word is not enough.
  // (The driver's entry point is looked up through the runtime, so that binaries built with
  // CUDA still start on machines without a driver.)
  using range_fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (auto e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found);
      e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    (void) cudaIpcCloseMemHandle(base);
    return fail(errc::device, "the CUDA driver has no cuMemGetAddressRange");
  }
  CUdeviceptr range_base = 0;
  size_t range_size = 0;
  if (auto e = reinterpret_cast<range_fn>(fn)(&range_base, &range_size, reinterpret_cast<CUdeviceptr>(base));
      e != CUDA_SUCCESS) {
    (void) cudaIpcCloseMemHandle(base);
    return fail(errc::device, "cannot query a mapped allocation's size (CUresult ", std::to_string(static_cast<int>(e)),
                ")");
  }
  const auto start = reinterpret_cast<CUdeviceptr>(base) - range_base;
  return opened{base, range_size - start};
}

// A span inside another (subspan): keeps its parent, and so the parent's mapping, alive.
class view final : public device_bytes {
public:
  view(std::shared_ptr<device_bytes> parent, const std::byte* data, std::uint64_t size)
      : parent_{std::move(parent)}, data_{data}, size_{size} {}
  const void* data() const noexcept override { return data_; }
  std::uint64_t size() const noexcept override { return size_; }
  int device() const noexcept override { return parent_->device(); }

private:
  std::shared_ptr<device_bytes> parent_;
  const std::byte* data_;
  std::uint64_t size_;
};
} // namespace

result<std::shared_ptr<device_bytes>> map_exported(int device, std::string_view handle_hex, std::uint64_t offset,
                                                   std::uint64_t bytes, std::uint64_t align) {
  if (auto* l = agent::route(device))
    return agent::map_exported(*l, device, handle_hex, offset, bytes, align);
  if (align == 0 || offset % align != 0)
    return fail(errc::protocol, "an exported output's offset ", std::to_string(offset), " is not aligned to ",
                std::to_string(align), " bytes");
  auto o = open_handle(device, handle_hex);
  if (!o)
    return o.error();
  if (offset > o->extent || bytes > o->extent - offset) {
    (void) cudaIpcCloseMemHandle(o->base);
    return fail(errc::protocol, "an exported output (", std::to_string(bytes), " bytes at offset ",
                std::to_string(offset), ") lies outside its allocation of ", std::to_string(o->extent), " bytes");
  }
  return std::shared_ptr<device_bytes>{
      std::make_shared<mapped>(device, o->base, static_cast<const std::byte*>(o->base) + offset, bytes)};
}

result<std::shared_ptr<device_bytes>> map_allocation(int device, std::string_view handle_hex) {
  if (auto* l = agent::route(device))
    return agent::map_allocation(*l, device, handle_hex);
  auto o = open_handle(device, handle_hex);
  if (!o)
    return o.error();
  return std::shared_ptr<device_bytes>{
      std::make_shared<mapped>(device, o->base, static_cast<const std::byte*>(o->base), o->extent)};
}

result<std::shared_ptr<device_bytes>> subspan(std::shared_ptr<device_bytes> parent, std::uint64_t offset,
                                              std::uint64_t bytes, std::uint64_t align) {
  if (!parent)
    return fail(errc::invalid_arg, "subspan of nothing");
  if (auto* l = agent::route(*parent))
    return agent::subspan(*l, *parent, offset, bytes, align);
  if (align == 0 || offset % align != 0)
    return fail(errc::protocol, "a device span's offset ", std::to_string(offset), " is not aligned to ",
                std::to_string(align), " bytes");
  if (offset > parent->size() || bytes > parent->size() - offset)
    return fail(errc::protocol, "a device span (", std::to_string(bytes), " bytes at offset ", std::to_string(offset),
                ") lies outside its allocation of ", std::to_string(parent->size()), " bytes");
  const auto* data = static_cast<const std::byte*>(parent->data()) + offset;
  return std::shared_ptr<device_bytes>{std::make_shared<view>(std::move(parent), data, bytes)};
}

namespace {
void* writable(const device_bytes& b) { return const_cast<void*>(b.data()); }

// Waits for the work queued on this thread's stream; the first error, queuing's (`e`) or the
// wait's, named after `what`.
result<void> wait_queued(cudaError_t e, const char* what) {
  const auto waited = cudaStreamSynchronize(cudaStreamPerThread);
  if (e == cudaSuccess)
    e = waited;
  if (e != cudaSuccess)
    return fail(errc::device, what, cuda_text(e));
  return {};
}
} // namespace

result<std::shared_ptr<device_bytes>> allocate_owned(int device, std::uint64_t bytes) {
  if (auto* l = agent::route(device))
    return agent::allocate_owned(*l, device, bytes);
  if (auto r = select(device); !r)
    return r.error();
  void* p = nullptr;
  if (bytes > 0)
    if (auto e = cudaMalloc(&p, bytes); e != cudaSuccess) {
      (void) cudaGetLastError();
      return fail(errc::device, "cannot allocate ", std::to_string(bytes), " bytes on CUDA device ",
                  std::to_string(device), ": ", cuda_text(e));
    }
  return std::shared_ptr<device_bytes>{std::make_shared<owned>(device, p, bytes, true)};
}

result<void> upload(const device_bytes& dst, const std::byte* src, std::uint64_t bytes) {
  if (auto* l = agent::route(dst))
    return agent::upload(*l, dst, src, bytes);
  if (bytes > dst.size())
    return fail(errc::invalid_arg, "upload: ", std::to_string(bytes), " bytes into ", std::to_string(dst.size()));
  if (auto r = select(dst.device()); !r)
    return r.error();
  if (bytes == 0)
    return {};
  lap timed{copy_laps};
  return wait_queued(cudaMemcpyAsync(writable(dst), src, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread),
                     "cannot copy inputs to the device: ");
}

result<void> copy_all(const std::vector<device_copy>& copies) {
  if (copies.empty())
    return {};
  if (auto* l = agent::route(*copies.front().dst))
    return agent::copy_all(*l, copies);
  for (const auto& c : copies)
    if (c.dst->size() != c.src->size() || c.dst->device() != copies.front().dst->device()
        || c.src->device() != c.dst->device())
      return fail(errc::invalid_arg, "copy_all: spans of different sizes or devices");
  if (auto r = select(copies.front().dst->device()); !r)
    return r.error();
  cudaError_t e = cudaSuccess;
  for (const auto& c : copies) {
    if (c.src->size() == 0)
      continue;
    e = cudaMemcpyAsync(writable(*c.dst), c.src->data(), c.src->size(), cudaMemcpyDeviceToDevice, cudaStreamPerThread);
    if (e != cudaSuccess)
      break;
  }
  return wait_queued(e, "cannot copy on the device: ");
}

result<void> fill_all(const std::vector<const device_bytes*>& spans, unsigned char value) {
  if (spans.empty())
    return {};
  if (auto* l = agent::route(*spans.front()))
    return agent::fill_all(*l, spans, value);
  if (auto r = select(spans.front()->device()); !r)
    return r.error();
  cudaError_t e = cudaSuccess;
  for (const auto* s : spans) {
    if (s->size() == 0)
      continue;
    e = cudaMemsetAsync(writable(*s), value, s->size(), cudaStreamPerThread);
    if (e != cudaSuccess)
      break;
  }
  return wait_queued(e, "cannot fill device memory: ");
}

result<double> fastest_fill_ms(int device, std::uint64_t bytes) {
  if (auto* l = agent::route(device))
    return agent::fastest_fill_ms(*l, device, bytes);
  if (bytes == 0)
    return 0.0;
  auto buf = allocate_owned(device, bytes);
  if (!buf)
    return buf.error();
  cudaEvent_t a = nullptr, b = nullptr;
  if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess) {
    if (a != nullptr)
      (void) cudaEventDestroy(a);
    (void) cudaGetLastError();
    return fail(errc::device, "cannot create CUDA events");
  }
  double best = 1e300;
  cudaError_t e = cudaSuccess;
  for (int k = 0; k < 6 && e == cudaSuccess; ++k) { // the first fill only touches the memory
    e = cudaEventRecord(a, cudaStreamPerThread);
    if (e == cudaSuccess)
      e = cudaMemsetAsync(writable(**buf), k + 1, bytes, cudaStreamPerThread);
    if (e == cudaSuccess)
      e = cudaEventRecord(b, cudaStreamPerThread);
    if (e == cudaSuccess)
      e = cudaEventSynchronize(b);
    float ms = 0;
    if (e == cudaSuccess)
      e = cudaEventElapsedTime(&ms, a, b);
    if (e == cudaSuccess && k > 0)
      best = std::min(best, static_cast<double>(ms));
  }
  (void) cudaEventDestroy(a);
  (void) cudaEventDestroy(b);
  if (e != cudaSuccess)
    return fail(errc::device, "cannot time a fill on the device: ", cuda_text(e));
  return best;
}

result<void> flush_device_cache(int device, std::uint64_t bytes) {
  if (auto* l = agent::route(device))
    return agent::flush_device_cache(*l, device, bytes);
  static std::mutex mtx;
  static std::map<int, std::shared_ptr<device_bytes>> buffers;
  std::shared_ptr<device_bytes> buf;
  {
    std::lock_guard guard{mtx};
    auto& b = buffers[device];
    if (!b) {
      if (auto r = select(device); !r)
        return r.error();
      int l2 = 0;
      (void) cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
      auto made = allocate_owned(device, std::max<std::uint64_t>(bytes, 2 * static_cast<std::uint64_t>(l2)));
      if (!made)
        return made.error();
      b = std::move(*made);
    }
    buf = b;
  }
  return fill_all({buf.get()}, 0);
}

namespace {
// `device` selected, its default memory pool (where cudaMallocAsync takes from).
result<cudaMemPool_t> default_pool(int device) {
  if (auto r = select(device); !r)
    return r.error();
  cudaMemPool_t pool = nullptr;
  if (auto e = cudaDeviceGetDefaultMemPool(&pool, device); e != cudaSuccess)
    return fail(errc::device, "cannot get the default memory pool of CUDA device ", std::to_string(device), ": ",
                cuda_text(e));
  return pool;
}
} // namespace

result<void> keep_freed_memory(int device, std::uint64_t bytes) {
  if (auto* l = agent::route(device))
    return agent::keep_freed_memory(*l, device, bytes);
  auto pool = default_pool(device);
  if (!pool)
    return pool.error();
  std::uint64_t threshold = bytes;
  if (auto e = cudaMemPoolSetAttribute(*pool, cudaMemPoolAttrReleaseThreshold, &threshold); e != cudaSuccess)
    return fail(errc::device, "cannot set the memory pool's release threshold: ", cuda_text(e));
  return {};
}

result<void> release_freed_memory(int device) {
  if (auto* l = agent::route(device))
    return agent::release_freed_memory(*l, device);
  auto pool = default_pool(device);
  if (!pool)
    return pool.error();
  // The frees are ordered on the evaluating threads' streams: done once the device is.
  if (auto e = cudaDeviceSynchronize(); e != cudaSuccess)
    return fail(errc::device, "cannot wait for CUDA device ", std::to_string(device), ": ", cuda_text(e));
  if (auto e = cudaMemPoolTrimTo(*pool, 0); e != cudaSuccess)
    return fail(errc::device, "cannot trim the memory pool of CUDA device ", std::to_string(device), ": ",
                cuda_text(e));
  return {};
}

result<std::vector<std::shared_ptr<device_bytes>>> copy_all_to_owned(const std::vector<const device_bytes*>& srcs) {
  if (!srcs.empty())
    if (auto* l = agent::route(*srcs.front()))
      return agent::copy_all_to_owned(*l, srcs);
  std::vector<std::shared_ptr<device_bytes>> out;
  out.reserve(srcs.size());
  if (srcs.empty())
    return out;
  const int device = srcs.front()->device();
  for (const auto* src : srcs)
    if (src->device() != device)
      return fail(errc::invalid_arg, "copy_all_to_owned: spans on devices ", std::to_string(device), " and ",
                  std::to_string(src->device()));
  if (auto r = select(device); !r)
    return r.error();
  // Every copy is queued first and waited for once: under load each wait on the device costs
  // milliseconds whatever it waits for (docs/performance-history.md, "The evaluator's own
  // device calls").
  lap allocating{alloc_laps};
  std::vector<void*> dst;
  dst.reserve(srcs.size());
  for (const auto* src : srcs) {
    void* p = nullptr;
    if (src->size() > 0) {
      if (auto e = cudaMallocAsync(&p, src->size(), cudaStreamPerThread); e != cudaSuccess) {
        (void) cudaGetLastError();
        return fail(errc::device, "cannot allocate ", std::to_string(src->size()), " bytes for a reference output: ",
                    cuda_text(e));
      }
    }
    out.push_back(std::make_shared<owned>(device, p, src->size()));
    dst.push_back(p);
  }
  allocating.stop();
  lap copying{copy_laps};
  cudaError_t e = cudaSuccess;
  for (size_t i = 0; i < srcs.size() && e == cudaSuccess; ++i)
    if (srcs[i]->size() > 0)
      e = cudaMemcpyAsync(dst[i], srcs[i]->data(), srcs[i]->size(), cudaMemcpyDeviceToDevice, cudaStreamPerThread);
  // Waited for on failure too: the copies queued so far end before their sources go.
  if (auto r = wait_queued(e, "cannot copy a reference output: "); !r)
    return r.error();
  return out;
}


namespace {
// The hold of an armed clock: spins until the host-mapped flag reaches `value`.
__global__ void hold_kernel(const volatile unsigned* flag, unsigned value) {
  while (*flag < value)
    __nanosleep(256);
}

// The device's own nanosecond clock, common to every multiprocessor.
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A sealed copy's record, in this process's device memory: when its first block started, when
// its blocks were all resident at once (the rendezvous), how many have arrived, and whether one
// gave up waiting for the others.
struct seal_state {
  unsigned long long t_first;
  unsigned long long t_met;
  unsigned arrived;
  unsigned broken;
};

// One span to copy, and the index of its first chunk among all the copy's chunks.
struct seal_job {
  char* dst;
  const char* src;
  unsigned long long bytes;
  unsigned long long first_chunk;
};

constexpr int seal_threads = 512;
constexpr unsigned long long seal_chunk = 64ull << 10;
constexpr int seal_max_jobs = 4096;

__global__ void seal_reset(seal_state* s) {
  s->t_first = ~0ull;
  s->t_met = 0;
  s->arrived = 0;
  s->broken = 0;
}

// The sealed copy: a grid of exactly as many blocks as the device holds at once (every warp slot
// of every multiprocessor, 32 registers a thread at most), which waits until all its blocks are
// resident together before any of them copies. While they are, no block of any other process's
// (an MPS client's kernel) is resident anywhere on the device: a kernel of a worker's still
// running holds its slots, and the copy waits for it to end. The chunks of all spans are copied
// in an order drawn by this process for each copy ((a*i + c) mod n, gcd(a, n) = 1), which no
// worker knows. A block that waits longer than `deadline_ns` for the others marks the copy broken,
// and every block then returns without copying.
__global__ void __launch_bounds__(seal_threads, 4)
  sealed_copy(seal_state* s, const seal_job* jobs, int njobs, unsigned long long chunks, unsigned long long a,
              unsigned long long c, unsigned long long deadline_ns) {
  __shared__ int go_on;
  if (threadIdx.x == 0) {
    const unsigned long long t_in = global_ns();
    atomicMin(&s->t_first, t_in);
    const unsigned n = atomicAdd(&s->arrived, 1u) + 1u;
    bool broken = false;
    if (n == gridDim.x) {
      s->t_met = global_ns();
      __threadfence();
    } else {
      const volatile unsigned* arrived = &s->arrived;
      const volatile unsigned* flag = &s->broken;
      while (*arrived < gridDim.x) {
        if (*flag != 0u) {
          broken = true;
          break;
        }
        if (global_ns() - t_in > deadline_ns) {
          atomicExch(&s->broken, 1u);
          broken = true;
          break;
        }
        __nanosleep(128);
      }
    }
    go_on = broken || *static_cast<volatile unsigned*>(&s->broken) != 0u ? 0 : 1;
  }
  __syncthreads();
  if (go_on == 0)
    return;
  for (unsigned long long i = blockIdx.x; i < chunks; i += gridDim.x) {
    const unsigned long long k = (a * i + c) % chunks;
    int lo = 0, hi = njobs - 1; // the last job whose first chunk is <= k
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (jobs[mid].first_chunk <= k)
        lo = mid;
      else
        hi = mid - 1;
    }
    const seal_job& j = jobs[lo];
    const unsigned long long off = (k - j.first_chunk) * seal_chunk;
    const unsigned long long len = min(seal_chunk, j.bytes - off);
    char* d = j.dst + off;
    const char* src = j.src + off;
    const auto da = reinterpret_cast<unsigned long long>(d), sa = reinterpret_cast<unsigned long long>(src);
    if (((da ^ sa) & 15ull) == 0) {
      // Bytes up to the first 16-byte boundary, then 16 bytes at a time, then the tail.
      const unsigned long long head = min(len, (16ull - (da & 15ull)) & 15ull);
      for (unsigned long long b = threadIdx.x; b < head; b += blockDim.x)
        d[b] = src[b];
      const unsigned long long body = (len - head) / 16ull;
      const uint4* sv = reinterpret_cast<const uint4*>(src + head);
      uint4* dv = reinterpret_cast<uint4*>(d + head);
      for (unsigned long long v = threadIdx.x; v < body; v += blockDim.x)
        dv[v] = sv[v];
      for (unsigned long long b = head + body * 16ull + threadIdx.x; b < len; b += blockDim.x)
        d[b] = src[b];
    } else {
      for (unsigned long long b = threadIdx.x; b < len; b += blockDim.x)
        d[b] = src[b];
    }
  }
}

// The driver's stream memory operations (cuStreamWriteValue32, cuStreamWaitValue32), found
// through the runtime so that nothing here links the driver itself.
using stream_value_fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
struct stream_value_ops {
  stream_value_fn write = nullptr;
  stream_value_fn wait = nullptr;
};

result<stream_value_ops> load_stream_value_ops() {
  auto entry = [](const char* name) -> result<stream_value_fn> {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess
        || found != cudaDriverEntryPointSuccess || fn == nullptr) {
      (void) cudaGetLastError();
      return fail(errc::unsupported, "the CUDA driver has no ", name);
    }
    return reinterpret_cast<stream_value_fn>(fn);
  };
  auto write = entry("cuStreamWriteValue32");
  if (!write)
    return write.error();
  auto wait = entry("cuStreamWaitValue32");
  if (!wait)
    return wait.error();
  return stream_value_ops{*write, *wait};
}

CUdeviceptr word_address(const device_bytes& word) {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(word.data()));
}

std::uint64_t gcd64(std::uint64_t a, std::uint64_t b) {
  while (b != 0) {
    const auto t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// How long a sealed copy's blocks wait for each other before they give up: a worker's kernel that
// holds part of the device this long is left running, not finishing. Long beside any one kernel
// of company a warm-up may have (references, the policy's generation).
constexpr double seal_deadline_s = 20.0;

class cuda_clock final : public device_clock {
public:
  explicit cuda_clock(int device) : device_{device}, rng_{std::random_device{}()} {}
  ~cuda_clock() override {
    if (cudaSetDevice(device_) != cudaSuccess)
      return;
    if (active_)
      (void) finish(5.0);
    if (stuck_) // its stream may still hold work behind a worker's kernel: nothing here is freed
      return;
    if (stream_ != nullptr)
      (void) cudaStreamDestroy(stream_);
    if (side_ != nullptr)
      (void) cudaStreamDestroy(side_);
    if (flag_ != nullptr)
      (void) cudaFreeHost(const_cast<unsigned*>(flag_));
    for (auto* p : {static_cast<void*>(states_), static_cast<void*>(jobs_dev_[0]), static_cast<void*>(jobs_dev_[1])})
      if (p != nullptr)
        (void) cudaFree(p);
    for (auto* p : {static_cast<void*>(jobs_host_[0]), static_cast<void*>(jobs_host_[1]), static_cast<void*>(read_)})
      if (p != nullptr)
        (void) cudaFreeHost(p);
  }

  result<void> init() {
    if (auto r = select(device_); !r)
      return r.error();
    auto ops = load_stream_value_ops();
    if (!ops)
      return ops.error();
    ops_ = *ops;
    void* host = nullptr;
    cudaError_t e = cudaHostAlloc(&host, sizeof(unsigned), cudaHostAllocMapped);
    if (e == cudaSuccess) {
      flag_ = static_cast<volatile unsigned*>(host);
      *flag_ = 0;
      e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev_), host, 0);
    }
    if (e == cudaSuccess)
      e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (e == cudaSuccess)
      e = cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking);
    if (e == cudaSuccess)
      e = cudaMalloc(reinterpret_cast<void**>(&states_), 2 * sizeof(seal_state));
    for (int k = 0; k < 2 && e == cudaSuccess; ++k) {
      e = cudaMalloc(reinterpret_cast<void**>(&jobs_dev_[k]), seal_max_jobs * sizeof(seal_job));
      if (e == cudaSuccess)
        e = cudaHostAlloc(reinterpret_cast<void**>(&jobs_host_[k]), seal_max_jobs * sizeof(seal_job), cudaHostAllocDefault);
    }
    if (e == cudaSuccess)
      e = cudaHostAlloc(reinterpret_cast<void**>(&read_), 2 * sizeof(seal_state), cudaHostAllocDefault);
    // The grid that fills the device: every warp slot of every multiprocessor.
    int sms = 0, threads_per_sm = 0, per_sm = 0;
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_);
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device_);
    if (e == cudaSuccess)
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sealed_copy, seal_threads, 0);
    if (e != cudaSuccess) {
      (void) cudaGetLastError();
      return fail(errc::device, "cannot make the device clock: ", cuda_text(e));
    }
    if (per_sm * seal_threads != threads_per_sm)
      return fail(errc::unsupported, "cannot make the device clock: its sealed copy holds " + std::to_string(per_sm * seal_threads)
                                       + " of a multiprocessor's " + std::to_string(threads_per_sm)
                                       + " threads on this device, which would leave room for a worker's kernel beside it");
    grid_ = per_sm * sms;
    return {};
  }

  result<void> arm(const std::vector<device_copy>& copies_in, const device_bytes& go, std::uint32_t seq) override {
    if (active_)
      return fail(errc::invalid_arg, "device clock armed twice");
    if (go.size() < sizeof(std::uint32_t))
      return fail(errc::invalid_arg, "device clock: the go word is smaller than 4 bytes");
    if (auto r = select(device_); !r)
      return r.error();
    if (stuck_) {
      if (cudaStreamQuery(stream_) != cudaSuccess) {
        (void) cudaGetLastError();
        return fail(errc::device, "the device clock is still held behind a worker's kernel that never ended");
      }
      stuck_ = false;
    }
    std::vector<std::pair<const device_bytes*, const device_bytes*>> spans;
    for (const auto& c : copies_in) {
      if (c.dst->size() != c.src->size())
        return fail(errc::invalid_arg, "device clock: a copy between spans of different sizes");
      spans.emplace_back(c.dst, c.src);
    }
    if (spans.size() > static_cast<std::size_t>(seal_max_jobs))
      return fail(errc::invalid_arg, "device clock: a sample of " + std::to_string(spans.size()) + " input spans (at most "
                                       + std::to_string(seal_max_jobs) + ")");
    ++generation_;
    closed_ = false;
    // Both copies' records reset and the copy in's spans on the device before the hold.
    seal_reset<<<1, 1, 0, stream_>>>(states_);
    seal_reset<<<1, 1, 0, stream_>>>(states_ + 1);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
      e = stage(0, spans);
    if (e != cudaSuccess)
      return fail(errc::device, "cannot arm the device clock: ", cuda_text(e));
    hold_kernel<<<1, 1, 0, stream_>>>(flag_dev_, generation_);
    active_ = held_ = true; // from here on the hold must be let go, whatever fails
    e = cudaGetLastError();
    // The window opens as the copy in starts (its first block's clock), and the inputs are
    // written only once the copy holds the whole device: nothing of a worker's runs beside it.
    if (e == cudaSuccess)
      e = launch(0);
    if (e != cudaSuccess)
      return fail(errc::device, "cannot arm the device clock: ", cuda_text(e));
    // The go word, written after the copies with the driver's memory barrier: the worker's stream
    // waits for it before its calls.
    if (auto r = ops_.write(reinterpret_cast<CUstream>(stream_), word_address(go), seq, 0); r != CUDA_SUCCESS)
      return fail(errc::device, "cannot arm the device clock: cuStreamWriteValue32 failed (" + std::to_string(static_cast<int>(r)) + ") at " + CRUCIBLE_SITE());
    return {};
  }

  result<std::vector<std::shared_ptr<device_bytes>>> close(const device_bytes& done, std::uint32_t seq,
                                                           const std::vector<const device_bytes*>& outs) override {
    if (!active_)
      return fail(errc::invalid_arg, "device clock closed before it was armed");
    if (done.size() < sizeof(std::uint32_t))
      return fail(errc::invalid_arg, "device clock: the done word is smaller than 4 bytes");
    if (auto r = select(device_); !r)
      return r.error();
    if (outs.size() > static_cast<std::size_t>(seal_max_jobs))
      return fail(errc::invalid_arg, "device clock: a sample of " + std::to_string(outs.size()) + " output spans (at most "
                                       + std::to_string(seal_max_jobs) + ")");
    // The copies' memory and spans are queued before the wait for `done`: they run beside the
    // worker's calls, not after them.
    cudaError_t e = cudaSuccess;
    std::vector<std::shared_ptr<device_bytes>> copies;
    std::vector<std::pair<const device_bytes*, const device_bytes*>> spans;
    for (const auto* src : outs) {
      void* p = nullptr;
      if (src->size() > 0) {
        e = cudaMallocAsync(&p, src->size(), stream_);
        if (e != cudaSuccess)
          break;
      }
      copies.push_back(std::make_shared<owned>(device_, p, src->size()));
      spans.emplace_back(copies.back().get(), src);
    }
    if (e == cudaSuccess)
      e = stage(1, spans);
    if (e != cudaSuccess)
      return fail(errc::device, "cannot close the device clock: ", cuda_text(e));
    if (auto r = ops_.wait(reinterpret_cast<CUstream>(stream_), word_address(done), seq, CU_STREAM_WAIT_VALUE_GEQ);
        r != CUDA_SUCCESS)
      return fail(errc::device, "cannot close the device clock: cuStreamWaitValue32 failed (" + std::to_string(static_cast<int>(r)) + ") at " + CRUCIBLE_SITE());
    done_ = word_address(done);
    done_seq_ = seq;
    closed_ = true;
    // The window closes when the copy out holds the whole device (its rendezvous): from then on no
    // kernel of the worker's runs until the outputs are read, in an order it cannot know, so what
    // it had not written by then is copied unwritten, and a kernel of its still running holds the
    // rendezvous back, inside the window. The reads themselves lie outside it: both sides' outputs
    // are read alike, warm in the cache or not.
    if (e == cudaSuccess)
      e = launch(1);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(read_, states_, 2 * sizeof(seal_state), cudaMemcpyDeviceToHost, stream_);
    if (e != cudaSuccess)
      return fail(errc::device, "cannot close the device clock: ", cuda_text(e));
    return copies;
  }

  void let_go() noexcept override {
    if (!held_)
      return;
    __atomic_store_n(const_cast<unsigned*>(flag_), generation_, __ATOMIC_SEQ_CST);
    held_ = false;
  }

  result<double> finish(double timeout_s) override {
    if (!active_)
      return fail(errc::invalid_arg, "device clock finished before it was armed");
    let_go();
    active_ = false;
    if (auto r = select(device_); !r)
      return r.error();
    // Waited for with a deadline: a worker that never writes its done word would hold this
    // stream for ever. Past the deadline this process writes the word itself, from a second
    // stream, and the sample is refused; a kernel of the worker's that never ends holds the copy
    // out's rendezvous, whose blocks give up after seal_deadline_s.
    auto wait_until = [&](std::chrono::steady_clock::time_point deadline) {
      cudaError_t e = cudaStreamQuery(stream_);
      while (e == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        e = cudaStreamQuery(stream_);
      }
      return e;
    };
    auto after = [](double s) {
      return std::chrono::steady_clock::now()
             + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
    };
    cudaError_t e = wait_until(after(timeout_s));
    bool late = false;
    if (e == cudaErrorNotReady && closed_) {
      late = true;
      (void) ops_.write(reinterpret_cast<CUstream>(side_), done_, done_seq_, 0);
      e = wait_until(after(2 * seal_deadline_s + 5.0));
    }
    if (e == cudaErrorNotReady) {
      // Something of a worker's holds the device beyond every deadline (a kernel that never ends
      // where its blocks leave this stream's none of the device): the clock is not used again
      // until its stream is free (the worker killed).
      stuck_ = true;
      return fail(errc::timeout, "the device stayed held by a worker's kernel for " + std::to_string(static_cast<int>(timeout_s + 2 * seal_deadline_s + 5.0)) + " s");
    }
    if (e == cudaSuccess)
      e = cudaStreamSynchronize(side_);
    if (late) {
      (void) cudaGetLastError();
      char buf[96];
      std::snprintf(buf, sizeof buf, "the worker's stream did not finish its calls in %.1f s", timeout_s);
      return fail(errc::timeout, buf);
    }
    if (!closed_)
      return fail(errc::invalid_arg, "device clock finished before it was closed");
    if (e != cudaSuccess) {
      (void) cudaGetLastError();
      return fail(errc::device, "cannot read the device clock: ", cuda_text(e));
    }
    const seal_state& in = read_[0];
    const seal_state& out = read_[1];
    if (in.broken != 0 || out.broken != 0) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "the device was not free for %.0f s %s the worker's calls (a kernel of the worker's left running)",
                    seal_deadline_s, in.broken != 0 ? "before" : "after");
      return fail(errc::timeout, buf);
    }
    if (out.t_met < in.t_first || in.t_first == ~0ull)
      return fail(errc::device, "cannot read the device clock: its window closed before it opened");
    return static_cast<double>(out.t_met - in.t_first) / 1e6;
  }

private:
  // A sealed copy's spans ([dst, src] pairs) for record `which` (0: in, 1: out): the job table
  // queued to the device, and the order of its chunks drawn.
  cudaError_t stage(int which, const std::vector<std::pair<const device_bytes*, const device_bytes*>>& spans) {
    seal_job* host = jobs_host_[which];
    int n = 0;
    unsigned long long chunks = 0;
    for (const auto& [dst, src] : spans) {
      if (src->size() == 0)
        continue;
      if (n == seal_max_jobs)
        return cudaErrorInvalidValue;
      host[n++] = seal_job{static_cast<char*>(const_cast<void*>(dst->data())), static_cast<const char*>(src->data()),
                           src->size(), chunks};
      chunks += (src->size() + seal_chunk - 1) / seal_chunk;
    }
    if (chunks >= (1ull << 32))
      return cudaErrorInvalidValue;
    std::uint64_t a = 1, c = 0;
    if (chunks > 1) {
      std::uniform_int_distribution<std::uint64_t> pick(1, chunks - 1);
      do
        a = pick(rng_);
      while (gcd64(a, chunks) != 1);
      c = pick(rng_);
    }
    plan_[which] = seal_plan{n, chunks, a, c};
    if (n == 0)
      return cudaSuccess;
    return cudaMemcpyAsync(jobs_dev_[which], host, static_cast<std::size_t>(n) * sizeof(seal_job), cudaMemcpyHostToDevice,
                           stream_);
  }

  // Queues the sealed copy staged for `which`.
  cudaError_t launch(int which) {
    const auto& p = plan_[which];
    sealed_copy<<<grid_, seal_threads, 0, stream_>>>(states_ + which, jobs_dev_[which], p.jobs, p.chunks, p.a, p.c,
                                                     static_cast<unsigned long long>(seal_deadline_s * 1e9));
    return cudaGetLastError();
  }

  struct seal_plan {
    int jobs = 0;
    unsigned long long chunks = 0, a = 1, c = 0;
  };
  int device_;
  std::mt19937_64 rng_;
  stream_value_ops ops_;
  volatile unsigned* flag_ = nullptr;
  unsigned* flag_dev_ = nullptr;
  unsigned generation_ = 0;
  bool active_ = false; // armed, not finished
  bool held_ = false;   // armed, not let go
  bool closed_ = false; // its end queued
  bool stuck_ = false;  // its stream did not drain: held behind a worker's kernel
  int grid_ = 0;
  seal_state* states_ = nullptr; // [0] the copy in's, [1] the copy out's
  seal_state* read_ = nullptr;   // their copy in this process's pinned memory, read by finish
  seal_job* jobs_dev_[2] = {nullptr, nullptr};
  seal_job* jobs_host_[2] = {nullptr, nullptr};
  seal_plan plan_[2];
  CUdeviceptr done_ = 0;
  std::uint32_t done_seq_ = 0;
  cudaStream_t stream_ = nullptr, side_ = nullptr;
};
} // namespace

result<std::unique_ptr<device_clock>> make_device_clock(int device) {
  if (auto* l = agent::route(device))
    return agent::make_device_clock(*l, device);
  auto c = std::make_unique<cuda_clock>(device);
  if (auto r = c->init(); !r)
    return r.error();
  return std::unique_ptr<device_clock>{std::move(c)};
}

result<std::shared_ptr<device_bytes>> copy_to_owned(const device_bytes& src) {
  auto copies = copy_all_to_owned({&src});
  if (!copies)
    return copies.error();
  return std::move(copies->front());
}

result<std::vector<std::byte>> download(const device_bytes& src) {
  if (auto* l = agent::route(src))
    return agent::download(*l, src);
  if (auto r = select(src.device()); !r)
    return r.error();
  std::vector<std::byte> out(src.size());
  if (!out.empty()) {
    if (auto e = cudaMemcpy(out.data(), src.data(), out.size(), cudaMemcpyDeviceToHost); e != cudaSuccess)
      return fail(errc::device, "cannot copy an output to the host: ", cuda_text(e));
  }
  return out;
}

namespace {
// device_compare_all's work, or with `compare` false, the scale passes alone (device_scale).
result<std::vector<device_difference>> run_batch(const std::vector<device_comparison>& pairs, bool compare) {
  std::vector<device_difference> res(pairs.size());
  if (pairs.empty())
    return res;
  const int device = pairs.front().want->device();
  for (const auto& c : pairs) {
    const auto es = element_size(c.type);
    if (c.want->size() < c.n * es || c.got->size() < c.n * es)
      return fail(errc::invalid_arg, "device_compare: ", std::to_string(c.n), " elements do not fit the buffers");
    if (c.want->device() != device || c.got->device() != device)
      return fail(errc::invalid_arg, "device_compare: buffers on devices ", std::to_string(c.want->device()), " and ",
                  std::to_string(c.got->device()));
  }
  if (auto r = select(device); !r)
    return r.error();
  // One kernel per pair, each with its own slot of counters, queued together and waited for
  // once (one wait instead of one per pair; see copy_all_to_owned).
  lap timed{compare_laps};
  const auto count = pairs.size();
  diff_state* state = nullptr;
  if (auto e = cudaMallocAsync(reinterpret_cast<void**>(&state), count * sizeof(diff_state), cudaStreamPerThread);
      e != cudaSuccess) {
    (void) cudaGetLastError();
    return fail(errc::device, "device_compare: ", cuda_text(e));
  }
  std::vector<diff_state> host(count);
  for (size_t i = 0; i < count; ++i)
    host[i] = diff_state{0, 0, pairs[i].n, 0, 0, 0};
  cudaError_t e = cudaMemcpyAsync(state, host.data(), count * sizeof(diff_state), cudaMemcpyHostToDevice,
                                  cudaStreamPerThread);
  int sms = 0;
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  for (size_t i = 0; i < count && e == cudaSuccess; ++i) {
    const auto& c = pairs[i];
    if (c.n == 0)
      continue;
    const auto wanted_blocks = (c.n + 255) / 256;
    const int blocks = static_cast<int>(std::min<std::uint64_t>(wanted_blocks, static_cast<std::uint64_t>(sms) * 8));
    const double atol = c.tol.atol, rtol = c.tol.rtol, slack = atol > 0 || rtol > 0 ? c.slack : 0.0;
    // The scale pass only where the rule can change atol (or where the scale alone is asked for).
    const bool scaled = floating(c.type) && (compare ? atol > 0 && rtol > 0 : true);
    if (!scaled && !compare)
      continue;
    const void* want = c.want->data();
    const void* got = c.got->data();
    diff_state* out = state + i;
#define CRUCIBLE_LAUNCH(T) launch<static_cast<int>(T)>(want, got, c.n, atol, rtol, slack, scaled, compare, out, blocks)
    switch (c.type) {
      case dtype::f64: CRUCIBLE_LAUNCH(dtype::f64); break;
      case dtype::f32: CRUCIBLE_LAUNCH(dtype::f32); break;
      case dtype::f16: CRUCIBLE_LAUNCH(dtype::f16); break;
      case dtype::bf16: CRUCIBLE_LAUNCH(dtype::bf16); break;
      case dtype::i64: CRUCIBLE_LAUNCH(dtype::i64); break;
      case dtype::i32: CRUCIBLE_LAUNCH(dtype::i32); break;
      case dtype::i16: CRUCIBLE_LAUNCH(dtype::i16); break;
      case dtype::i8: CRUCIBLE_LAUNCH(dtype::i8); break;
      case dtype::u8: CRUCIBLE_LAUNCH(dtype::u8); break;
      case dtype::boolean: CRUCIBLE_LAUNCH(dtype::boolean); break;
    }
#undef CRUCIBLE_LAUNCH
    e = cudaGetLastError();
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(host.data(), state, count * sizeof(diff_state), cudaMemcpyDeviceToHost, cudaStreamPerThread);
  (void) cudaFreeAsync(state, cudaStreamPerThread);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(cudaStreamPerThread);
  else
    (void) cudaStreamSynchronize(cudaStreamPerThread);
  if (e != cudaSuccess)
    return fail(errc::device, "comparing outputs on the device: ", cuda_text(e));
  for (size_t i = 0; i < count; ++i) {
    const auto& c = pairs[i];
    auto& r = res[i];
    r.finite = host[i].finite;
    r.under_atol = host[i].under;
    // The same expression as the kernel's (IEEE division and square root on both sides), so that
    // the message names the atol the kernel used.
    r.rms = r.finite != 0 ? std::sqrt(host[i].sumsq / static_cast<double>(r.finite)) : 0.0;
    r.mismatches = host[i].mismatches;
    double worst;
    std::memcpy(&worst, &host[i].worst_bits, sizeof worst);
    r.max_abs_diff = worst;
    if (!compare || r.mismatches == 0)
      continue;
    r.first_bad = host[i].first_bad;
    // The two values at the first mismatch, for the message.
    const auto es = element_size(c.type);
    const auto at = r.first_bad * es;
    if (auto e1 = cudaMemcpy(r.want_first, static_cast<const std::byte*>(c.want->data()) + at, es,
                             cudaMemcpyDeviceToHost);
        e1 != cudaSuccess)
      return fail(errc::device, "reading a mismatching element: ", cuda_text(e1));
    if (auto e2 = cudaMemcpy(r.got_first, static_cast<const std::byte*>(c.got->data()) + at, es,
                             cudaMemcpyDeviceToHost);
        e2 != cudaSuccess)
      return fail(errc::device, "reading a mismatching element: ", cuda_text(e2));
  }
  return res;
}

} // namespace

result<std::vector<device_difference>> device_compare_all(const std::vector<device_comparison>& pairs) {
  if (!pairs.empty())
    if (auto* l = agent::route(*pairs.front().want))
      return agent::compare_all(*l, pairs, true);
  return run_batch(pairs, true);
}

result<device_difference> device_compare(const device_bytes& want, const device_bytes& got, dtype t, std::uint64_t n,
                                         const tolerance& tol, double slack) {
  auto all = device_compare_all({device_comparison{&want, &got, t, n, tol, slack}});
  if (!all)
    return all.error();
  return all->front();
}

result<device_difference> device_scale(const device_bytes& want, dtype t, std::uint64_t n, double atol) {
  if (auto* l = agent::route(want)) {
    auto one = agent::compare_all(*l, {device_comparison{&want, nullptr, t, n, tolerance{atol, 0}, 0}}, false);
    if (!one)
      return one.error();
    return one->front();
  }
  auto all = run_batch({device_comparison{&want, &want, t, n, tolerance{atol, 0}, 0}}, false);
  if (!all)
    return all.error();
  return all->front();
}

device_bytes_times device_bytes_time() noexcept {
  device_bytes_times t;
  t.open_ns = open_laps.ns;
  t.opens = open_laps.calls;
  t.close_ns = close_laps.ns;
  t.closes = close_laps.calls;
  t.alloc_ns = alloc_laps.ns;
  t.allocs = alloc_laps.calls;
  t.copy_ns = copy_laps.ns;
  t.copies = copy_laps.calls;
  t.compare_ns = compare_laps.ns;
  t.compares = compare_laps.calls;
  agent::add_times(t); // the device agents' (env/eval/device/device_agent.hpp)
  return t;
}

result<std::string> device_name(int device) {
  if (auto* l = agent::route(device))
    return agent::device_name(*l, device);
  cudaDeviceProp prop{};
  if (auto e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    (void) cudaGetLastError();
    return fail(errc::device, "CUDA device ", std::to_string(device), ": ", cuda_text(e));
  }
  return std::string{prop.name};
}

} // namespace crucible::env
