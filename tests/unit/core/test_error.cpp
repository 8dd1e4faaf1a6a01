#include <doctest/doctest.h>

#include <string>

#include "core/error.hpp"

using namespace crucible;

TEST_CASE("a check's site names the file's folder, the file and the line") {
  CHECK(source_site("/work/main/env/device_bytes.cu", 415) == "env/device_bytes.cu:415");
  CHECK(source_site("../policy/collective_nccl.cpp", 7) == "policy/collective_nccl.cpp:7");
  CHECK(source_site("env/boundary.cpp", 1) == "env/boundary.cpp:1");
  CHECK(source_site("main.cpp", 3) == "main.cpp:3");
  CHECK(source_site("/main.cpp", 3) == "/main.cpp:3");
  CHECK(source_site(nullptr, 9) == "?:9");
  // The macro gives this file and this line.
  const auto here = CRUCIBLE_SITE();
  CHECK(here == "core/test_error.cpp:" + std::to_string(__LINE__ - 1));
}
