// tools/bench/bench_eval_throughput.cpp: verdicts per minute on one device with a queue of
// distinct candidates, and the share of wall time the device spends in timed rounds.
//
//   bench_eval_throughput --device cuda:0 --concurrency 3 --candidates 20 [--set key=value]... [--verbose 1]
//                         [--timeline FILE]
//
// Candidates are the (task, candidate) pairs of tools/bench/eval_gpu (or --suite DIR), each
// made distinct k times by a trailing comment (so no verdict is cached), submitted together
// from `concurrency` threads. A first pass warms the compiled-extension cache; the second,
// with the verdict cache off, is measured; each pass begins once the warm pool is full.
// --timeline writes the measured pass's every step through the device gate and every
// evaluation's phases, for tools/bench/gate_timeline.py.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/config.hpp"
#include "core/log.hpp"
#include "env/eval/device/device_bytes.hpp"
#include "env/eval/evaluator.hpp"

namespace fs = std::filesystem;
using namespace crucible;

namespace {

constexpr const char* help_text =
    "bench_eval_throughput: verdicts per minute on one device with a queue of distinct candidates,\n"
    "and the share of the wall time the device spends in timed rounds. Reproduces the evaluator\n"
    "throughput row of the goals table in docs/PERFORMANCE.md (tools/bench/gpu_session.sh throughput).\n"
    "\n"
    "usage: bench_eval_throughput [--device cuda:0] [--concurrency 3] [--candidates 20] [--suite DIR]\n"
    "                             [--set key=value]... [--verbose 1] [--timeline FILE]\n"
    "\n"
    "  --device       the device the evaluator owns (cuda:0)\n"
    "  --concurrency  evaluating threads (3); one warm worker each unless --set evaluator.warm_workers\n"
    "  --candidates   verdicts a pass: the pairs of --suite (tools/bench/eval_gpu), each made\n"
    "                 distinct by a trailing comment (20)\n"
    "  --set          an evaluator option, as for crucible eval (repeatable)\n"
    "  --verbose 1    the evaluator's and the workers' laps on stderr (tools/bench/eval_laps.py)\n"
    "  --timeline     the measured pass's steps through the device gate (tools/bench/gate_timeline.py)\n"
    "\n"
    "A first pass builds the extensions; the second, with the verdict cache off, is measured.\n"
    "Environment: CRUCIBLE_HARNESS, CRUCIBLE_HARNESS_KERNELS and CRUCIBLE_PYTHON, as for crucible eval.\n";

} // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string{argv[i]} == "--help" || std::string{argv[i]} == "-h") {
      std::fputs(help_text, stdout);
      return 0;
    }
  std::string device = "cuda:0";
  int concurrency = 3;
  int count = 20;
  fs::path suite = fs::path{CRUCIBLE_SOURCE_DIR} / "tools" / "bench" / "eval_gpu";
  std::vector<std::string> sets;
  bool verbose = false;
  std::string timeline;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--device") device = v;
    else if (k == "--concurrency") concurrency = std::stoi(v);
    else if (k == "--candidates") count = std::stoi(v);
    else if (k == "--suite") suite = v;
    else if (k == "--set") sets.push_back(v);
    else if (k == "--verbose") verbose = v == "1";
    else if (k == "--timeline") timeline = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  auto cfg = parse_config("", "--set", sets);
  if (!cfg) {
    std::fprintf(stderr, "%s\n", cfg.error().message.c_str());
    return 2;
  }
  auto opt = cfg->evaluator;
  opt.concurrency = concurrency;
  // One warm worker per evaluating thread unless --set evaluator.warm_workers=N says otherwise.
  if (std::none_of(sets.begin(), sets.end(), [](const std::string& s) { return s.rfind("evaluator.warm_workers=", 0) == 0; }))
    opt.warm_workers = concurrency;
  std::vector<env::eval_request> queue;
  std::vector<env::eval_request> base;
  for (const auto& entry : fs::directory_iterator(suite / "tasks")) {
    auto t = env::load_task(entry.path());
    if (!t) {
      std::fprintf(stderr, "%s\n", t.error().message.c_str());
      return 2;
    }
    std::ifstream in(suite / "candidates" / entry.path().filename());
    std::ostringstream src;
    src << in.rdbuf();
    base.push_back({*t, src.str(), 0, false});
  }
  std::sort(base.begin(), base.end(), [](auto& a, auto& b) { return a.target.name < b.target.name; });
  for (int i = 0; i < count; ++i) {
    auto r = base[static_cast<size_t>(i) % base.size()];
    r.candidate += "\n# variant " + std::to_string(i) + "\n";
    queue.push_back(r);
  }
  system_clock clk;
  logger log{clk, verbose ? log_level::debug : log_level::warn}; // --verbose 1: every phase and worker start
  auto where = env::locate_harness(opt);
  if (!where) {
    std::fprintf(stderr, "%s\n", where.error().message.c_str());
    return 1;
  }
  auto ev = env::device_evaluator::create(opt, cfg->reward, *where, device, log, nullptr);
  if (!ev) {
    std::fprintf(stderr, "%s\n", ev.error().message.c_str());
    return 1;
  }
  // The timeline: "P ns thread pid phase" from the phase observer, "E ns thread begin|end task"
  // around each evaluation, "G ns thread kind" from the gate (kinds in env/eval/device_gate.hpp).
  std::mutex timeline_mtx;
  std::vector<std::string> timeline_lines;
  bool recording = false;
  auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  auto thread_key = [] { return std::hash<std::thread::id>{}(std::this_thread::get_id()); };
  auto note = [&](const std::string& line) {
    std::lock_guard guard{timeline_mtx};
    if (recording)
      timeline_lines.push_back(line);
  };
  if (!timeline.empty())
    (*ev)->set_phase_observer([&](const char* phase, pid_t pid) {
      note("P " + std::to_string(now_ns()) + " " + std::to_string(thread_key()) + " " + std::to_string(pid) + " " + phase);
    });
  auto run_pass = [&](const char* label, bool record) {
    // The queue arrives at an evaluator whose warm pool is full, as after an idle spell.
    const auto settle0 = std::chrono::steady_clock::now();
    const bool full = (*ev)->wait_warm(4 * opt.start_timeout_s);
    std::printf("%s: the warm pool %s %zu of %lld workers after %.1f s\n", label, full ? "holds" : "still holds only",
                (*ev)->warm_now(), static_cast<long long>(opt.warm_workers),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - settle0).count());
    if (record && !timeline.empty()) {
      std::lock_guard guard{timeline_mtx};
      recording = true;
      (*ev)->record_gate(true);
    }
    std::atomic<size_t> next{0};
    std::atomic<int> ok{0};
    std::mutex speedups_mtx;
    std::map<std::string, std::vector<double>> speedups; // per task: the verdicts' speedups
    auto timing0 = (*ev)->timing_seconds();
    auto device0 = (*ev)->device_seconds();
    auto init0 = (*ev)->init_seconds();
    auto init_held0 = (*ev)->init_held_seconds();
    auto drain0 = (*ev)->drain_seconds();
    auto measure_wait0 = (*ev)->measure_wait_seconds();
    auto beside0 = (*ev)->beside_seconds();
    auto untimed_beside0 = (*ev)->untimed_beside_seconds();
    auto calls0 = (*ev)->timed_call_seconds();
    auto started0 = (*ev)->workers_started();
    auto forked0 = (*ev)->workers_forked();
    const auto bytes0 = env::device_bytes_time();
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < concurrency; ++c)
      threads.emplace_back([&] {
        for (size_t i; (i = next++) < queue.size();) {
          note("E " + std::to_string(now_ns()) + " " + std::to_string(thread_key()) + " begin " + queue[i].target.name);
          auto v = (*ev)->evaluate(queue[i]);
          note("E " + std::to_string(now_ns()) + " " + std::to_string(thread_key()) + " end " + env::to_string(v.status));
          if (v.status == env::verdict_status::ok) {
            ++ok;
            std::lock_guard guard{speedups_mtx};
            speedups[queue[i].target.name].push_back(v.speedup);
          } else
            std::fprintf(stderr, "%s: %s %s\n", queue[i].target.name.c_str(), env::to_string(v.status), v.message.c_str());
        }
      });
    for (auto& t : threads)
      t.join();
    const auto end_ns = now_ns();
    if (record && !timeline.empty()) {
      std::lock_guard guard{timeline_mtx};
      recording = false;
      (*ev)->record_gate(false);
      std::ofstream out(timeline);
      out << "# " << label << ", concurrency " << concurrency << ", " << queue.size() << " candidates\n";
      out << "S " << std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count() << "\n";
      for (const auto& line : timeline_lines)
        out << line << "\n";
      for (const auto& e : (*ev)->take_gate_events())
        out << "G " << e.ns << " " << e.thread << " " << static_cast<char>(e.kind) << "\n";
      out << "F " << end_ns << "\n";
      if (!out)
        std::fprintf(stderr, "cannot write the timeline to %s\n", timeline.c_str());
    }
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double timing = (*ev)->timing_seconds() - timing0;
    double held = (*ev)->device_seconds() - device0;
    double init = (*ev)->init_seconds() - init0;
    double init_held = (*ev)->init_held_seconds() - init_held0;
    double drain = (*ev)->drain_seconds() - drain0;
    double measure_wait = (*ev)->measure_wait_seconds() - measure_wait0;
    double beside = (*ev)->beside_seconds() - beside0;
    double untimed_beside = (*ev)->untimed_beside_seconds() - untimed_beside0;
    double calls = (*ev)->timed_call_seconds() - calls0;
    // Timing's share leaves out the measured rounds' waits for starting workers and untimed work
    // to finish (evaluator.starts_beside_warmup, untimed_beside_warmup): the device is not timing then.
    std::printf("%s: %zu verdicts (%d ok) in %.1f s on %s: %.1f verdicts/min; timed rounds %.1f%% of wall "
                "(inside the timed calls %.1f%%; warm-up beside starting workers %.1f%%, beside untimed work %.1f%%; "
                "measured rounds waiting for them %.1f%%, not counted), a timing waiting for untimed work to finish %.1f%%, device in use "
                "%.1f%% of wall; worker device initialisation %.1f%% of wall summed over workers, %.1f%% of wall "
                "holding the device (evaluator.init_hold %s); untimed work %s (at most %d at once); %llu workers, "
                "%llu forked (concurrency %d, warm workers %lld, refill %s)\n",
                label, queue.size(), ok.load(), wall, (*ev)->hardware().c_str(), 60.0 * static_cast<double>(queue.size()) / wall,
                100 * (timing - measure_wait) / wall, 100 * calls / wall, 100 * beside / wall, 100 * untimed_beside / wall,
                100 * measure_wait / wall,
                100 * drain / wall, 100 * held / wall, 100 * init / wall,
                100 * init_held / wall, to_string(opt.init_hold),
                opt.share_untimed ? "shared" : "one at a time", (*ev)->max_untimed_users(),
                static_cast<unsigned long long>((*ev)->workers_started() - started0),
                static_cast<unsigned long long>((*ev)->workers_forked() - forked0), concurrency,
                static_cast<long long>(opt.warm_workers), to_string(opt.refill));
    // The evaluator's own device-output calls (outputs on the device): milliseconds per verdict
    // summed over its threads, and the mean of one call.
    if (const auto b1 = env::device_bytes_time(); b1.opens + b1.allocs > bytes0.opens + bytes0.allocs) {
      const double n = static_cast<double>(queue.size());
      auto part = [&](const char* what, std::uint64_t ns1, std::uint64_t ns0, std::uint64_t c1, std::uint64_t c0) {
        const double ms = static_cast<double>(ns1 - ns0) * 1e-6;
        std::printf("%s %.1f ms/verdict (%.2f ms a call, %llu calls)", what, ms / n,
                    c1 > c0 ? ms / static_cast<double>(c1 - c0) : 0.0, static_cast<unsigned long long>(c1 - c0));
      };
      std::printf("  evaluator's device-output calls: ");
      part("mapping", b1.open_ns, bytes0.open_ns, b1.opens, bytes0.opens);
      part(", unmapping", b1.close_ns, bytes0.close_ns, b1.closes, bytes0.closes);
      part(", allocating", b1.alloc_ns, bytes0.alloc_ns, b1.allocs, bytes0.allocs);
      part(", copying", b1.copy_ns, bytes0.copy_ns, b1.copies, bytes0.copies);
      part(", comparing", b1.compare_ns, bytes0.compare_ns, b1.compares, bytes0.compares);
      std::printf("\n");
    }
    // Precision under this load: each task's verdicts, max/min - 1 as in eval_precision.py.
    for (auto& [task, xs] : speedups) {
      auto [lo, hi] = std::minmax_element(xs.begin(), xs.end());
      std::printf("  %s: %zu verdicts, %.2f-%.2fx, spread %.2f%%\n", task.c_str(), xs.size(), *lo, *hi, 100 * (*hi / *lo - 1));
    }
    std::fflush(stdout);
  };
  run_pass("warm-up (builds extensions)", false);
  run_pass("measured", true);
  return 0;
}
