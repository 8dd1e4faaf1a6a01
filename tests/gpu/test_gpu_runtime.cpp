// The CUDA build end to end: devices seen by the probe, LibTorch on CUDA, NCCL all-reduce.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <vector>

#include "policy/kernels/cuda_check.hpp"
#include "policy/runtime.hpp"

TEST_CASE("the runtime probe lists every CUDA device with its name and memory") {
  auto info = crucible::policy::probe_runtime();
  int count = 0;
  CRUCIBLE_CUDA_CHECK(cudaGetDeviceCount(&count));
  REQUIRE(info.cuda_built);
  REQUIRE(static_cast<int>(info.devices.size()) == count);
  for (const auto& d : info.devices) {
    CHECK_FALSE(d.name.empty());
    CHECK(d.memory_bytes > (1ull << 30));
    CHECK(d.compute_major >= 7);
  }
}

TEST_CASE("LibTorch matmul on CUDA matches the CPU") {
  REQUIRE(torch::cuda::is_available());
  torch::manual_seed(7);
  auto a = torch::randn({256, 128});
  auto b = torch::randn({128, 64});
  auto expect = torch::matmul(a, b);
  auto got = torch::matmul(a.cuda(), b.cuda()).cpu();
  CHECK(torch::allclose(got, expect, 1e-3, 1e-3));
}

TEST_CASE("NCCL all-reduce over every local device sums the ranks' buffers") {
  int n = 0;
  CRUCIBLE_CUDA_CHECK(cudaGetDeviceCount(&n));
  std::vector<ncclComm_t> comms(n);
  std::vector<int> devs(n);
  for (int i = 0; i < n; ++i)
    devs[i] = i;
  CRUCIBLE_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devs.data()));
  const size_t count = 1 << 20;
  std::vector<float*> bufs(n);
  std::vector<cudaStream_t> streams(n);
  for (int i = 0; i < n; ++i) {
    CRUCIBLE_CUDA_CHECK(cudaSetDevice(i));
    CRUCIBLE_CUDA_CHECK(cudaMalloc(&bufs[i], count * sizeof(float)));
    CRUCIBLE_CUDA_CHECK(cudaStreamCreate(&streams[i]));
    std::vector<float> host(count, static_cast<float>(i + 1));
    CRUCIBLE_CUDA_CHECK(cudaMemcpy(bufs[i], host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  }
  CRUCIBLE_NCCL_CHECK(ncclGroupStart());
  for (int i = 0; i < n; ++i)
    CRUCIBLE_NCCL_CHECK(ncclAllReduce(bufs[i], bufs[i], count, ncclFloat, ncclSum, comms[i], streams[i]));
  CRUCIBLE_NCCL_CHECK(ncclGroupEnd());
  const float expect = static_cast<float>(n * (n + 1) / 2);
  for (int i = 0; i < n; ++i) {
    CRUCIBLE_CUDA_CHECK(cudaSetDevice(i));
    CRUCIBLE_CUDA_CHECK(cudaStreamSynchronize(streams[i]));
    std::vector<float> host(count);
    CRUCIBLE_CUDA_CHECK(cudaMemcpy(host.data(), bufs[i], count * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(host.front() == expect);
    CHECK(host.back() == expect);
    CRUCIBLE_CUDA_CHECK(cudaFree(bufs[i]));
    CRUCIBLE_CUDA_CHECK(cudaStreamDestroy(streams[i]));
    CRUCIBLE_NCCL_CHECK(ncclCommDestroy(comms[i]));
  }
}
