// The build service's choice of the C++ flags it precompiles torch/extension.h for (the header is
// made outside the sandbox, so no flag may name a file, a program or a plugin).
#include <doctest/doctest.h>

#include "env/build_service.hpp"

using crucible::env::precompilable_flag;

TEST_CASE("precompiled headers: plain optimisation and language flags only") {
  for (const char* f : {"-O0", "-O1", "-O2", "-O3", "-Os", "-Ofast", "-march=native", "-mtune=native", "-ffast-math",
                        "-funroll-loops", "-fopenmp", "-DNDEBUG", "-std=c++17", "-std=c++20", "-w", "-Wall",
                        "-Wno-unused-variable", "-g0"})
    CHECK_MESSAGE(precompilable_flag(f), f);
  for (const char* f : {"", "-fplugin=/tmp/x.so", "-wrapper", "-B/tmp", "-specs=/tmp/s", "-include", "/etc/passwd",
                        "-I/tmp", "-isystem", "-o", "-DX=1", "-D", "-O3 -fplugin=x.so", "-march=skylake;x", "-O4",
                        "-Wl,-rpath,/tmp", "@/tmp/flags", "-fdump-tree-all", "-save-temps", "-std=c++17 ",
                        "-Wno-error=x/../y"})
    CHECK_MESSAGE(!precompilable_flag(f), f);
}
