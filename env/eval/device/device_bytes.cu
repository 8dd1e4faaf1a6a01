// env/eval/device/device_bytes.cu: CUDA IPC mappings of workers' exported outputs, owned copies, and the
// comparison kernel (see device_bytes.hpp); the device clock is in device_clock.cu.
#include "env/eval/device/device_bytes.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "core/hex.hpp"
#include "env/eval/device/device_agent.hpp"
#include "env/eval/device/device_bytes_cuda.cuh"


namespace crucible::env {

using namespace detail;

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

class mapped final : public device_bytes {
public:
  mapped(int device, void* base, const std::byte* data, std::uint64_t size)
      : device_{device}, base_{base}, data_{data}, size_{size} {}
  ~mapped() override {
    const std::lock_guard work{device_work_mutex(device_)};
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
  const std::lock_guard work{device_work_mutex(device)};
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
  const std::lock_guard work{device_work_mutex(device)};
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
  const std::lock_guard work{device_work_mutex(device)};
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
  const std::lock_guard work{device_work_mutex(dst.device())};
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
  const std::lock_guard work{device_work_mutex(copies.front().dst->device())};
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
  const std::lock_guard work{device_work_mutex(spans.front()->device())};
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
  const std::lock_guard work{device_work_mutex(device)};
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
  const std::lock_guard work{device_work_mutex(device)};
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
  const std::lock_guard work{device_work_mutex(device)};
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
  const std::lock_guard work{device_work_mutex(device)};
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
  if (srcs.empty())
    return std::vector<std::shared_ptr<device_bytes>>{};
  const std::lock_guard work{device_work_mutex(srcs.front()->device())};
  if (auto* l = agent::route(*srcs.front()))
    return agent::copy_all_to_owned(*l, srcs);
  std::vector<std::shared_ptr<device_bytes>> out;
  out.reserve(srcs.size());
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


result<std::shared_ptr<device_bytes>> copy_to_owned(const device_bytes& src) {
  auto copies = copy_all_to_owned({&src});
  if (!copies)
    return copies.error();
  return std::move(copies->front());
}

result<std::vector<std::byte>> download(const device_bytes& src) {
  const std::lock_guard work{device_work_mutex(src.device())};
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
  if (pairs.empty())
    return std::vector<device_difference>{};
  const std::lock_guard work{device_work_mutex(pairs.front().want->device())};
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
  const std::lock_guard work{device_work_mutex(want.device())};
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
  const std::lock_guard work{device_work_mutex(device)};
  if (auto* l = agent::route(device))
    return agent::device_name(*l, device);
  cudaDeviceProp prop{};
  if (auto e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    (void) cudaGetLastError();
    // No such device here at all (errc::not_found): no driver, one older than this build's
    // runtime, no GPU, or a number past the visible ones.
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
      return fail(errc::not_found, "no CUDA device on this machine (", cuda_text(e),
                  "; no NVIDIA driver, or one older than this build's CUDA runtime)");
    if (e == cudaErrorInvalidDevice) {
      int visible = 0;
      (void) cudaGetDeviceCount(&visible);
      (void) cudaGetLastError();
      return fail(errc::not_found, "no CUDA device ", std::to_string(device), ": this process sees ",
                  std::to_string(visible), visible == 1 ? " device" : " devices",
                  std::getenv("CUDA_VISIBLE_DEVICES") ? std::string{" (CUDA_VISIBLE_DEVICES="} + std::getenv("CUDA_VISIBLE_DEVICES") + ")"
                                                      : std::string{});
    }
    return fail(errc::device, "CUDA device ", std::to_string(device), ": ", cuda_text(e));
  }
  return std::string{prop.name};
}

} // namespace crucible::env
