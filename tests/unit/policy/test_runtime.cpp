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

#include <filesystem>
#include <fstream>

#include <unistd.h>

TEST_CASE("std::filesystem works in a program that links LibTorch") {
  // The pip LibTorch exports its own std::filesystem; if it came first in the program's
  // dependencies these calls would bind to it and crash (see policy/CMakeLists.txt).
  namespace fs = std::filesystem;
  auto root = fs::temp_directory_path() / ("crucible-fs-" + std::to_string(::getpid()));
  fs::create_directories(root / "a" / "b");
  std::ofstream(root / "a" / "b" / "f.txt") << "x";
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(root))
    files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);
  CHECK(fs::remove_all(root) == 4);
}
