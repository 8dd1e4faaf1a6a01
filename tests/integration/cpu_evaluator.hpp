// tests/integration/cpu_evaluator.hpp: what the CPU evaluator tests (test_evaluator*.cpp) share: an
// evaluator on the CPU with the test suite's settings, a verdict described for messages, and a
// candidate's expected verdict read from its header.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "core/log.hpp"
#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "tests/test_util/candidate_expectation.hpp"
#include "tests/test_util/read_text.hpp"

namespace crucible::testing::cpu_eval {

namespace fs = std::filesystem;

inline const fs::path source_dir{CRUCIBLE_SOURCE_DIR};

// One evaluator per test case, on the CPU, with the test-suite's settings.
struct cpu_evaluator {
  system_clock clk;
  logger log{clk, log_level::warn};
  std::unique_ptr<env::device_evaluator> ev;

  explicit cpu_evaluator(std::int64_t warm = 1, std::shared_ptr<env::verdict_cache> cache = nullptr)
      : cpu_evaluator(suite_options(warm), std::move(cache)) {}

  // An evaluator with options of the test's own (a 16 MiB cache flush is the least a CPU test uses).
  explicit cpu_evaluator(const evaluator_options& opt, std::shared_ptr<env::verdict_cache> cache = nullptr) {
    // The messages are read only on failure: doctest's -s evaluates them on success too.
    auto where = env::locate_harness(opt);
    REQUIRE_MESSAGE(where.ok(), (where.ok() ? std::string{} : where.error().message));
    auto created = env::device_evaluator::create(opt, reward_options{}, *where, "cpu", log, std::move(cache));
    REQUIRE_MESSAGE(created.ok(), (created.ok() ? std::string{} : created.error().message));
    ev = std::move(*created);
  }

  static evaluator_options suite_options(std::int64_t warm) {
    evaluator_options opt;
    opt.warm_workers = warm;
    opt.flush_bytes = 16ull << 20;
    opt.rounds = 20; // CI's two cores: fewer rounds, still five buckets of four
    opt.max_rounds = 60;
    opt.run_timeout_s = 30; // the infinite loop is declared a timeout after 30 s, not 300
    // CI runs two tests at a time on two cores: another test's load that falls in a verdict's
    // rounds and not in the reference's samples alone made the reference 28-77% "slower" and
    // refused legitimate verdicts (docs/evaluator.md, Not covered yet). The check's own test
    // (tests/tasks/slow_then_fast.py) slows the reference far beyond this band.
    opt.reference_band = 1.0;
    return opt;
  }

  env::verdict run(const env::task& t, const fs::path& candidate, bool use_cache = false) {
    return ev->evaluate(env::eval_request{t, read_text(candidate), 0, use_cache});
  }
};

inline std::string describe(const env::verdict& v) {
  return std::string{to_string(v.status)} + " speedup=" + std::to_string(v.speedup) + " wall="
         + std::to_string(v.wall_s) + "s rounds=" + std::to_string(v.rounds) + " checks="
         + (v.checks_failed.empty() ? "-" : v.checks_failed.front()) + " message=" + v.message;
}

inline expectation read_expectation(const fs::path& candidate) {
  return crucible::testing::read_expectation(candidate, source_dir);
}

} // namespace crucible::testing::cpu_eval
