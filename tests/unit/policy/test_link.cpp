// A program that reaches LibTorch only through libcrucible_policy.so, as the crucible CLI does.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "policy/runtime.hpp"

TEST_CASE("std::filesystem works in a program that links the policy library") {
  // The pip LibTorch exports its own std::filesystem; if the program searched it before
  // libstdc++ these calls would bind to it and crash (see policy/CMakeLists.txt).
  CHECK_FALSE(crucible::policy::probe_runtime().torch_version.empty());
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
