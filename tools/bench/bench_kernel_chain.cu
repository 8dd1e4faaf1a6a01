// tools/bench/bench_kernel_chain.cu: what a chain of dependent kernels costs on this device by
// itself, the floor under a decoding step made of many small kernels (docs/PERFORMANCE.md).
// One JSON object per line on stdout.
//
//   bench_kernel_chain [--device 0] [--kernels 130] [--replays 200] [--blocks 14,132,1216]
//                      [--threads 128] [--mib 0,6] [--layers 24]
//                      [--decode-blocks 144,14,112,1216,448,1056]... [--decode-threads 128,512,128,128,128,128]
//
// Each kernel of a chain reads its share of `weights` (16 bytes a load, up to eight loads a thread
// before waiting for the previous kernel, the rest after), waits for the previous kernel
// (griddepcontrol.wait under programmatic dependent launch, else stream order), then thread 0 of
// every block reads the value the previous kernel wrote and writes it plus one. The chain is
// captured in a CUDA graph and replayed; after the timed replays, one more replay from cleared
// buffers must end with every block's value equal to the chain's length, or the run fails (the
// dependency was not honoured).
//
// "uniform" chains: --kernels kernels of B blocks of --threads threads for each B in --blocks,
// each kernel reading M MiB for each M in --mib; with PDL off, and on with the dependents
// launched at the kernel's start or after its wait. The "decode" chain has the launch shapes and
// weight bytes of a batch-1 decoding step of the random Qwen2.5-0.5B-shaped model (per layer: q/k/v
// 144 blocks 2.06 MB, attention 14 blocks of 512 threads 0.26 MB, o 112 blocks 1.61 MB, gate/up
// 1216 blocks 17.4 MB, down 448 blocks 8.72 MB; then the output matrix, 272 MB over 1056 blocks),
// --layers layers: the time of that chain is what the step's kernels would take with no work but
// their loads and one dependent read and write each. Each --decode-blocks (given once or more)
// measures the chain with those six block counts instead (threads: --decode-threads), and each
// kind of kernel alone in a chain of --layers kernels ("decode_kind" records).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "policy/kernels/kernel_math.cuh"

namespace {

constexpr int preloads = 8; // 16-byte loads a thread keeps in flight across the wait

// The engine's kernels' programmatic dependent launch, so that the chain waits as they do.
using crucible::policy::kernels::grid_dependency_wait;
using crucible::policy::kernels::grid_dependents_launch;

// in: the previous kernel's values (null for the first kernel: 0); out[block] = in[0] + 1.
__global__ void chain_kernel(const uint4* __restrict__ weights, long long vectors, const int* in, int* out,
                             int* sink, bool trigger_at_start) {
  if (trigger_at_start)
    grid_dependents_launch();
  const long long per_block = (vectors + gridDim.x - 1) / gridDim.x;
  const long long begin = blockIdx.x * per_block;
  const long long end = begin + per_block < vectors ? begin + per_block : vectors;
  uint4 held[preloads];
  unsigned acc = 0;
#pragma unroll
  for (int u = 0; u < preloads; ++u) {
    const long long i = begin + threadIdx.x + static_cast<long long>(u) * blockDim.x;
    held[u] = i < end ? __ldg(weights + i) : make_uint4(0, 0, 0, 0);
  }
  grid_dependency_wait();
  if (!trigger_at_start)
    grid_dependents_launch();
#pragma unroll
  for (int u = 0; u < preloads; ++u)
    acc ^= held[u].x ^ held[u].y ^ held[u].z ^ held[u].w;
  for (long long i = begin + threadIdx.x + static_cast<long long>(preloads) * blockDim.x; i < end; i += blockDim.x) {
    const uint4 w = __ldg(weights + i);
    acc ^= w.x ^ w.y ^ w.z ^ w.w;
  }
  if (acc == 0x9e3779b9u) // the weights are zeros: never, but the loads cannot be dropped
    sink[0] = 1;
  if (threadIdx.x == 0)
    out[blockIdx.x] = (in == nullptr ? 0 : in[0]) + 1;
}

struct launch {
  int blocks = 1, threads = 128;
  long long bytes = 0;
  long long offset = 0; // where in the weight region its bytes start (set by run_chain)
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_kernel_chain: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

std::vector<long long> numbers(const std::string& s, const char* flag) {
  std::vector<long long> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    const auto comma = s.find(',', at);
    const auto item = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    char* endp = nullptr;
    const long long v = std::strtoll(item.c_str(), &endp, 10);
    if (item.empty() || *endp != '\0' || v < 0) {
      std::fprintf(stderr, "bench_kernel_chain: %s: expected non-negative integers separated by commas, got '%s'\n", flag,
                   s.c_str());
      std::exit(2);
    }
    out.push_back(v);
    if (comma == std::string::npos)
      break;
    at = comma + 1;
  }
  return out;
}

struct result {
  double us_per_chain = 0.0;
  bool correct = false;
};

// The chain in a graph, replayed `replays` times after a warm-up; then one checked replay.
// Each kernel reads bytes of its own, the next after the previous kernel's in a region of
// `region` bytes (larger than L2) and wrapping around, so that reads come from HBM as a decoding
// step's distinct weights do.
result run_chain(std::vector<launch> chain, bool pdl, bool trigger_at_start, const uint4* weights, long long region,
                 int* buffers[2], int max_blocks, int* sink, int replays, cudaStream_t stream) {
  long long at = 0;
  for (auto& c : chain) {
    if (at + c.bytes > region)
      at = 0;
    c.offset = at;
    at += (c.bytes + 255) / 256 * 256;
  }
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (std::size_t k = 0; k < chain.size(); ++k) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(chain[k].blocks));
    config.blockDim = dim3(static_cast<unsigned>(chain[k].threads));
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = pdl && k > 0 ? 1 : 0;
    const int* in = k == 0 ? nullptr : buffers[(k + 1) % 2];
    int* out = buffers[k % 2];
    check(cudaLaunchKernelEx(&config, chain_kernel, weights + chain[k].offset / 16, chain[k].bytes / 16, in, out, sink,
                             trigger_at_start),
          "launch");
  }
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int i = 0; i < 10; ++i)
    check(cudaGraphLaunch(exec, stream), "warm-up replay");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  check(cudaEventRecord(start, stream), "record");
  for (int i = 0; i < replays; ++i)
    check(cudaGraphLaunch(exec, stream), "replay");
  check(cudaEventRecord(stop, stream), "record");
  check(cudaEventSynchronize(stop), "synchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
  result r;
  r.us_per_chain = 1000.0 * ms / replays;
  // The checked replay: every block of the last kernel must see the chain's length.
  for (int b = 0; b < 2; ++b)
    check(cudaMemsetAsync(buffers[b], 0xff, sizeof(int) * static_cast<std::size_t>(max_blocks), stream), "memset");
  check(cudaGraphLaunch(exec, stream), "checked replay");
  std::vector<int> last(static_cast<std::size_t>(chain.back().blocks));
  check(cudaMemcpyAsync(last.data(), buffers[(chain.size() - 1) % 2], sizeof(int) * last.size(), cudaMemcpyDeviceToHost,
                        stream),
        "copy back");
  check(cudaStreamSynchronize(stream), "synchronize");
  r.correct = std::all_of(last.begin(), last.end(), [&](int v) { return v == static_cast<int>(chain.size()); });
  check(cudaEventDestroy(start), "event");
  check(cudaEventDestroy(stop), "event");
  check(cudaGraphExecDestroy(exec), "destroy");
  check(cudaGraphDestroy(graph), "destroy");
  return r;
}

} // namespace

constexpr const char* usage_text =
    "usage: bench_kernel_chain [--device 0] [--kernels 130] [--replays 200] [--blocks 14,132,1216] "
    "[--threads 128] [--mib 0,6] [--layers 24] [--decode-blocks 144,14,112,1216,448,1056]... "
    "[--decode-threads 128,512,128,128,128,128]\n";

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string{argv[i]} == "--help" || std::string{argv[i]} == "-h") {
      std::printf("bench_kernel_chain: what a chain of dependent kernels costs on this device by itself, in\n"
                  "stream order and under programmatic dependent launch: uniform chains (--blocks, --mib) and\n"
                  "the chain of a batch-1 decoding step's launch shapes and weight bytes (--decode-blocks),\n"
                  "doing nothing but their loads; one JSON object per line. Reproduces the goals table's row\n"
                  "on the floor under a decoding step's kernels in docs/PERFORMANCE.md\n"
                  "(tools/bench/gpu_session.sh chain). The top of tools/bench/bench_kernel_chain.cu describes\n"
                  "the chains. No environment variables.\n\n%s",
                  usage_text);
      return 0;
    }
  int device = 0, kernels = 130, replays = 200, layers = 24;
  std::vector<long long> blocks = {14, 132, 1216}, threads = {128}, mib = {0, 6};
  std::vector<std::vector<long long>> decode_blocks;
  std::vector<long long> decode_threads = {128, 512, 128, 128, 128, 128};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_kernel_chain: %s needs a value\n", flag.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    auto one = [&](const char* name) {
      const auto n = numbers(v, name);
      if (n.size() != 1 || n[0] < 1) {
        std::fprintf(stderr, "bench_kernel_chain: %s: expected one positive integer, got '%s'\n", name, v.c_str());
        std::exit(2);
      }
      return static_cast<int>(n[0]);
    };
    if (flag == "--device")
      device = static_cast<int>(numbers(v, "--device").at(0));
    else if (flag == "--kernels")
      kernels = one("--kernels");
    else if (flag == "--replays")
      replays = one("--replays");
    else if (flag == "--layers")
      layers = one("--layers");
    else if (flag == "--blocks")
      blocks = numbers(v, "--blocks");
    else if (flag == "--threads")
      threads = numbers(v, "--threads");
    else if (flag == "--mib")
      mib = numbers(v, "--mib");
    else if (flag == "--decode-blocks")
      decode_blocks.push_back(numbers(v, "--decode-blocks"));
    else if (flag == "--decode-threads")
      decode_threads = numbers(v, "--decode-threads");
    else {
      std::fputs(usage_text, stderr);
      return 2;
    }
  }
  auto good_blocks = [](long long b) { return b >= 1 && b <= 65535; };
  auto good_threads = [](long long t) { return t >= 32 && t <= 1024 && t % 32 == 0; };
  if (!std::all_of(blocks.begin(), blocks.end(), good_blocks)) {
    std::fprintf(stderr, "bench_kernel_chain: --blocks: each between 1 and 65535\n");
    return 2;
  }
  if (!std::all_of(threads.begin(), threads.end(), good_threads)) {
    std::fprintf(stderr, "bench_kernel_chain: --threads: each a multiple of 32 up to 1024\n");
    return 2;
  }

  // The decoding step's kinds of kernel (see the top of this file), each with the block counts
  // of every --decode-blocks.
  const char* kind_names[6] = {"qkv", "attention", "o", "gate_up", "down", "output"};
  const long long kind_bytes[6] = {1152LL * 896 * 2, 2LL * 2 * 512 * 64 * 2, 896LL * 896 * 2,
                                   9728LL * 896 * 2, 896LL * 4864 * 2, 151936LL * 896 * 2};
  if (decode_blocks.empty())
    decode_blocks.push_back({144, 14, 112, 1216, 448, 1056});
  const bool six = decode_threads.size() == 6
                   && std::all_of(decode_blocks.begin(), decode_blocks.end(), [](const auto& d) { return d.size() == 6; });
  if (!six) {
    std::fprintf(stderr, "bench_kernel_chain: --decode-blocks and --decode-threads take six numbers each (q/k/v, "
                         "attention, o, gate/up, down, output)\n");
    return 2;
  }
  const bool good_decode = std::all_of(decode_threads.begin(), decode_threads.end(), good_threads)
                           && std::all_of(decode_blocks.begin(), decode_blocks.end(), [&](const auto& d) {
                                return std::all_of(d.begin(), d.end(), good_blocks);
                              });
  if (!good_decode) {
    std::fprintf(stderr, "bench_kernel_chain: --decode-blocks between 1 and 65535, --decode-threads multiples of 32 "
                         "up to 1024\n");
    return 2;
  }
  auto decode_chain = [&](const std::vector<long long>& b) {
    std::vector<launch> chain;
    for (int l = 0; l < layers; ++l)
      for (int k = 0; k < 5; ++k)
        chain.push_back({static_cast<int>(b[k]), static_cast<int>(decode_threads[k]), kind_bytes[k]});
    chain.push_back({static_cast<int>(b[5]), static_cast<int>(decode_threads[5]), kind_bytes[5]});
    return chain;
  };

  check(cudaSetDevice(device), "set device");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "properties");
  long long most_bytes = 0;
  int most_blocks = 1;
  for (auto m : mib)
    most_bytes = std::max(most_bytes, m << 20);
  for (const auto& d : decode_blocks)
    for (int k = 0; k < 6; ++k) {
      most_bytes = std::max(most_bytes, kind_bytes[k]);
      most_blocks = std::max(most_blocks, static_cast<int>(d[k]));
    }
  for (auto b : blocks)
    most_blocks = std::max(most_blocks, static_cast<int>(b));
  // The weights all kernels read (run_chain places each kernel's bytes), at least 1 GiB.
  const long long region = std::max<long long>(1LL << 30, 2 * most_bytes);
  uint4* weights = nullptr;
  int *buffers[2] = {nullptr, nullptr}, *sink = nullptr;
  check(cudaMalloc(&weights, static_cast<std::size_t>(region)), "malloc weights");
  check(cudaMemset(weights, 0, static_cast<std::size_t>(region)), "memset weights");
  for (auto& b : buffers)
    check(cudaMalloc(&b, sizeof(int) * static_cast<std::size_t>(most_blocks)), "malloc");
  check(cudaMalloc(&sink, sizeof(int)), "malloc");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");

  std::printf("{\"kind\": \"setup\", \"device\": \"%s\", \"sms\": %d, \"l2_bytes\": %d, \"replays\": %d}\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize, replays);
  struct mode {
    const char* name;
    bool pdl, trigger_at_start;
  };
  const mode modes[] = {{"stream_order", false, false}, {"pdl_trigger_after_wait", true, false},
                        {"pdl_trigger_at_start", true, true}};
  bool all_correct = true;
  auto report = [&](const char* chain_name, const std::vector<launch>& chain, const char* extra) {
    long long bytes = 0;
    for (const auto& c : chain)
      bytes += c.bytes;
    for (const auto& m : modes) {
      const auto r = run_chain(chain, m.pdl, m.trigger_at_start, weights, region, buffers, most_blocks, sink, replays, stream);
      all_correct = all_correct && r.correct;
      std::printf("{\"kind\": \"chain\", \"chain\": \"%s\"%s, \"kernels\": %zu, \"mode\": \"%s\", \"bytes\": %lld, "
                  "\"us_per_chain\": %.2f, \"us_per_kernel\": %.3f, \"gb_per_s\": %.1f, \"correct\": %s}\n",
                  chain_name, extra, chain.size(), m.name, bytes, r.us_per_chain, r.us_per_chain / chain.size(),
                  bytes / (r.us_per_chain * 1e3), r.correct ? "true" : "false");
      std::fflush(stdout);
    }
  };
  for (auto m : mib)
    for (auto t : threads)
      for (auto b : blocks) {
        std::vector<launch> chain(static_cast<std::size_t>(kernels), launch{static_cast<int>(b), static_cast<int>(t), m << 20});
        char extra[128];
        std::snprintf(extra, sizeof extra, ", \"blocks\": %lld, \"threads\": %lld, \"mib_per_kernel\": %lld", b, t, m);
        report("uniform", chain, extra);
      }
  for (const auto& d : decode_blocks) {
    char extra[160];
    std::snprintf(extra, sizeof extra, ", \"blocks\": [%lld, %lld, %lld, %lld, %lld, %lld]", d[0], d[1], d[2], d[3], d[4],
                  d[5]);
    report("decode", decode_chain(d), extra);
    for (int k = 0; k < 6; ++k) {
      const int n = k == 5 ? 1 : layers;
      std::vector<launch> alone(static_cast<std::size_t>(n),
                                launch{static_cast<int>(d[k]), static_cast<int>(decode_threads[k]), kind_bytes[k]});
      char kind[160];
      std::snprintf(kind, sizeof kind, ", \"kind_of_kernel\": \"%s\", \"blocks\": %lld, \"threads\": %lld",
                    kind_names[k], d[k], decode_threads[k]);
      report("decode_kind", alone, kind);
    }
  }
  if (!all_correct) {
    std::fprintf(stderr, "bench_kernel_chain: a chain's last kernel saw a wrong value: the dependency was not honoured\n");
    return 1;
  }
  return 0;
}
