// tools/bench/bench_replay.cpp: replay-store figures for docs/PERFORMANCE.md: the disk's fsync
// rate, record throughput (record vs record_batch), and exemplar-query latency over 1M variants.
//
//   bench_replay [--dir DIR] [--rows 1000000] [--tasks 250] [--queries 2000] [--seconds 3]
//                [--throughput 0]   (0: skip the record-throughput part)
//                [--batches 1,10,100,1000]   (the record-throughput modes; 1 is record())
//
// Rows are realistic: 2-6 KB of Python/CUDA code with a distinct sha256, a completion of
// analysis text plus that code, statuses in the proportions of an early run. With --dir the
// 1M-row database (DIR/replay-1m.db, code but no completions) is kept and reused by later runs;
// without it everything lives in a temporary directory removed at exit.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/sha256.hpp"
#include "storage/exemplar_select.hpp"
#include "storage/replay_store.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace crucible::storage;
using clock_type = std::chrono::steady_clock;

namespace {

// CPU time (user + system) of this thread: on a shared machine, rows per CPU-second says what
// one core can do when it is not waiting for the disk or for other processes.
double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// CPU time of the whole process (every thread: the store's checkpointer included).
double process_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Writes 512 bytes and fsyncs, in a loop: the rate bounds commits per second of any store on
// this disk that promises durability per commit.
double fsync_rate(const fs::path& dir, double seconds) {
  const auto file = dir / "fsync-probe";
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return 0.0;
  char buf[512] = {};
  std::int64_t n = 0;
  const auto t0 = clock_type::now();
  while (seconds_since(t0) < seconds) {
    buf[0] = static_cast<char>(n);
    if (::pwrite(fd, buf, sizeof buf, 0) != static_cast<ssize_t>(sizeof buf) || ::fsync(fd) != 0) break;
    ++n;
  }
  const double rate = static_cast<double>(n) / seconds_since(t0);
  ::close(fd);
  fs::remove(file);
  return rate;
}

// Generates distinct, realistic variants: tasks × hardware kinds, a status mix, code of 2-6 KB.
class row_source {
public:
  row_source(int tasks, std::uint64_t seed, bool completions)
      : tasks_(tasks), rng_(seed), completions_(completions) {}

  variant_record next() {
    variant_record v;
    const int task = static_cast<int>(rng_() % static_cast<unsigned>(tasks_));
    v.task_id = "level" + std::to_string(1 + task % 3) + "/" + std::to_string(task) + "_Task";
    v.task_name = "Task" + std::to_string(task);
    v.hardware = (rng_() & 1) ? "h100" : "l40s";
    v.code = code(2048 + static_cast<std::size_t>(rng_() % 4096));
    v.code_hash = sha256_hex(v.code);
    const unsigned r = static_cast<unsigned>(rng_() % 100);
    const double u = static_cast<double>(rng_() % 10000) / 10000.0;
    if (r < 40) {
      v.status = "ok";
      v.correct = true;
      v.speedup = 0.5 + 3.0 * u;
      v.reward = *v.speedup - 1.0;
      v.spread = 0.02;
      v.ref_ms = 1.0;
      v.cand_ms = 1.0 / *v.speedup;
    } else if (r < 60) {
      v.status = "incorrect";
      v.reward = -0.5;
      v.message = "trial 2 (distribution 0): max abs error 0.31 > tolerance 0.001";
    } else if (r < 80) {
      v.status = "compile_error";
      v.reward = -1.0;
      v.message = "error: identifier \"__shfl_sync_x\" is undefined";
    } else if (r < 90) {
      v.status = "runtime_error";
      v.reward = -1.0;
      v.message = "CUDA error: an illegal memory access was encountered";
    } else if (r < 95) {
      v.status = "timeout";
      v.reward = -1.0;
    } else {
      v.status = "rejected";
      v.reward = -1.0;
      v.checks_failed = (r & 1) ? R"(["runtime:timer"])" : R"(["static:threads","runtime:threads"])";
      v.message = "an anti-hacking check failed";
    }
    v.policy_version = serial_ / 4096;
    v.prompt_id = "prompt-" + std::to_string(serial_ / 8);
    v.group_id = serial_ / 8;
    v.exemplar_ids = "[" + std::to_string(serial_ / 3) + "," + std::to_string(serial_ / 5) + "]";
    if (completions_)
      v.completion = "## Performance Analysis\n" + prose(600) + "\n## Algorithm Design\n" + prose(400) +
                     "\n## Code Implementation\n```python\n" + v.code + "\n```\n";
    ++serial_;
    return v;
  }

private:
  std::string word() {
    static const char* words[] = {"tile", "warp", "shared", "block", "load", "store", "reduce", "fused",
                                  "vector", "stride", "bank", "coalesce", "occupancy", "register"};
    return words[rng_() % (sizeof words / sizeof *words)];
  }
  std::string prose(std::size_t bytes) {
    std::string out;
    while (out.size() < bytes) out += word() + (rng_() % 9 == 0 ? ". " : " ");
    return out;
  }
  std::string code(std::size_t bytes) {
    const std::string id = std::to_string(serial_) + "_" + std::to_string(rng_() % 100000);
    std::string out =
      "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
      "cuda_src = r\"\"\"\n#include <torch/extension.h>\n";
    int k = 0;
    while (out.size() + 600 < bytes) {
      const std::string name = word() + "_" + word() + "_k" + std::to_string(k++) + "_" + id;
      const unsigned tile = 16u << (rng_() % 4);
      out += "__global__ void " + name + "(const float* __restrict__ x, float* __restrict__ y, int n) {\n"
             "  __shared__ float tile[" + std::to_string(tile) + "];\n"
             "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  float acc = 0.f;\n"
             "  for (int j = threadIdx.x; j < n; j += " + std::to_string(tile) + ") acc += x[j] * " +
             std::to_string(rng_() % 997) + ".0f;\n"
             "  tile[threadIdx.x % " + std::to_string(tile) + "] = acc;\n  __syncthreads();\n"
             "  if (i < n) y[i] = tile[threadIdx.x % " + std::to_string(tile) + "] + x[i];\n}\n";
    }
    out += "\"\"\"\n\next = load_inline(name=\"ext_" + id +
           "\", cpp_sources=\"\", cuda_sources=cuda_src, functions=[])\n\n"
           "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
           "    def forward(self, x):\n        return ext.forward(x)\n";
    while (out.size() < bytes) out += "# pad\n";
    return out;
  }

  int tasks_;
  std::mt19937_64 rng_;
  bool completions_;
  std::uint64_t serial_ = 0;
};

volatile std::size_t sink = 0;  // keeps the exemplar fetch from being optimised away

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

int fail_with(const crucible::error& e) {
  std::fprintf(stderr, "bench_replay: %s\n", e.message.c_str());
  return 1;
}

constexpr const char* usage_text =
    "usage: bench_replay [--dir DIR] [--rows N] [--tasks T] [--queries Q] [--seconds S] [--throughput 0|1] "
    "[--batches 1,10,...]\n";

} // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string{argv[i]} == "--help" || std::string{argv[i]} == "-h") {
      std::printf("bench_replay: the replay store's figures: the disk's fsync rate, record throughput\n"
                  "(record against record_batch), exemplar-query latency over --rows stored variants and\n"
                  "hack-case retrieval. Reproduces the goals table's replay store rows in docs/PERFORMANCE.md.\n"
                  "With --dir the 1M-row database is kept there and reused; without it everything lives in\n"
                  "a temporary directory. No environment variables.\n\n%s",
                  usage_text);
      return 0;
    }
  fs::path dir;
  std::int64_t rows_1m = 1000000;
  int tasks = 250;
  int queries = 2000;
  double seconds = 3.0;
  bool throughput = true;
  std::vector<std::size_t> batches{1, 10, 100, 1000};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") dir = v;
    else if (k == "--rows") rows_1m = std::stoll(v);
    else if (k == "--tasks") tasks = std::stoi(v);
    else if (k == "--queries") queries = std::stoi(v);
    else if (k == "--seconds") seconds = std::stod(v);
    else if (k == "--throughput") throughput = v != "0";
    else if (k == "--batches") {
      batches.clear();
      for (std::size_t p = 0; p < v.size();) {
        auto c = v.find(',', p);
        if (c == std::string::npos) c = v.size();
        batches.push_back(std::stoul(v.substr(p, c - p)));
        if (batches.back() == 0) {
          std::fprintf(stderr, "bench_replay: --batches: a batch has at least 1 row\n");
          return 2;
        }
        p = c + 1;
      }
    }
    else {
      std::fprintf(stderr, "bench_replay: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if ((argc - 1) % 2 != 0) {
    std::fputs(usage_text, stderr);
    return 2;
  }
  const bool temporary = dir.empty();
  if (temporary) {
    auto tmpl = (fs::temp_directory_path() / "bench-replay-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return 1;
    dir = tmpl;
  }
  fs::create_directories(dir);
  std::printf("directory %s\n", dir.c_str());

  // 0. The disk.
  std::printf("fsync rate: %.0f fsync/s (512 B pwrite + fsync, %.0f s)\n", fsync_rate(dir, seconds), seconds);

  // 1. Record throughput, one thread, fresh database per mode.
  std::printf("\nrecord throughput (fresh database, synchronous=FULL, one thread):\n");
  // rows/CPU-s: CPU time of the recording thread inside record()/record_batch(); rows/proc-CPU-s:
  // CPU time of every thread of the process while the mode ran, less the row generation.
  std::printf("%-22s %10s %12s %14s %16s %10s\n", "mode", "rows", "rows/s", "rows/CPU-s",
              "rows/proc-CPU-s", "KB/row");
  for (std::size_t batch : batches) {
    if (!throughput) break;
    const auto db = dir / ("throughput-" + std::to_string(batch) + ".db");
    for (const char* sfx : {"", "-wal", "-shm"}) fs::remove(db.string() + sfx);
    auto store = replay_store::open(db);
    if (!store) return fail_with(store.error());
    row_source src(tasks, 42 + batch, true);
    std::int64_t n = 0;
    double busy = 0.0, cpu = 0.0, bytes = 0.0, generation_cpu = 0.0;
    const double p0 = process_cpu_s();
    std::vector<variant_record> rows;
    while (busy < seconds) {
      rows.clear();
      const double g0 = thread_cpu_s();
      for (std::size_t i = 0; i < batch; ++i) {
        rows.push_back(src.next());
        bytes += static_cast<double>(rows.back().code.size() + rows.back().completion.size());
      }
      generation_cpu += thread_cpu_s() - g0;
      const auto t0 = clock_type::now();
      const double c0 = thread_cpu_s();
      if (batch == 1) {
        if (auto r = store->record(rows[0]); !r) return fail_with(r.error());
      } else if (auto r = store->record_batch(rows); !r) {
        return fail_with(r.error());
      }
      busy += seconds_since(t0);
      cpu += thread_cpu_s() - c0;
      n += static_cast<std::int64_t>(batch);
    }
    store = replay_store::open(dir / "unused.db");  // close (and join any thread) before timing
    const double process_cpu = process_cpu_s() - p0 - generation_cpu;
    const std::string mode = batch == 1 ? "record" : "record_batch(" + std::to_string(batch) + ")";
    std::printf("%-22s %10lld %12.0f %14.0f %16.0f %10.1f\n", mode.c_str(), static_cast<long long>(n),
                static_cast<double>(n) / busy, static_cast<double>(n) / cpu,
                static_cast<double>(n) / process_cpu, bytes / static_cast<double>(n) / 1024.0);
    std::fflush(stdout);
    for (const char* sfx : {"", "-wal", "-shm"}) fs::remove(db.string() + sfx);
  }
  for (const char* sfx : {"", "-wal", "-shm"}) fs::remove((dir / "unused.db").string() + sfx);

  // 2. Exemplar-query latency over rows_1m stored variants.
  const auto big = dir / "replay-1m.db";
  auto store = replay_store::open(big);
  if (!store) return fail_with(store.error());
  std::int64_t have = store->count().value();
  if (have < rows_1m) {
    std::printf("\nbuilding %s: %lld rows in batches of 1000 (code, no completions)...\n", big.c_str(),
                static_cast<long long>(rows_1m - have));
    std::fflush(stdout);
    row_source src(tasks, 7 + static_cast<std::uint64_t>(have), false);
    const auto t0 = clock_type::now();
    std::vector<variant_record> rows;
    while (have < rows_1m) {
      rows.clear();
      for (std::int64_t i = 0; i < std::min<std::int64_t>(1000, rows_1m - have); ++i) rows.push_back(src.next());
      if (auto r = store->record_batch(rows); !r) return fail_with(r.error());
      have += static_cast<std::int64_t>(rows.size());
    }
    const double t = seconds_since(t0);
    std::printf("built in %.1f s (%.0f rows/s including row generation)\n", t,
                static_cast<double>(have) / t);
  }
  std::printf("\nexemplar query over %lld variants, %d tasks x 2 hardware kinds, %d queries:\n",
              static_cast<long long>(store->count().value()), tasks, queries);
  std::mt19937_64 rng(1234);
  exemplar_options opts;  // contrastive, n = 2
  auto pick_key = [&](std::mt19937_64& r) {
    const int task = static_cast<int>(r() % static_cast<unsigned>(tasks));
    return std::pair{"level" + std::to_string(1 + task % 3) + "/" + std::to_string(task) + "_Task",
                     std::string((r() & 1) ? "h100" : "l40s")};
  };
  // Two passes over the same key sequence: the first touches each (task, hardware) for the first
  // time since the build (pages may come from the disk), the second runs on a warm cache. Each
  // query is timed whole and by phase: the index query, select_exemplars, and find() of the
  // chosen exemplars (the prompt needs their code).
  struct mode {
    const char* name;
    variant_fields fields;
  };
  for (const mode m : {mode{"summary + select + find", variant_fields::summary},
                       mode{"full rows + select", variant_fields::full}}) {
    for (int pass = 1; pass <= (m.fields == variant_fields::summary ? 2 : 1); ++pass) {
      std::vector<double> total, cpu, t_query, t_select, t_find;
      double candidates = 0.0;
      std::mt19937_64 keys(99);
      for (int q = 0; q < queries; ++q) {
        auto [task, hw] = pick_key(keys);
        const double c0 = thread_cpu_s();
        const auto t0 = clock_type::now();
        auto cands = store->successful_variants(task, hw, m.fields);
        if (!cands) return fail_with(cands.error());
        const auto t1 = clock_type::now();
        auto chosen = select_exemplars(*cands, opts, rng);
        if (!chosen) return fail_with(chosen.error());
        const auto t2 = clock_type::now();
        std::size_t code_bytes = 0;
        for (std::size_t i : *chosen) {
          if (m.fields == variant_fields::summary) {
            auto row = store->find((*cands)[i].id);
            if (!row) return fail_with(row.error());
            code_bytes += row->code.size();
          } else {
            code_bytes += (*cands)[i].code.size();
          }
        }
        const auto t3 = clock_type::now();
        cpu.push_back((thread_cpu_s() - c0) * 1e3);
        sink = code_bytes;
        auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
        total.push_back(ms(t0, t3));
        t_query.push_back(ms(t0, t1));
        t_select.push_back(ms(t1, t2));
        t_find.push_back(ms(t2, t3));
        candidates += static_cast<double>(cands->size());
      }
      std::printf("%-24s pass %d: p50 %.3f ms  p99 %.3f ms  max %.3f ms  (%.0f candidates per query)\n",
                  m.name, pass, percentile(total, 0.50), percentile(total, 0.99),
                  *std::max_element(total.begin(), total.end()), candidates / static_cast<double>(queries));
      std::printf("%-24s         query p50/p99 %.3f/%.3f ms, select %.3f/%.3f ms, find %.3f/%.3f ms\n", "",
                  percentile(t_query, 0.5), percentile(t_query, 0.99), percentile(t_select, 0.5),
                  percentile(t_select, 0.99), percentile(t_find, 0.5), percentile(t_find, 0.99));
      std::printf("%-24s         CPU time of this thread per query: p50 %.3f ms  p99 %.3f ms\n", "",
                  percentile(cpu, 0.5), percentile(cpu, 0.99));
      std::fflush(stdout);
    }
  }

  // 3. Hacking-case retrieval (exact Jaccard over every case considered).
  {
    auto hacks = store->list_hacks();
    if (!hacks) return fail_with(hacks.error());
    const std::string probe = hacks->empty() ? std::string() : hacks->front().variant.code;
    const std::size_t total = hacks->size();
    hacks->clear();
    std::vector<double> per_task;
    std::mt19937_64 keys(5);
    for (int q = 0; q < 50; ++q) {
      const auto t0 = clock_type::now();
      auto r = store->similar_hacks(probe, 5, {pick_key(keys).first, ""});
      if (!r) return fail_with(r.error());
      per_task.push_back(seconds_since(t0) * 1e3);
    }
    const auto t0 = clock_type::now();
    auto r = store->similar_hacks(probe, 5);
    if (!r) return fail_with(r.error());
    std::printf("\nsimilar_hacks: %zu cases in all; one task: p50 %.2f ms, p99 %.2f ms (50 queries); "
                "all cases: %.0f ms\n",
                total, percentile(per_task, 0.5), percentile(per_task, 0.99), seconds_since(t0) * 1e3);
  }
  if (temporary) {
    store = replay_store::open(dir / "unused.db");
    fs::remove_all(dir);
  }
  return 0;
}
