// Runs the doctest cases of a GPU test binary, or exits 77 (ctest's "skipped") without a device.
// Listing test cases (ctest discovery at build time) works everywhere.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace {

// GPU tests run on lent machines without a debugger: a crash prints its stack (doctest reports
// the crash first, then restores this handler and raises the signal again).
void print_stack(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char head[] = "\n*** fatal signal; stack:\n";
  (void) !write(STDERR_FILENO, head, sizeof head - 1);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

} // namespace

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
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE})
    signal(sig, print_stack);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
