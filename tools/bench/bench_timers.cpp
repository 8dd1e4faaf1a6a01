// tools/bench/bench_timers.cpp: the copy-bandwidth and persistent-kernel timers of
// bench_timers.hpp, as they were in policy/runtime.cpp: torch tensors and CUDA events over the
// kernels' own timeline switches (policy/kernels/decode_layers.hpp).
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

#  include "policy/kernels/decode_layers.hpp"
#endif

namespace crucible::bench {

namespace {

#ifdef CRUCIBLE_HAVE_CUDA
namespace kernels = policy::kernels;
using policy::cuda_device_exists;
#endif

// The lower median (0 for none): the timelines' summaries.
[[maybe_unused]] double median_of(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0.0 : x[(x.size() - 1) / 2];
}

} // namespace

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

result<std::vector<layer_stage_time>> time_decode_layers([[maybe_unused]] const std::function<void()>& fn,
                                                        [[maybe_unused]] std::int64_t layers) {
#ifdef CRUCIBLE_HAVE_CUDA
  const std::int64_t blocks = kernels::decode_layers_blocks();
  if (blocks <= 0 || layers < 2)
    return fail(errc::unsupported, "time_decode_layers: no CUDA device, or fewer than 2 layers");
  auto buffer = torch::zeros({kernels::decode_layers_timeline_entries(layers)},
                             torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA, at::cuda::current_device()));
  kernels::set_decode_layers_timeline(reinterpret_cast<unsigned long long*>(buffer.data_ptr<std::int64_t>()));
  try {
    fn();
    torch::cuda::synchronize();
  } catch (...) {
    kernels::set_decode_layers_timeline(nullptr);
    throw;
  }
  kernels::set_decode_layers_timeline(nullptr);
  auto t = buffer.cpu();
  const auto* v = t.data_ptr<std::int64_t>();
  constexpr int stages = kernels::decode_layers_stages;
  auto at = [&](std::int64_t l, int s, std::int64_t b, int end) { return v[((l * stages + s) * blocks + b) * 2 + end]; };
  if (at(layers - 1, stages - 1, 0, 1) == 0)
    return fail(errc::unsupported, "time_decode_layers: no launch of the persistent kernel was recorded");
  auto last_end = [&](std::int64_t l, int s) {
    std::int64_t m = 0;
    for (std::int64_t b = 0; b < blocks; ++b)
      m = std::max(m, at(l, s, b, 1));
    return m;
  };
  static const char* const names[stages] = {"qkv", "attention", "o", "gate_up", "down"};
  std::vector<layer_stage_time> out;
  for (int s = 0; s < stages; ++s) {
    std::vector<double> span, first, slowest;
    for (std::int64_t l = 1; l < layers; ++l) {
      const std::int64_t before = s == 0 ? last_end(l - 1, stages - 1) : last_end(l, s - 1);
      std::int64_t start = INT64_MAX, longest = 0;
      for (std::int64_t b = 0; b < blocks; ++b) {
        const auto b0 = at(l, s, b, 0), b1 = at(l, s, b, 1);
        if (s != 1 || b0 >= before) // attention: the blocks that waited for the q/k/v stage
          start = std::min(start, b0);
        longest = std::max(longest, b1 - b0);
      }
      span.push_back(static_cast<double>(last_end(l, s) - before) / 1e3);
      first.push_back(static_cast<double>(start - before) / 1e3);
      slowest.push_back(static_cast<double>(longest) / 1e3);
    }
    out.push_back({names[s], median_of(span), median_of(first), median_of(slowest)});
  }
  return out;
#else
  return fail(errc::unsupported, "time_decode_layers: built without CUDA");
#endif
}

} // namespace crucible::bench
