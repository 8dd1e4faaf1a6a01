// Runs the doctest cases of a GPU test binary, or exits 77 (ctest's "skipped") without a device.
// Listing test cases (ctest discovery at build time) works everywhere.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0 || std::strncmp(argv[i], "-ltc", 4) == 0)
      listing = true;
  if (!listing) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      std::fprintf(stderr, "no CUDA device: skipping GPU test\n");
      return 77;
    }
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
