// env/eval/device/device_bytes_cuda.cuh (internal to device_bytes.cu and device_clock.cu): what
// both share: a failed CUDA call in words (cuda_text), selecting a device, and memory of this
// process's own (owned).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "env/eval/device/device_bytes.hpp"

namespace crucible::env::detail {

// A failed CUDA call in a message: its name, words and where it was checked
// ("cudaErrorInvalidValue (invalid argument) at env/eval/device/device_bytes.cu:415"); cuda_text(e) below.
inline std::string cuda_text_at(cudaError_t e, const std::string& site) {
  return std::string{cudaGetErrorName(e)} + " (" + cudaGetErrorString(e) + ") at " + site;
}
#define cuda_text(e) cuda_text_at((e), CRUCIBLE_SITE())

inline result<void> select(int device) {
  if (auto e = cudaSetDevice(device); e != cudaSuccess)
    return fail(errc::device, "cannot use CUDA device ", std::to_string(device), ": ", cuda_text(e));
  return {};
}

// Memory of this process's: from the stream-ordered pool (cudaMallocAsync), or `unpooled` from
// cudaMalloc; freed when the last reference goes.
class owned final : public device_bytes {
public:
  owned(int device, void* data, std::uint64_t size, bool unpooled = false)
      : device_{device}, data_{data}, size_{size}, unpooled_{unpooled} {}
  ~owned() override {
    if (data_ == nullptr)
      return;
    const std::lock_guard work{device_work_mutex(device_)};
    if (cudaSetDevice(device_) != cudaSuccess)
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

} // namespace crucible::env::detail
