#include "policy/runtime.hpp"

#include <torch/version.h>

#include <ATen/Parallel.h>

#ifdef CRUCIBLE_HAVE_CUDA
#  include <cuda_runtime_api.h>
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

} // namespace crucible::policy
