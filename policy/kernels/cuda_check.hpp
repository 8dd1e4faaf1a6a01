// policy/kernels/cuda_check.hpp: check macros for CUDA runtime and NCCL calls, recording file and
// line.
#pragma once

#include <stdexcept>
#include <string>

/// Throws std::runtime_error("file:line: call: cudaErrorName (message)") when a CUDA runtime
/// call fails. For code paths where failure is an infrastructure error, not a verdict.
#define CRUCIBLE_CUDA_CHECK(call)                                                              \
  do {                                                                                         \
    cudaError_t crucible_cuda_status_ = (call);                                                \
    if (crucible_cuda_status_ != cudaSuccess)                                                  \
      throw std::runtime_error(std::string{__FILE__} + ":" + std::to_string(__LINE__) + ": "   \
                               + #call + ": " + cudaGetErrorName(crucible_cuda_status_) + " (" \
                               + cudaGetErrorString(crucible_cuda_status_) + ")");             \
  } while (false)

/// The same for NCCL calls.
#define CRUCIBLE_NCCL_CHECK(call)                                                              \
  do {                                                                                         \
    ncclResult_t crucible_nccl_status_ = (call);                                               \
    if (crucible_nccl_status_ != ncclSuccess)                                                  \
      throw std::runtime_error(std::string{__FILE__} + ":" + std::to_string(__LINE__) + ": "   \
                               + #call + ": " + ncclGetErrorString(crucible_nccl_status_)      \
                               + " (" + ncclGetLastError(nullptr) + ")");                      \
  } while (false)
