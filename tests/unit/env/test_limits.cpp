// env/eval/limits.hpp: a hardware's peaks as a reference worker reports them, and the bound they
// give a task's work (issue 89).
#include <doctest/doctest.h>

#include <cmath>

#include "core/json_parse.hpp"
#include "env/eval/limits.hpp"

using namespace crucible;
using namespace crucible::env;

namespace {

device_peaks h200_like() {
  // The rates measured on an H200 (docs/PERFORMANCE.md, "The clock's close at scale"), per ms.
  device_peaks p;
  p.hardware = "NVIDIA H200";
  p.write_bytes_per_ms = 3.32e9;
  p.copy_bytes_per_ms = 4.13e9;
  p.matmul_flops_per_ms = {{"float64", 62.4e9}, {"float32", 51.1e9}, {"tf32", 408.0e9}, {"float16", 727.2e9}, {"bfloat16", 780.1e9}};
  return p;
}

} // namespace

TEST_CASE("a task's bound is its bytes at the copy rate or its FLOPs at their dtype's rate, whichever is longer") {
  const auto p = h200_like();
  SUBCASE("an elementwise task is bound by its bytes") {
    // KernelBench level1/21_Sigmoid: 6.4 GB read, 6.4 GB written, no counted FLOPs.
    task_work w{{}, 6442450944.0, 6442450944.0};
    auto b = bound_of(w, p);
    REQUIRE(b.known());
    CHECK(b.flops_ms == 0);
    CHECK(b.bytes_ms == doctest::Approx(2 * 6442450944.0 / 4.13e9));
    CHECK(b.ms == b.bytes_ms);
  }
  SUBCASE("float32 FLOPs count at TF32's rate where the hardware has it, being faster") {
    // level1/1: 137.44 GFLOP float32 (a 4096 x 4096 product), 201 MB moved: 0.3369 ms on this H200.
    task_work w{{{"float32", 137438953472.0}}, 134217728.0, 67108864.0};
    auto b = bound_of(w, p);
    CHECK(b.flops_ms == doctest::Approx(137438953472.0 / 408.0e9));
    CHECK(b.ms == b.flops_ms);
    CHECK(b.ms == doctest::Approx(0.3369).epsilon(0.001));
    auto no_tf32 = p;
    no_tf32.matmul_flops_per_ms.erase("tf32");
    CHECK(bound_of(w, no_tf32).flops_ms == doctest::Approx(137438953472.0 / 51.1e9));
  }
  SUBCASE("each dtype at its own rate; one without a rate of its own at the fastest measured") {
    task_work w{{{"bfloat16", 780.1e9}, {"float64", 62.4e9}, {"int8", 780.1e9}}, 0, 0};
    CHECK(bound_of(w, p).flops_ms == doctest::Approx(1.0 + 1.0 + 1.0));
  }
  SUBCASE("not known without counted work or without peaks") {
    CHECK_FALSE(bound_of(task_work{}, p).known());
    CHECK_FALSE(bound_of(task_work{{}, 8, 8}, device_peaks{}).known());
  }
}

TEST_CASE("a worker's peaks are read with every rate above 0, and refused otherwise") {
  auto read = [](const char* text) { return peaks_from_json(*parse_json(text), "cpu: test"); };
  auto p = read(R"({"write_bytes_per_ms": 3e7, "copy_bytes_per_ms": 2.5e7, "matmul_flops_per_ms": {"float32": 2e8, "bfloat16": 4e8}})");
  REQUIRE(p.has_value());
  CHECK(p->hardware == "cpu: test");
  CHECK(p->copy_bytes_per_ms == 2.5e7);
  CHECK(p->matmul_flops_per_ms.at("bfloat16") == 4e8);
  CHECK(peaks_from_json(*parse_json(to_json(*p)), "cpu: test") == p);
  CHECK_FALSE(read(R"({"write_bytes_per_ms": 3e7, "copy_bytes_per_ms": 0, "matmul_flops_per_ms": {"float32": 2e8}})"));
  CHECK_FALSE(read(R"({"write_bytes_per_ms": 3e7, "copy_bytes_per_ms": 2e7, "matmul_flops_per_ms": {}})"));
  CHECK_FALSE(read(R"({"write_bytes_per_ms": 3e7, "copy_bytes_per_ms": 2e7, "matmul_flops_per_ms": {"float32": -1}})"));
  CHECK_FALSE(read(R"({"write_bytes_per_ms": 3e7, "copy_bytes_per_ms": 2e7, "matmul_flops_per_ms": {"": 1}})"));
  CHECK_FALSE(read(R"({"copy_bytes_per_ms": 2e7, "matmul_flops_per_ms": {"float32": 1}})"));
  CHECK_FALSE(read(R"([1, 2])"));
  // The size the copy rate was measured at: optional, and a number above 0 where given.
  CHECK(p->copy_bytes == 0);
  auto sized = read(R"({"write_bytes_per_ms": 3e7, "copy_bytes_per_ms": 2e7, "copy_bytes": 67108864, "matmul_flops_per_ms": {"float32": 1}})");
  REQUIRE(sized.has_value());
  CHECK(sized->copy_bytes == 67108864.0);
  CHECK(peaks_from_json(*parse_json(to_json(*sized)), "cpu: test") == sized);
  CHECK_FALSE(read(R"({"write_bytes_per_ms": 3e7, "copy_bytes_per_ms": 2e7, "copy_bytes": 0, "matmul_flops_per_ms": {"float32": 1}})"));
  CHECK_FALSE(read(R"({"write_bytes_per_ms": 3e7, "copy_bytes_per_ms": 2e7, "copy_bytes": "1 GiB", "matmul_flops_per_ms": {"float32": 1}})"));
}

TEST_CASE("the bound's floor: half its bytes part, only for calls that move at least what the copy rate was measured at") {
  auto p = h200_like();
  // KernelBench level1/21_Sigmoid: 12.9 GB a call, at 4.13 TB/s 3.12 ms, so a floor of 1.56 ms.
  const task_work sigmoid{{}, 6442450944.0, 6442450944.0};
  CHECK(std::isnan(bound_floor_ms(sigmoid, p))); // the size the rate was measured at not said
  p.copy_bytes = 1 << 30;
  CHECK(bound_floor_ms(sigmoid, p) == doctest::Approx(0.5 * 2 * 6442450944.0 / 4.13e9));
  // 201 MB: below the 1 GiB the copy rate was measured at, it may come from caches: no floor.
  const task_work small{{{"float32", 137438953472.0}}, 134217728.0, 67108864.0};
  CHECK(std::isnan(bound_floor_ms(small, p)));
  CHECK(std::isnan(bound_floor_ms(task_work{}, p))); // not counted
}

TEST_CASE("the process keeps one hardware's peaks by its name") {
  peaks_registry r;
  CHECK_FALSE(r.find("NVIDIA H200").has_value());
  r.keep(h200_like());
  REQUIRE(r.find("NVIDIA H200").has_value());
  CHECK(r.find("NVIDIA H200")->copy_bytes_per_ms == 4.13e9);
  CHECK_FALSE(r.find("NVIDIA H100 80GB HBM3").has_value());
}

TEST_CASE("a reference's own call faster than the measured copy rate raises it, within a tenth, never from caches") {
  auto p = h200_like();
  p.copy_bytes = 1 << 30;
  // KernelBench level1/31_ELU on an H200: 12.9 GB a call in 3.0497 ms (4.22 TB/s) against a copy
  // rate of 4.14 TB/s measured in a verdict: its reference came out at 1.02 of its bound.
  p.copy_bytes_per_ms = 4.14e9;
  const task_work elu{{}, 6442450944.0, 6442450944.0};
  CHECK(3.0497 < bound_of(elu, p).ms);
  CHECK(raise_copy_rate(p, elu, 3.0497));
  CHECK(p.copy_bytes_per_ms == doctest::Approx(2 * 6442450944.0 / 3.0497));
  CHECK(p.copy_measured == 4.14e9);
  CHECK(bound_of(elu, p).ms == doctest::Approx(3.0497)); // its reference at 1.0 of the bound
  CHECK_FALSE(raise_copy_rate(p, elu, 3.1)); // slower: nothing to learn
  // A reference more than a tenth ahead of the measured rate reads fewer bytes than counted.
  CHECK_FALSE(raise_copy_rate(p, elu, 2 * 6442450944.0 / (1.2 * 4.14e9)));
  CHECK(p.copy_bytes_per_ms == doctest::Approx(2 * 6442450944.0 / 3.0497));
  // Fewer bytes than the rate was measured at may come from caches; no time or no count says nothing.
  const task_work small{{}, 67108864.0, 67108864.0};
  CHECK_FALSE(raise_copy_rate(p, small, 0.001));
  CHECK_FALSE(raise_copy_rate(p, elu, NAN));
  CHECK_FALSE(raise_copy_rate(p, task_work{}, 1.0));
  auto unsized = h200_like(); // copy_bytes not said: no call is known to be beyond the caches
  CHECK_FALSE(raise_copy_rate(unsized, elu, 1.0));
}

TEST_CASE("the process's peaks are raised by a reference's call on their own hardware only") {
  peaks_registry r;
  const task_work elu{{}, 6442450944.0, 6442450944.0};
  CHECK(std::isnan(r.observe("NVIDIA H200", elu, 3.0))); // no peaks yet
  auto p = h200_like();
  p.copy_bytes = 1 << 30;
  r.keep(p);
  CHECK(std::isnan(r.observe("NVIDIA H100 80GB HBM3", elu, 3.0)));
  CHECK(r.observe("NVIDIA H200", elu, 3.0) == doctest::Approx(2 * 6442450944.0 / 3.0));
  CHECK(r.find("NVIDIA H200")->copy_bytes_per_ms == doctest::Approx(2 * 6442450944.0 / 3.0));
  CHECK(to_json(*r.find("NVIDIA H200")).find("copy_measured_bytes_per_ms") != std::string::npos);
}
