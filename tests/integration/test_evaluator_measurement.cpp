// The evaluator's measurement on the CPU, with real sandboxed workers: rechecks and early stops,
// input placements, quiet garbage collection, work beside warm-up, the device held at a worker's
// start and exit, the pool's refill, and evaluators of several devices started together.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "tests/integration/cpu_evaluator.hpp"
#include "tests/test_util/read_text.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace crucible::env;
using namespace crucible::testing::cpu_eval;
using crucible::testing::read_text;

TEST_CASE("a speedup above recheck_above is measured again with recheck_rounds, and both measurements make the verdict") {
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  evaluator_options opt;
  opt.warm_workers = 0;
  opt.flush_bytes = 16ull << 20;
  opt.min_rounds = 10;
  opt.rounds = 10;
  opt.max_rounds = 10;         // the first measurement is 10 rounds, never extended
  opt.recheck_above = 0.01;    // every ok verdict is rechecked
  opt.recheck_rounds = 5;
  opt.recheck_tolerance = 0.5; // ordinary noise cannot make the two disagree
  auto v = cpu_evaluator{opt}.run(*t, cand);
  INFO(describe(v));
  REQUIRE(v.status == verdict_status::ok);
  CHECK(v.rounds == 15); // the first measurement's 10 rounds and the recheck's 5, together
  CHECK(v.message.find("15 paired rounds") != std::string::npos);
}

TEST_CASE("across the boundary the calls a sample follow the faster side, the slower side's sample kept within 50 sample_ms") {
  // 13_sort_range's fast_amax_amin is 30-80x its reference on the CPU: taken from the slower side
  // (the reference's sort, milliseconds a call) its samples held one call each, where the shared
  // path's held many, and its speedup came out at about half the shared path's.
  auto root = source_dir / "env" / "tasks" / "cpu";
  auto t = load_task(root / "13_sort_range.py");
  REQUIRE(t.ok());
  evaluator_options opt;
  opt.warm_workers = 0;
  opt.flush_bytes = 16ull << 20;
  opt.min_rounds = opt.rounds = opt.max_rounds = 10;
  opt.sample_ms = 5; // a margin: the candidate's call would have to take 5 ms for a sample of one
  auto v = cpu_evaluator{opt}.run(*t, root / "variants" / "13_sort_range" / "fast_amax_amin.py");
  INFO(describe(v));
  REQUIRE(v.status == verdict_status::ok);
  std::smatch m;
  REQUIRE(std::regex_search(v.message, m, std::regex{R"(of (\d+) calls)"}));
  const auto calls = std::stoll(m[1].str());
  CHECK(calls >= 2);
  CHECK(static_cast<double>(calls) * v.ref_ms <= 1.5 * 50 * opt.sample_ms); // the reference's sample
}

TEST_CASE("a measurement stops at min_rounds when its band is tight, and goes on to rounds otherwise") {
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  auto rounds_with = [&](double early_stop_spread) {
    evaluator_options opt;
    opt.warm_workers = 0;
    opt.flush_bytes = 16ull << 20;
    opt.min_rounds = 10;
    opt.rounds = 20;
    opt.max_rounds = 20;                 // no extension: the count shows the early stop alone
    opt.recheck_above = 1e9;             // and no recheck
    opt.max_bucket_disagreement = 1e9;   // a busy CI machine's drift must not decide it
    opt.early_stop_spread = early_stop_spread;
    auto v = cpu_evaluator{opt}.run(*t, cand);
    INFO(describe(v));
    REQUIRE(v.status == verdict_status::ok);
    return v.rounds;
  };
  CHECK(rounds_with(1e9) == 10);  // any band is tight enough: stops at min_rounds
  CHECK(rounds_with(1e-12) == 20); // none is: the first 10 rounds, then 10 more without warm-up
  CHECK(rounds_with(0) == 20);     // early stops off: one request of 20
}

namespace {
// The suite's options with exactly 20 measured rounds and no recheck.
evaluator_options twenty_rounds(std::int64_t warm) {
  evaluator_options opt = cpu_evaluator::suite_options(warm);
  opt.rounds = opt.min_rounds = opt.max_rounds = 20;
  opt.recheck_above = 1e9;
  return opt;
}

// One verdict, required ok, from a CPU evaluator of its own with `opt` whose debug log goes to
// `log_path`; returns the verdict and the log's text (the worker's host-time line among it).
std::pair<verdict, std::string> logged_verdict(const evaluator_options& opt, const task& t, const std::string& candidate,
                                               const fs::path& log_path) {
  system_clock clk;
  logger log{clk, log_level::warn};
  REQUIRE(log.open_file(log_path, log_level::debug).ok());
  auto where = locate_harness(opt);
  REQUIRE(where.ok());
  auto ev = device_evaluator::create(opt, reward_options{}, *where, "cpu", log, nullptr);
  REQUIRE(ev.ok());
  auto v = (*ev)->evaluate(eval_request{t, candidate, 0, false});
  INFO(describe(v));
  REQUIRE(v.status == verdict_status::ok);
  auto text = read_text(log_path);
  fs::remove(log_path);
  return {std::move(v), std::move(text)};
}
} // namespace

TEST_CASE("timing rounds put their inputs at many placements unless placement_jitter_bytes is 0") {
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  // The candidate's worker reports, in its host-time log line, how many distinct addresses the
  // first input of its samples' first calls had over the verdict's rounds (executor.py,
  // make_buffers; the reference's worker places its buffers alike and reports no laps).
  auto placements = [&](std::uint64_t jitter) {
    auto log_path = fs::temp_directory_path() / ("crucible-placement-" + std::to_string(::getpid()) + "-"
                                                 + std::to_string(jitter) + ".log");
    evaluator_options opt = twenty_rounds(0);
    opt.placement_jitter_bytes = jitter;
    auto [v, text] = logged_verdict(opt, *t, read_text(cand), log_path);
    std::smatch m;
    static const std::regex re{"timing: distinct input addresses ([0-9]+)"};
    REQUIRE_MESSAGE(std::regex_search(text, m, re), text);
    return std::make_pair(std::stoi(m[1].str()), v.rounds);
  };
  auto [on, rounds] = placements(64ull << 20);
  auto [off, rounds_off] = placements(0);
  INFO("with jitter " << on << " addresses in " << rounds << " measured rounds; without " << off);
  CHECK(on >= rounds * 9 / 10); // a random lead each round: a repeat is rare
  CHECK(on > off);
}

TEST_CASE("the measured rounds play both orders alike: the candidate's sample first in half of them") {
  // Each two measured rounds take a random order and its other (boundary.cpp, split_round): a
  // sample that is faster or slower for coming second weighs on both sides alike. Drawn per round,
  // 20 rounds would split 10-10 in about one verdict of six.
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  auto log_path = fs::temp_directory_path() / ("crucible-order-" + std::to_string(::getpid()) + ".log");
  auto [v, text] = logged_verdict(twenty_rounds(0), *t, read_text(cand), log_path);
  std::smatch m;
  static const std::regex re{"the candidate's sample first in ([0-9]+) of ([0-9]+) measured rounds"};
  REQUIRE_MESSAGE(std::regex_search(text, m, re), text);
  CHECK(std::stoi(m[2].str()) == 20);
  CHECK(v.rounds == 20);
  CHECK(std::stoi(m[1].str()) == 10);
}

TEST_CASE("no cyclic garbage collection runs while a worker times, with quiet_gc or without") {
  // A correct candidate whose forward leaves cyclic garbage behind (lists that hold themselves):
  // enough allocations in 20 rounds for the collector to run when it may.
  auto dir = fs::temp_directory_path() / ("crucible-quiet-gc-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto cand = dir / "cycles.py";
  {
    std::ofstream f{cand};
    f << "import torch\nimport torch.nn as nn\n\n\n"
         "class ModelNew(nn.Module):\n"
         "    def __init__(self):\n        super().__init__()\n\n"
         "    def forward(self, a, B):\n"
         "        for _ in range(3000):\n            c = []\n            c.append(c)\n"
         "        return a.unsqueeze(1) * B\n";
  }
  auto t = load_task(source_dir / "env" / "tasks" / "cpu" / "09_diag_matmul.py");
  REQUIRE(t.ok());
  auto collections_while_timing = [&](bool quiet) {
    auto log_path = dir / (std::string{"quiet-"} + (quiet ? "on" : "off") + ".log");
    evaluator_options opt = twenty_rounds(0);
    opt.quiet_gc = quiet;
    auto text = logged_verdict(opt, *t, read_text(cand), log_path).second;
    // The candidate worker's host-time line names every collection; those while it answers the
    // timing commands apart (executor.py, executor_loop: the collector is off there, in both
    // workers).
    REQUIRE_MESSAGE(text.find("worker host ms") != std::string::npos, text);
    REQUIRE_MESSAGE(text.find("gc: generation 0 collections") != std::string::npos, text);
    std::smatch m;
    static const std::regex re{"gc: collections while timing ([0-9]+)"};
    return std::regex_search(text, m, re) ? std::stoi(m[1].str()) : 0;
  };
  const int quiet = collections_while_timing(true), loud = collections_while_timing(false);
  fs::remove_all(dir);
  INFO("collections while timing: " << quiet << " with quiet_gc, " << loud << " without");
  CHECK(quiet == 0);
  CHECK(loud == 0);
}

TEST_CASE("starts beside warm-up: the worker announces its warm-up's end, or never when nothing may be beside it") {
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  for (bool beside : {true, false}) {
    CAPTURE(beside);
    evaluator_options opt = twenty_rounds(1); // a warm worker starts beside the verdict
    opt.starts_beside_warmup = beside;
    opt.untimed_beside_warmup = beside;
    cpu_evaluator ev{opt};
    auto v = ev.run(*t, cand);
    INFO(describe(v));
    CHECK(v.status == verdict_status::ok);
    CHECK(v.rounds == 20);
    if (!beside) {
      CHECK(ev.ev->measure_wait_seconds() == 0);
      CHECK(ev.ev->beside_seconds() == 0);
    }
  }
}

TEST_CASE("untimed work beside warm-up: evaluations in flight together each get their own verdict") {
  // Three evaluations at once, so that one's references and trials may run beside another's
  // warm-up: the verdicts are those each candidate gets alone; with the setting off nothing
  // untimed shares a timing.
  auto root = source_dir / "env" / "tasks" / "cpu";
  auto t = load_task(root / "09_diag_matmul.py");
  REQUIRE(t.ok());
  const std::vector<std::pair<fs::path, verdict_status>> cands{
      {root / "variants" / "09_diag_matmul" / "fast_broadcast.py", verdict_status::ok},
      {root / "variants" / "09_diag_matmul" / "wrong_abs_scale.py", verdict_status::incorrect},
      {source_dir / "tests" / "candidates" / "legit_algebra.py", verdict_status::ok}};
  for (bool beside : {true, false}) {
    CAPTURE(beside);
    evaluator_options opt = twenty_rounds(2);
    opt.untimed_beside_warmup = beside;
    cpu_evaluator ev{opt};
    std::vector<verdict> got(cands.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < cands.size(); ++i)
      threads.emplace_back([&, i] { got[i] = ev.run(*t, cands[i].first); });
    for (auto& th : threads)
      th.join();
    for (size_t i = 0; i < cands.size(); ++i) {
      CAPTURE(cands[i].first.filename().string());
      INFO(describe(got[i]));
      CHECK(got[i].status == cands[i].second);
      if (cands[i].second == verdict_status::ok) {
        CHECK(got[i].speedup > 1.0);
        CHECK(got[i].rounds >= 20);
      }
    }
    if (!beside)
      CHECK(ev.ev->untimed_beside_seconds() == 0);
  }
}

TEST_CASE("a finished worker's exit holds the device as untimed work with teardown_hold") {
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  evaluator_options opt = twenty_rounds(0);
  opt.teardown_hold = true;
  cpu_evaluator ev{opt};
  ev.ev->record_gate(true);
  auto v = ev.run(*t, cand);
  INFO(describe(v));
  CHECK(v.status == verdict_status::ok);
  // The evaluating thread (this one) and the retire thread enter as untimed users; the worker's
  // start entered as a start. Wait (without sleeping) for the retire thread's hold to show.
  const auto me = std::hash<std::thread::id>{}(std::this_thread::get_id());
  using E = device_gate::event;
  bool other_untimed = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!other_untimed && std::chrono::steady_clock::now() < deadline) {
    for (const auto& e : ev.ev->take_gate_events())
      other_untimed |= e.kind == E::untimed_leave && e.thread != me;
    std::this_thread::yield();
  }
  CHECK(other_untimed);
}

TEST_CASE("a worker initialises in three steps and holds the device only during those init_hold names") {
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  for (auto hold : {device_init_hold::context, device_init_hold::all, device_init_hold::none}) {
    CAPTURE(to_string(hold));
    evaluator_options opt = twenty_rounds(0); // one worker, started for the verdict
    opt.init_hold = hold;
    cpu_evaluator ev{opt};
    auto v = ev.run(*t, cand);
    INFO(describe(v));
    CHECK(v.status == verdict_status::ok);
    REQUIRE(ev.ev->workers_started() == 2); // the reference's and the candidate's
    const double init = ev.ev->init_seconds(), held = ev.ev->init_held_seconds();
    INFO("initialisation " << init << " s, " << held << " s of it holding the device");
    CHECK(init > 0);
    if (hold == device_init_hold::none)
      CHECK(held == 0);
    else if (hold == device_init_hold::context)
      CHECK((held > 0 && held < init)); // the driver's start and the profiler's first use are outside
    else
      CHECK(held >= init); // held from before the first step to after the last
  }
}

TEST_CASE("refill when-idle: no worker starts while an evaluation is in flight, unless the pool is empty") {
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  // Three warm workers: a verdict takes two (the reference's and the candidate's), one stays.
  evaluator_options opt = twenty_rounds(3);
  opt.refill = worker_refill::when_idle;
  cpu_evaluator ev{opt};
  REQUIRE(ev.ev->wait_warm(120));
  REQUIRE(ev.ev->workers_started() == 3);
  // The workers started, as each phase of a verdict begins.
  std::mutex mtx;
  std::vector<std::uint64_t> seen;
  ev.ev->set_phase_observer([&](const char*, pid_t) {
    std::lock_guard guard{mtx};
    seen.push_back(ev.ev->workers_started());
  });
  for (std::uint64_t round : {1, 2}) {
    CAPTURE(round);
    auto v = ev.run(*t, cand);
    INFO(describe(v));
    CHECK(v.status == verdict_status::ok);
    {
      std::lock_guard guard{mtx};
      REQUIRE(!seen.empty());
      for (auto n : seen)
        CHECK(n == 2 * round + 1); // one worker left in the pool: the replacements wait for the verdict's end
      seen.clear();
    }
    CHECK(ev.ev->wait_warm(120)); // ... and then starts
    CHECK(ev.ev->workers_started() == 2 * round + 3);
  }
  // Two at once take four workers from a pool of three: the empty pool gets a start while they
  // run (the refill's, or a verdict's own where it finds none), never more than two, and the
  // rest once they are done.
  std::vector<verdict> got(2);
  std::thread other{[&] { got[1] = ev.run(*t, cand); }};
  got[0] = ev.run(*t, cand);
  other.join();
  for (const auto& v : got) {
    INFO(describe(v));
    CHECK(v.status == verdict_status::ok);
  }
  {
    std::lock_guard guard{mtx};
    REQUIRE(!seen.empty());
    for (auto n : seen)
      CHECK(n <= 9);
  }
  CHECK(ev.ev->wait_warm(120));
  CHECK(ev.ev->workers_started() == 11);
}

TEST_CASE("the evaluators of several devices start together, and a device whose workers cannot start is named") {
  system_clock clk;
  logger log{clk, log_level::warn};
  // warm_workers 0: each device still starts one worker, the one that names its hardware.
  auto opt = cpu_evaluator::suite_options(0);
  auto made = make_device_evaluators(opt, reward_options{}, {"cpu", "cpu"}, log, verdict_cache_use::none);
  REQUIRE_MESSAGE(made.ok(), made.error().message);
  REQUIRE(made->size() == 2);
  for (const auto& ev : *made) {
    CHECK(!ev->hardware().empty());
    CHECK(ev->workers_started() == 1);
    CHECK(ev->warm_now() == 1);
  }
  // An interpreter that cannot run the harness: every warm start fails, and the error comes back
  // naming the device, after each of the pool's starts has failed (not a hang, not a crash).
  const auto dir = fs::temp_directory_path() / ("crucible_test_start_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto python = dir / "python3";
  {
    std::ofstream f{python};
    f << "#!/bin/sh\necho 'this interpreter runs nothing' >&2\nexit 3\n";
  }
  fs::permissions(python, fs::perms::owner_all);
  auto broken = cpu_evaluator::suite_options(3);
  broken.python = python.string();
  broken.start_timeout_s = 30;
  auto refused = make_device_evaluators(broken, reward_options{}, {"cpu", "cpu"}, log, verdict_cache_use::none);
  fs::remove_all(dir);
  REQUIRE_FALSE(refused.ok());
  INFO(refused.error().message);
  CHECK(refused.error().message.rfind("cpu: ", 0) == 0);
}
