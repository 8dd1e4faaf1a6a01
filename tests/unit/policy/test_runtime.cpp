#include <doctest/doctest.h>

#include <torch/torch.h>

#include "policy/runtime.hpp"

TEST_CASE("probe_runtime reports the LibTorch that this binary links") {
  auto info = crucible::policy::probe_runtime();
  CHECK(info.torch_version == std::string{TORCH_VERSION});
  CHECK(info.torch_version.rfind("2.11", 0) == 0);
  CHECK(info.cpu_threads >= 1);
  for (const auto& dev : info.devices) {
    CHECK_FALSE(dev.name.empty());
    CHECK(dev.memory_bytes > 0);
  }
}

TEST_CASE("LibTorch computes on the CPU in float32") {
  auto a = torch::arange(6, torch::kFloat32).reshape({2, 3});
  auto b = torch::ones({3, 2});
  auto c = torch::matmul(a, b);
  CHECK(c.dtype() == torch::kFloat32);
  CHECK(c[0][0].item<float>() == doctest::Approx(3.0f));
  CHECK(c[1][1].item<float>() == doctest::Approx(12.0f));
}

