#include <doctest/doctest.h>

#include <string>

#include "core/error.hpp"

using namespace crucible;

TEST_CASE("a check's site names the file's place in the checkout and the line") {
  CHECK(source_site("/work/main/env/eval/device/device_bytes.cu", 415) == "env/eval/device/device_bytes.cu:415");
  CHECK(source_site("../env/eval/boundary.cpp", 12) == "env/eval/boundary.cpp:12");
  CHECK(source_site("/home/u/x/deps/a.cpp", 2) == "deps/a.cpp:2");
  CHECK(source_site("../policy/collective_nccl.cpp", 7) == "policy/collective_nccl.cpp:7");
  CHECK(source_site("env/eval/boundary.cpp", 1) == "env/eval/boundary.cpp:1");
  CHECK(source_site("main.cpp", 3) == "main.cpp:3");
  CHECK(source_site("/main.cpp", 3) == "/main.cpp:3");
  CHECK(source_site(nullptr, 9) == "?:9");
  // The macro gives this file and this line.
  const auto here = CRUCIBLE_SITE();
  CHECK(here == "tests/unit/core/test_error.cpp:" + std::to_string(__LINE__ - 1));
}
