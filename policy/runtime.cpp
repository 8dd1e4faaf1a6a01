#include "policy/runtime.hpp"
#include "policy/model/model.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include <torch/torch.h>
#include <torch/version.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#ifdef CRUCIBLE_HAVE_CUDA
#  include <ATen/cuda/CUDAContext.h>
#  include <c10/cuda/CUDACachingAllocator.h>
#  include <cuda_runtime_api.h>

#  include "policy/kernels/kernels.hpp"
#endif

namespace crucible::policy {

runtime_info probe_runtime() {
  runtime_info info;
  info.torch_version = TORCH_VERSION;
  info.cpu_threads = at::get_num_threads();
#ifdef CRUCIBLE_HAVE_CUDA
  info.cuda_built = true;
  int version = 0;
  if (cudaRuntimeGetVersion(&version) == cudaSuccess)
    info.cuda_runtime = std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
  int count = 0;
  // No driver or no device is an ordinary answer here, not an error: report no devices.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void) cudaGetLastError();
    count = 0;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess)
      continue;
    info.devices.push_back(cuda_device{i, prop.name, static_cast<std::uint64_t>(prop.totalGlobalMem),
                                       prop.major, prop.minor});
  }
#endif
  return info;
}


bool cuda_device_exists(int index) {
#ifdef CRUCIBLE_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void) cudaGetLastError();
    return false;
  }
  return index >= 0 && index < count;
#else
  (void) index;
  return false;
#endif
}

std::optional<device_memory> memory_stats(std::string_view device) {
#ifdef CRUCIBLE_HAVE_CUDA
  const int index = cuda_index(device);
  if (!cuda_device_exists(index))
    return std::nullopt;
  using c10::CachingDeviceAllocator::StatType;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  const auto& allocated = stats.allocated_bytes[static_cast<std::size_t>(StatType::AGGREGATE)];
  const auto& reserved = stats.reserved_bytes[static_cast<std::size_t>(StatType::AGGREGATE)];
  return device_memory{static_cast<std::uint64_t>(allocated.current), static_cast<std::uint64_t>(allocated.peak),
                       static_cast<std::uint64_t>(reserved.current), static_cast<std::uint64_t>(reserved.peak)};
#else
  (void) device;
  return std::nullopt;
#endif
}

void reset_peak_memory(std::string_view device) {
#ifdef CRUCIBLE_HAVE_CUDA
  const int index = cuda_index(device);
  if (cuda_device_exists(index))
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
#else
  (void) device;
#endif
}

result<std::vector<profile_row>> profile(const std::function<void()>& fn, bool cuda,
                                         const std::filesystem::path& trace) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda)
    activities.insert(ActivityType::CUDA);
  std::unique_ptr<prof::ProfilerResult> out;
  try {
    prof::prepareProfiler(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO), activities);
    prof::enableProfiler(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO), activities);
    try {
      fn();
    } catch (...) {
      prof::disableProfiler();
      throw;
    }
    out = prof::disableProfiler();
    if (!trace.empty())
      out->save(trace.string());
  } catch (const c10::Error& e) {
    return fail(errc::unsupported, "profile: ", e.what_without_backtrace());
  }
  std::map<std::pair<std::string, std::string>, profile_row> rows;
  for (const auto& e : out->events()) {
    const bool on_cuda = e.deviceType() == c10::DeviceType::CUDA;
    auto& r = rows[{e.name(), on_cuda ? "cuda" : "cpu"}];
    r.name = e.name();
    r.device = on_cuda ? "cuda" : "cpu";
    r.total_ms += static_cast<double>(e.durationNs()) / 1e6;
    ++r.count;
  }
  std::vector<profile_row> sorted;
  for (auto& [key, row] : rows)
    sorted.push_back(std::move(row));
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.total_ms > b.total_ms; });
  return sorted;
}

namespace {

// The lower median (0 for none): the timelines' summaries.
[[maybe_unused]] double median_of(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0.0 : x[(x.size() - 1) / 2];
}

} // namespace

result<std::vector<layer_kernel_time>> time_decode_kernels([[maybe_unused]] CausalLMImpl& model,
                                                           [[maybe_unused]] const std::function<void()>& fn,
                                                           [[maybe_unused]] std::int64_t layers) {
#ifdef CRUCIBLE_HAVE_CUDA
  constexpr int kinds = 5; // q/k/v, attention, o, gate/up, down
  constexpr std::int64_t max_blocks = 4096;
  if (layers < 2 || !torch::cuda::is_available())
    return fail(errc::unsupported, "time_decode_kernels: no CUDA device, or fewer than 2 layers");
  const std::int64_t launches = layers * kinds;
  constexpr int entries = kernels::decode_timeline_entries;
  auto buffer = torch::zeros({launches * max_blocks * entries},
                             torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA, at::cuda::current_device()));
  kernels::decode_timeline timeline(reinterpret_cast<unsigned long long*>(buffer.data_ptr<std::int64_t>()), launches,
                                    max_blocks);
  // The model's own variants with the timeline, and those again afterwards, also when fn throws.
  struct restore {
    CausalLMImpl& m;
    kernels::decode_options before;
    ~restore() { m.set_decode_options(before); }
  } restored{model, model.decode_options()};
  auto timed = model.decode_options();
  timed.timeline = &timeline;
  model.set_decode_options(timed);
  fn();
  torch::cuda::synchronize();
  auto t = buffer.cpu();
  const auto* v = t.data_ptr<std::int64_t>();
  auto at = [&](std::int64_t launch, std::int64_t b, int what) { return v[(launch * max_blocks + b) * entries + what]; };
  auto blocks_of = [&](std::int64_t launch) {
    std::int64_t n = 0;
    while (n < max_blocks && at(launch, n, 3) != 0)
      ++n;
    return n;
  };
  auto last_end = [&](std::int64_t launch) {
    std::int64_t m = 0;
    for (std::int64_t b = 0, n = blocks_of(launch); b < n; ++b)
      m = std::max(m, at(launch, b, 3));
    return m;
  };
  for (std::int64_t launch = 0; launch < launches; ++launch)
    if (blocks_of(launch) == 0)
      return fail(errc::unsupported, "time_decode_kernels: kernel " + std::to_string(launch % kinds) + " of layer "
                                       + std::to_string(launch / kinds) + " recorded nothing (not five one-row kernels a layer?)");
  static const char* const names[kinds] = {"qkv", "attention", "o", "gate_up", "down"};
  std::vector<layer_kernel_time> out;
  for (int k = 0; k < kinds; ++k) {
    std::vector<double> first_start, last_start, first_wait, last_wait, end, after, slowest, late, to_mid, from_mid;
    std::int64_t blocks = 0;
    for (std::int64_t l = 1; l < layers; ++l) {
      const std::int64_t launch = l * kinds + k, before = last_end(launch - 1);
      blocks = blocks_of(launch);
      std::int64_t s0 = INT64_MAX, s1 = INT64_MIN, w0 = INT64_MAX, w1 = INT64_MIN, e1 = INT64_MIN, n_late = 0;
      std::vector<double> block_after, block_to_mid, block_from_mid;
      for (std::int64_t b = 0; b < blocks; ++b) {
        const auto began = at(launch, b, 0), waited = at(launch, b, 1), mid = at(launch, b, 2), ended = at(launch, b, 3);
        s0 = std::min(s0, began);
        s1 = std::max(s1, began);
        w0 = std::min(w0, waited);
        w1 = std::max(w1, waited);
        e1 = std::max(e1, ended);
        n_late += began > before ? 1 : 0;
        block_after.push_back(static_cast<double>(ended - waited) / 1e3);
        if (mid != 0) { // blocks with no work return before it
          block_to_mid.push_back(static_cast<double>(mid - waited) / 1e3);
          block_from_mid.push_back(static_cast<double>(ended - mid) / 1e3);
        }
      }
      to_mid.push_back(median_of(std::move(block_to_mid)));
      from_mid.push_back(median_of(std::move(block_from_mid)));
      auto us = [&](std::int64_t ns) { return static_cast<double>(ns - before) / 1e3; };
      first_start.push_back(us(s0));
      last_start.push_back(us(s1));
      first_wait.push_back(us(w0));
      last_wait.push_back(us(w1));
      end.push_back(us(e1));
      slowest.push_back(*std::max_element(block_after.begin(), block_after.end()));
      after.push_back(median_of(std::move(block_after)));
      late.push_back(static_cast<double>(n_late));
    }
    layer_kernel_time r;
    r.kernel = names[k];
    r.blocks = blocks;
    r.first_start_us = median_of(first_start);
    r.last_start_us = median_of(last_start);
    r.first_wait_us = median_of(first_wait);
    r.last_wait_us = median_of(last_wait);
    r.end_us = median_of(end);
    r.after_wait_us = median_of(after);
    r.slowest_after_wait_us = median_of(slowest);
    r.to_midpoint_us = median_of(to_mid);
    r.from_midpoint_us = median_of(from_mid);
    r.late_blocks = static_cast<std::int64_t>(median_of(late));
    out.push_back(std::move(r));
  }
  return out;
#else
  return fail(errc::unsupported, "time_decode_kernels: built without CUDA");
#endif
}

device_scope::device_scope(std::string_view device) {
  // A bare "cuda" names no device of its own here: LibTorch's current device stays as it is.
  const auto id = parse_device(device);
  if (device != "cuda" && id && id->cuda())
    guard_ = std::make_shared<c10::OptionalDeviceGuard>(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(id->index)));
}

device_scope::~device_scope() = default;

} // namespace crucible::policy
