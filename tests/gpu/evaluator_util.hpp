// What the GPU evaluator tests share: an evaluator on cuda:0 with short timing, and the check that
// a candidate's fault stays its own (test_gpu_evaluator without MPS, test_gpu_mps under it).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "core/log.hpp"
#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "tests/test_util/read_text.hpp"

namespace crucible::testing {

inline const std::filesystem::path& gpu_source_dir() {
  static const std::filesystem::path dir{CRUCIBLE_SOURCE_DIR};
  return dir;
}

// An evaluator on cuda:0 with short timing (10 rounds), across the trust boundary as every
// verdict is; its build service's cache in `extensions_dir` where given. (No
// REQUIRE_MESSAGE(x.ok(), x.error()...): with -s doctest renders the message on success too.)
// `adjust`, where given, changes the options last (concurrency, timeouts, MPS).
inline std::unique_ptr<env::device_evaluator> short_evaluator(logger& log, const std::filesystem::path& extensions_dir = {},
                                                              const std::function<void(evaluator_options&)>& adjust = {}) {
  evaluator_options opt;
  opt.devices = {"cuda:0"};
  opt.cuda_mps = cuda_mps_mode::off;  // MPS starts once a process: test_gpu_mps turns it on
  if (!extensions_dir.empty())
    opt.extensions_dir = extensions_dir.string();
  opt.rounds = 10;
  opt.max_rounds = 10;
  opt.warmup_ms = 20;
  if (adjust)
    adjust(opt);
  auto where = env::locate_harness(opt);
  if (!where)
    FAIL(where.error().message);
  auto ev = env::device_evaluator::create(opt, reward_options{}, *where, "cuda:0", log, nullptr);
  if (!ev)
    FAIL(ev.error().message);
  return std::move(*ev);
}

// Each fault candidate of tests/candidates/gpu/faults (an illegal address, a kernel that never
// ends, one left running) judged while a legitimate candidate is judged beside it on the same
// device (the evaluator's concurrency 2 or more): the fault gets its own verdict (runtime_error or
// timeout, never ok), the other verdict is ok, and a verdict after them all is ok (the evaluator,
// the reference's workers and the device go on).
inline void check_faults_stay_their_own(env::device_evaluator& ev) {
  namespace fs = std::filesystem;
  using env::eval_request;
  using env::verdict_status;
  const auto& src = gpu_source_dir();
  auto task = env::load_task(src / "env" / "tasks" / "cpu" / "01_relu_scale.py");
  REQUIRE(task.ok());
  const auto legit = read_text(src / "env" / "tasks" / "cpu" / "variants" / "01_relu_scale" / "fast_inplace.py");
  std::vector<fs::path> faults;
  for (const auto& e : fs::directory_iterator(src / "tests" / "candidates" / "gpu" / "faults"))
    if (e.path().extension() == ".py")
      faults.push_back(e.path());
  std::sort(faults.begin(), faults.end());
  REQUIRE(faults.size() >= 3);
  for (const auto& path : faults) {
    auto beside = std::async(std::launch::async, [&] { return ev.evaluate(eval_request{*task, legit, 0, false}); });
    auto v = ev.evaluate(eval_request{*task, read_text(path), 0, false});
    auto other = beside.get();
    const auto name = path.filename().string();
    INFO(name << ": " << std::string{to_string(v.status)} << " " << v.message);
    INFO("beside it: " << std::string{to_string(other.status)} << " " << other.message);
    MESSAGE(name << ": " << std::string{to_string(v.status)} << " (" << v.message.substr(0, 160) << "); beside it " << std::string{to_string(other.status)});
    CHECK((v.status == verdict_status::runtime_error || v.status == verdict_status::timeout));
    CHECK(other.status == verdict_status::ok);
  }
  auto after = ev.evaluate(eval_request{*task, legit, 0, false});
  INFO(to_string(after.status) << " " << after.message);
  CHECK(after.status == verdict_status::ok);
}

} // namespace crucible::testing
