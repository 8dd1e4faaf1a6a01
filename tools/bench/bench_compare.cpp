// tools/bench/bench_compare.cpp: how fast the evaluator compares outputs that lie in its own
// memory (env::compare_outputs on host bytes): every CPU verdict's trials and timed calls, and a
// CUDA one's outputs that could not stay on the device. The physical limit beside it: one pass
// over both tensors' bytes (std::memcmp of the reference's bytes with an equal copy: the least a
// comparison must read).
//
//   bench_compare [--elements 2097152] [--reps 15] [--json]
//
// For float32, float16, bfloat16 and int64 outputs of --elements elements, the candidate's equal
// to the reference's but for a small difference within the tolerance, it prints the median of
// --reps comparisons (ms), ns an element, GB/s over both tensors' bytes, and the same for memcmp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "env/eval/compare.hpp"

using namespace crucible;

namespace {

constexpr const char* help_text =
  "bench_compare: the evaluator's comparison of outputs in its own memory (env::compare_outputs on\n"
  "host bytes), beside one memcmp pass over the same bytes.\n"
  "\n"
  "  --elements N   elements an output (default 2097152: CPU suite task 02's output)\n"
  "  --reps N       comparisons a dtype, the median printed (default 15)\n"
  "  --json         one JSON object a dtype instead of a table\n";

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::uint16_t to_half(float f) { // round toward zero: enough for test values in [-4, 4]
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  const std::uint32_t sign = (b >> 16) & 0x8000;
  const int exp = static_cast<int>((b >> 23) & 0xff) - 127 + 15;
  if (exp <= 0)
    return static_cast<std::uint16_t>(sign);
  return static_cast<std::uint16_t>(sign | (static_cast<std::uint32_t>(exp) << 10) | ((b >> 13) & 0x3ff));
}

// The reference's and the candidate's bytes of `n` elements of `t`: values in [-4, 4], the
// candidate's off by a little (within every dtype's tolerance).
void fill(env::dtype t, std::size_t n, std::vector<std::byte>& want, std::vector<std::byte>& got) {
  std::mt19937 rng{7};
  std::uniform_real_distribution<float> u{-4.0F, 4.0F};
  const auto es = env::element_size(t);
  want.resize(n * es);
  got.resize(n * es);
  for (std::size_t i = 0; i < n; ++i) {
    const float w = u(rng), g = w + 1e-6F * w;
    auto put = [&](std::vector<std::byte>& out, float v) {
      switch (t) {
        case env::dtype::f32: std::memcpy(out.data() + i * 4, &v, 4); break;
        case env::dtype::f16: {
          const auto h = to_half(v);
          std::memcpy(out.data() + i * 2, &h, 2);
          break;
        }
        case env::dtype::bf16: {
          std::uint32_t b;
          std::memcpy(&b, &v, 4);
          const auto h = static_cast<std::uint16_t>(b >> 16);
          std::memcpy(out.data() + i * 2, &h, 2);
          break;
        }
        default: {
          const auto x = static_cast<std::int64_t>(std::lround(w * 1000)); // integers compare exactly
          std::memcpy(out.data() + i * 8, &x, 8);
        }
      }
    };
    put(want, w);
    put(got, g);
  }
}

} // namespace

int main(int argc, char** argv) {
  std::size_t elements = 2097152;
  int reps = 15;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* what) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_compare: %s needs a value\n", what);
        std::exit(2);
      }
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 1) {
        std::fprintf(stderr, "bench_compare: %s %s: not a positive integer\n", what, argv[i]);
        std::exit(2);
      }
      return v;
    };
    if (a == "--elements")
      elements = static_cast<std::size_t>(value("--elements"));
    else if (a == "--reps")
      reps = static_cast<int>(value("--reps"));
    else if (a == "--json")
      json = true;
    else if (a == "-h" || a == "--help") {
      std::fputs(help_text, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "bench_compare: unknown argument %s (--help)\n", a.c_str());
      return 2;
    }
  }
  if (!json)
    std::printf("%-9s %12s %10s %10s %12s %10s\n", "dtype", "compare ms", "ns/elem", "GB/s", "memcmp ms", "GB/s");
  const env::tolerances tol;
  for (const auto t : {env::dtype::f32, env::dtype::f16, env::dtype::bf16, env::dtype::i64}) {
    std::vector<env::tensor_blob> want(1), got(1);
    want[0].type = got[0].type = t;
    want[0].shape = got[0].shape = {static_cast<std::int64_t>(elements)};
    fill(t, elements, want[0].bytes, got[0].bytes);
    const std::vector<std::byte> same = want[0].bytes;
    std::vector<double> ms, cmp_ms;
    int sink = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto c = env::compare_outputs(want, got, tol);
      const auto t1 = std::chrono::steady_clock::now();
      if (!c.ok) {
        std::fprintf(stderr, "bench_compare: %s: the comparison failed: %s\n", env::to_string(t), c.message.c_str());
        return 1;
      }
      sink += std::memcmp(want[0].bytes.data(), same.data(), same.size()) != 0; // equal: read to the end
      const auto t2 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      cmp_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    const double m = median(ms), mc = median(cmp_ms);
    const double bytes = 2.0 * static_cast<double>(want[0].bytes.size());
    if (json)
      std::printf("{\"dtype\":\"%s\",\"elements\":%zu,\"compare_ms\":%.4f,\"ns_per_element\":%.3f,\"compare_gb_s\":%.3f,"
                  "\"memcmp_ms\":%.4f,\"memcmp_gb_s\":%.3f,\"memcmp_differing\":%d}\n",
                  env::to_string(t), elements, m, m * 1e6 / static_cast<double>(elements), bytes / m / 1e6, mc,
                  bytes / mc / 1e6, sink);
    else
      std::printf("%-9s %12.3f %10.3f %10.2f %12.3f %10.2f\n", env::to_string(t), m, m * 1e6 / static_cast<double>(elements),
                  bytes / m / 1e6, mc, bytes / mc / 1e6);
  }
  return 0;
}
