// tests/gpu/uploaded.hpp: device memory of the test's own process holding a copy of host bytes,
// as a device_bytes (the comparison's input), for test_gpu_evaluator's cases.
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "env/eval/device/device_bytes.hpp"

namespace crucible::testing {

/// Device memory of this process holding a copy of host bytes. Owns the allocation.
class uploaded final : public env::device_bytes {
public:
  explicit uploaded(const std::vector<std::byte>& host) : size_{host.size()} {
    REQUIRE(cudaMalloc(&data_, size_) == cudaSuccess);
    REQUIRE(cudaMemcpy(data_, host.data(), size_, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~uploaded() override { cudaFree(data_); }
  uploaded(const uploaded&) = delete;
  uploaded& operator=(const uploaded&) = delete;
  const void* data() const noexcept override { return data_; }
  std::uint64_t size() const noexcept override { return size_; }
  int device() const noexcept override { return 0; }

private:
  void* data_ = nullptr;
  std::uint64_t size_;
};

} // namespace crucible::testing
