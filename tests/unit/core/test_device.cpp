#include <doctest/doctest.h>

#include "core/device.hpp"

using namespace crucible;

TEST_CASE("a device string is read in one place: cpu, cuda, cuda:N, and nothing else") {
  auto cpu = parse_device("cpu");
  REQUIRE(cpu);
  CHECK_FALSE(cpu->cuda());
  CHECK(cpu->name() == "cpu");
  auto bare = parse_device("cuda");
  REQUIRE(bare);
  CHECK(bare->cuda());
  CHECK(bare->index == 0);
  CHECK(bare->name() == "cuda:0");
  auto third = parse_device("cuda:3");
  REQUIRE(third);
  CHECK(third->index == 3);
  CHECK(parse_device("cuda:0007")->name() == "cuda:7");
  CHECK(parse_device("cuda:9999")->index == 9999);
  for (const char* bad : {"", "gpu", "CPU", "cuda:", "cuda:-1", "cuda:1x", "cuda:12345", "cuda: 1", "cuda1", "3", "cpu:0"})
    CHECK_MESSAGE(!parse_device(bad), bad);
  CHECK(cuda_index("cuda:2") == 2);
  CHECK(cuda_index("cuda") == 0);
  CHECK(cuda_index("cpu") == -1);
  CHECK(cuda_index("cuda:x") == -1);
}

TEST_CASE("the hardware kind is derived in one place: a run's own GPU and a joined node's of the same model share it") {
  CHECK(hardware_kind_of("cpu", "x86_64 (2 cores)") == "cpu");
  CHECK(hardware_kind_of("cuda:0", "NVIDIA H100 80GB HBM3") == "h100");
  CHECK(hardware_kind_of("cuda:3", "NVIDIA H100 80GB HBM3") == "h100");
  CHECK(hardware_kind_of("cuda:0", "NVIDIA H200") == "h200");
  CHECK(hardware_kind_of("cuda:1", "AMD Instinct MI300X") == "instinct");
  CHECK(hardware_kind_of("cuda:0", "") == "gpu");
}
