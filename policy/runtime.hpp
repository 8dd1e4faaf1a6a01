// policy/runtime.hpp: what LibTorch and the CUDA driver offer this process (devices, versions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crucible::policy {

/// One CUDA device as the runtime reports it.
struct cuda_device {
  int index = 0;
  std::string name;              ///< e.g. "NVIDIA H100 80GB HBM3"
  std::uint64_t memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
};

/// The tensor runtime of this process. Plain value.
struct runtime_info {
  std::string torch_version;     ///< LibTorch's version string, e.g. "2.11.0"
  bool cuda_built = false;       ///< this binary was built with CRUCIBLE_CUDA
  std::string cuda_runtime;      ///< CUDA runtime version, e.g. "13.0" ("" without CUDA)
  std::vector<cuda_device> devices;
  int cpu_threads = 0;           ///< LibTorch's intra-op thread count
};

/// Probes LibTorch and, in a CUDA build, the CUDA runtime. Never throws; a CUDA build on a
/// machine without a driver or device reports no devices. Thread-safe.
runtime_info probe_runtime();

} // namespace crucible::policy
