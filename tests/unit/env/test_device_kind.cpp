// env/eval/device_kind: the one table of what differs between the kinds of device, and that the
// worker it starts accepts each kind's name as its --device.
#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "env/eval/device_gate.hpp"
#include "env/eval/device_kind.hpp"

using namespace crucible::env;

#ifndef CRUCIBLE_SOURCE_DIR
#error "CRUCIBLE_SOURCE_DIR must be defined"
#endif

TEST_CASE("kind_of: a CUDA device's row for cuda and cuda:N, the CPU's for cpu") {
  CHECK(std::string{kind_of("cpu").name} == "cpu");
  CHECK(std::string{kind_of("cuda").name} == "cuda");
  CHECK(std::string{kind_of("cuda:0").name} == "cuda");
  CHECK(std::string{kind_of("cuda:7").name} == "cuda");
  CHECK(&kind_of("cuda:0") == &kind_of("cuda:7"));
  // What the CPU's verdicts rely on.
  const auto& cpu = kind_of("cpu");
  CHECK_FALSE(cpu.samples_on_device);
  CHECK_FALSE(cpu.outputs_on_device);
  CHECK_FALSE(cpu.process_wide_gate);
  CHECK(cpu.address_space_limit);
  const auto& cuda = kind_of("cuda:0");
  CHECK(cuda.samples_on_device);
  CHECK(cuda.outputs_on_device);
  CHECK(cuda.process_wide_gate);
  CHECK_FALSE(cuda.address_space_limit);
}

TEST_CASE("flush_bytes_of: evaluator.flush_bytes where set, else the kind's own") {
  CHECK(flush_bytes_of(0, kind_of("cpu")) == kind_of("cpu").flush_bytes);
  CHECK(flush_bytes_of(0, kind_of("cuda:1")) == kind_of("cuda:1").flush_bytes);
  CHECK(flush_bytes_of(12345, kind_of("cuda:1")) == 12345);
  CHECK(kind_of("cpu").flush_bytes > 0);
  CHECK(kind_of("cuda").flush_bytes > kind_of("cpu").flush_bytes);
}

TEST_CASE("a kind with a process-wide gate gets one gate per device, the CPU's evaluators one each") {
  auto a = shared_gate("cpu", false, false, false);
  auto b = shared_gate("cpu", false, false, false);
  CHECK(a != b);
  CHECK(gate_for_host_work("cpu") == nullptr);
  auto c = shared_gate("cuda:5", false, false, false);
  auto d = shared_gate("cuda:5", false, false, false);
  CHECK(c == d);
  CHECK(gate_for_host_work("cuda:5") == c);
}

TEST_CASE("the worker accepts every kind's name as its --device: the harness's table has a row of each name") {
  auto read = [](const char* file) {
    std::ifstream in(std::string{CRUCIBLE_SOURCE_DIR} + "/env/eval/harness/" + file);
    REQUIRE(in);
    return std::string{std::istreambuf_iterator<char>(in), {}};
  };
  // worker.py takes its --device choices from device.py's table (KINDS), one row a kind.
  CHECK(read("worker.py").find(R"(add_argument("--device", choices=tuple(KINDS))") != std::string::npos);
  const std::string table = read("device.py");
  for (const char* device : {"cpu", "cuda:0"})
    CHECK_MESSAGE(table.find(std::string{"DeviceKind(name=\""} + kind_of(device).name + "\"") != std::string::npos,
                  "env/eval/harness/device.py has no DeviceKind row named " << kind_of(device).name);
}
