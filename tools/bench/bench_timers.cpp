// tools/bench/bench_timers.cpp: the copy-bandwidth timer of bench_timers.hpp: torch tensors and
// CUDA events.
#include "tools/bench/bench_timers.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include <torch/torch.h>

#include "policy/runtime.hpp"

#ifdef CRUCIBLE_HAVE_CUDA
#  include <ATen/cuda/CUDAEvent.h>
#  include <c10/cuda/CUDACachingAllocator.h>
#  include <c10/cuda/CUDAGuard.h>
#  include <cuda_runtime_api.h>
#endif

namespace crucible::bench {

#ifdef CRUCIBLE_HAVE_CUDA
using policy::cuda_device_exists;
#endif

result<double> copy_bandwidth(std::string_view device, std::uint64_t bytes, int repeats) {
  if (bytes == 0 || repeats < 1)
    return fail(errc::invalid_arg, "copy_bandwidth: needs bytes > 0 and repeats >= 1");
  double best = 0.0; // seconds of the fastest copy
  if (device == "cpu") {
    auto src = std::make_unique<char[]>(bytes), dst = std::make_unique<char[]>(bytes);
    std::memset(src.get(), 1, bytes);
    std::memset(dst.get(), 2, bytes); // touch every page before timing
    for (int i = 0; i < repeats; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      std::memcpy(dst.get(), src.get(), bytes);
      asm volatile("" : : "r"(dst.get()) : "memory"); // the copy is observed: not optimised away
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = i == 0 ? s : std::min(best, s);
    }
    return 2.0 * static_cast<double>(bytes) / best;
  }
  const int index = policy::cuda_index(device);
  if (index < 0)
    return fail(errc::invalid_arg, "copy_bandwidth: '", device, "' is not a device (cpu, cuda:N)");
#ifdef CRUCIBLE_HAVE_CUDA
  if (!cuda_device_exists(index))
    return fail(errc::device, "copy_bandwidth: ", device, ": no such CUDA device");
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    {
      auto options = torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, index);
      auto src = torch::ones({static_cast<std::int64_t>(bytes)}, options);
      auto dst = torch::zeros({static_cast<std::int64_t>(bytes)}, options);
      dst.copy_(src); // warm-up
      for (int i = 0; i < repeats; ++i) {
        at::cuda::CUDAEvent start{cudaEventDefault}, stop{cudaEventDefault};
        start.record();
        dst.copy_(src);
        stop.record();
        stop.synchronize();
        double s = static_cast<double>(start.elapsed_time(stop)) / 1e3;
        best = i == 0 ? s : std::min(best, s);
      }
    }
    // Hand the two buffers back to the driver rather than leave them cached for later callers.
    c10::cuda::CUDACachingAllocator::emptyCache();
  } catch (const c10::Error& e) {
    return fail(errc::device, "copy_bandwidth on ", device, ": ", e.what_without_backtrace());
  }
  return 2.0 * static_cast<double>(bytes) / best;
#else
  return fail(errc::unsupported, "copy_bandwidth: ", device, ": this build has no CUDA");
#endif
}

} // namespace crucible::bench
