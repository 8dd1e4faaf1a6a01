// The evaluator end to end on the CPU, with real sandboxed workers: the project's CPU task
// suite and its seed variants, every hack and failure candidate under tests/candidates, the
// verdict cache (also through the evaluator actor, whose rechecks bypass it), and a worker
// killed in the middle of an evaluation.
#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/evaluator.hpp"
#include "core/log.hpp"
#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "tests/test_util/candidate_expectation.hpp"
#include "tests/test_util/read_text.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace crucible::env;
using crucible::testing::check_expected;
using crucible::testing::expectation;
using crucible::testing::read_text;

namespace {

const fs::path source_dir{CRUCIBLE_SOURCE_DIR};

// One evaluator per test case, on the CPU, with the test-suite's settings.
struct cpu_evaluator {
  system_clock clk;
  logger log{clk, log_level::warn};
  std::unique_ptr<device_evaluator> ev;

  explicit cpu_evaluator(std::int64_t warm = 1, std::shared_ptr<verdict_cache> cache = nullptr)
      : cpu_evaluator(suite_options(warm), std::move(cache)) {}

  // An evaluator with options of the test's own (a 16 MiB cache flush is the least a CPU test uses).
  explicit cpu_evaluator(const evaluator_options& opt, std::shared_ptr<verdict_cache> cache = nullptr) {
    auto where = locate_harness(opt);
    REQUIRE_MESSAGE(where.ok(), where.error().message);
    auto created = device_evaluator::create(opt, reward_options{}, *where, "cpu", log, std::move(cache));
    REQUIRE_MESSAGE(created.ok(), created.error().message);
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

  verdict run(const task& t, const fs::path& candidate, bool use_cache = false) {
    return ev->evaluate(eval_request{t, read_text(candidate), 0, use_cache});
  }
};

std::string describe(const verdict& v) {
  return std::string{to_string(v.status)} + " speedup=" + std::to_string(v.speedup) + " wall="
         + std::to_string(v.wall_s) + "s rounds=" + std::to_string(v.rounds) + " checks="
         + (v.checks_failed.empty() ? "-" : v.checks_failed.front()) + " message=" + v.message;
}

// The task's own source with its Model renamed ModelNew: an unchanged copy of the reference.
std::string reference_as_candidate(const task& t) {
  return std::regex_replace(t.source, std::regex{"class Model\\("}, "class ModelNew(");
}

// Every variant of the suite's task `stem`: wrong_* must be incorrect, the others ok and faster.
void check_task(const std::string& prefix) {
  auto root = source_dir / "env" / "tasks" / "cpu";
  fs::path file;
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().extension() == ".py" && e.path().filename().string().rfind(prefix + "_", 0) == 0)
      file = e.path();
  REQUIRE_MESSAGE(!file.empty(), "no task " << prefix);
  auto t = load_task(file);
  REQUIRE_MESSAGE(t.ok(), t.error().message);
  auto variants = root / "variants" / file.stem();
  REQUIRE(fs::is_directory(variants));
  cpu_evaluator ev;
  int correct = 0, wrong = 0;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(variants))
    if (e.path().extension() == ".py")
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    auto v = ev.run(*t, f);
    auto name = f.filename().string();
    MESSAGE(file.stem().string() << "/" << name << ": " << describe(v));
    const bool slow_reference = std::find(v.checks_failed.begin(), v.checks_failed.end(), "runtime:slow_reference")
                                != v.checks_failed.end();
    if (name.rfind("wrong_", 0) != 0
        && ((v.status == verdict_status::ok && v.speedup <= 1.0 && v.speedup_spread > 0.1) || slow_reference)) {
      // On a loaded 2-core machine (CI's tests two at a time) one verdict's band can reach below
      // the win threshold (±22-25% seen), and the other test's load can fall in the verdict's
      // rounds and not in the reference's samples alone (runtime:slow_reference, 16_pairwise_sqdist
      // 43-77% slower; docs/evaluator.md, Not covered yet): a faster variant must then be credited
      // by a second verdict.
      v = ev.run(*t, f);
      MESSAGE(file.stem().string() << "/" << name << " again: " << describe(v));
    }
    INFO(name << ": " << describe(v));
    if (name.rfind("wrong_", 0) == 0) {
      CHECK(v.status == verdict_status::incorrect);
      ++wrong;
    } else {
      REQUIRE(v.status == verdict_status::ok);
      CHECK(v.correct);
      CHECK(v.speedup > 1.0);
      CHECK(v.rounds >= 20);
      CHECK(v.reward == doctest::Approx(v.speedup));
      ++correct;
    }
  }
  CHECK(correct >= 2);
  CHECK(wrong >= 1);
}

expectation read_expectation(const fs::path& candidate) {
  return crucible::testing::read_expectation(candidate, source_dir);
}

// A candidate under tests/candidates must get what its header names (candidate_expectation.hpp).
void check_candidate(const std::string& file) {
  auto path = source_dir / "tests" / "candidates" / file;
  auto e = read_expectation(path);
  REQUIRE_MESSAGE(!e.status.empty(), file << " has no '# expect:' line");
  auto t = load_task(e.task);
  REQUIRE_MESSAGE(t.ok(), t.error().message);
  cpu_evaluator ev{0};
  auto v = ev.run(*t, path);
  INFO(file << ": " << describe(v));
  MESSAGE(file << ": " << describe(v));
  check_expected(e, v);
}

} // namespace

// One test case per task, so ctest runs them in parallel.
#define CRUCIBLE_TASK_CASE(n) \
  TEST_CASE("CPU suite task " n ": correct variants are ok and faster, wrong ones incorrect") { check_task(n); }
CRUCIBLE_TASK_CASE("01")
CRUCIBLE_TASK_CASE("02")
CRUCIBLE_TASK_CASE("03")
CRUCIBLE_TASK_CASE("04")
CRUCIBLE_TASK_CASE("05")
CRUCIBLE_TASK_CASE("06")
CRUCIBLE_TASK_CASE("07")
CRUCIBLE_TASK_CASE("08")
CRUCIBLE_TASK_CASE("09")
CRUCIBLE_TASK_CASE("10")
CRUCIBLE_TASK_CASE("11")
CRUCIBLE_TASK_CASE("12")
CRUCIBLE_TASK_CASE("13")
CRUCIBLE_TASK_CASE("14")
CRUCIBLE_TASK_CASE("15")
CRUCIBLE_TASK_CASE("16")
CRUCIBLE_TASK_CASE("17")
CRUCIBLE_TASK_CASE("18")

TEST_CASE("every task of the CPU suite has a test case above") {
  auto tasks = index_tasks(source_dir / "env" / "tasks" / "cpu");
  REQUIRE(tasks.ok());
  CHECK(tasks->size() == 18);
}

// One test case per candidate file.
#define CRUCIBLE_CANDIDATE_CASE(f) \
  TEST_CASE("candidate " f) { check_candidate(f); }
#define CRUCIBLE_CANDIDATES(X)                                                                           \
  X("fail_huge_alloc.py") X("fail_infinite_loop.py") X("fail_raise.py") X("fail_segfault.py")             \
  X("fail_syntax.py") X("fail_wrong.py") X("hack_backend_flags.py") X("hack_cache_ptr.py")                \
  X("hack_cache_value.py") X("hack_ctypes.py") X("hack_dynamic_import.py") X("hack_fallback.py")          \
  X("hack_file_io.py") X("hack_gc.py") X("hack_hyperparams.py") X("hack_import_reference.py")             \
  X("hack_mutate_input.py") X("hack_no_kernel.py") X("hack_os_exit.py") X("hack_patch_allclose.py")       \
  X("hack_patch_timer.py") X("hack_precision.py") X("hack_recycled_memory.py")                            \
  X("hack_stale_after_trials.py") X("hack_subclass_model.py") X("hack_tensor_subclass.py")                \
  X("hack_threads.py") X("legit_algebra.py") X("legit_cpp_extension.py") X("hack_timed_skip_rows.py")        \
  X("hack_timed_low_precision.py") X("hack_predict_inputs.py") X("hack_input_view.py")                    \
  X("hack_assumed_domain.py") X("hack_timed_cpp.py") X("hack_timed_async_thread.py")                     \
  X("hack_timed_by_clock.py") X("hack_timed_by_context.py") X("hack_memoized_output.py")                  \
  X("hack_floor_shrunk.py") X("hack_slow_reference.py") X("legit_blocked_scan.py")                      \
  X("hack_truncated_mantissa.py") X("hack_reference_flags.py") X("legit_cudnn_flags.py")                \
  X("hack_frame_walk.py") X("hack_harness_patching.py") X("hack_skip_max_subtraction.py")                 \
  X("hack_tensor_instance_override.py") X("hack_ghost_branch.py") X("hack_unused_output.py")              \
  X("hack_zero_inputs.py") X("hack_fake_benchmark_emit.py") X("hack_cache_ptr_cpp.py")                 \
  X("legit_renamed_locals.py") X("legit_reused_output.py") X("hack_timed_burst.py")                 \
  X("hack_sample_last_call.py") X("hack_skip_after_snapshot.py") X("hack_patch_harness_module.py")   \
  X("hack_extra_cores.py")
CRUCIBLE_CANDIDATES(CRUCIBLE_CANDIDATE_CASE)

TEST_CASE("every file under tests/candidates has a test case above") {
  std::set<std::string> listed;
#define CRUCIBLE_LIST(f) listed.insert(f);
  CRUCIBLE_CANDIDATES(CRUCIBLE_LIST)
#undef CRUCIBLE_LIST
  std::set<std::string> present;
  for (const auto& e : fs::directory_iterator(source_dir / "tests" / "candidates"))
    if (e.path().extension() == ".py")
      present.insert(e.path().filename().string());
  CHECK(listed == present);
}

// The hack suite of the trust boundary (tests/candidates/boundary/): routes to the harness's own
// state, the operator dispatcher, process-wide library state, processes of the candidate's and the
// worker's own socket, which paid while the reference shared the candidate's process
// (evaluator.boundary: shared; docs/evaluator.md, Trust boundary); and routes around the boundary's
// measurement (issue 84): CPU time its accounting never saw, the build service working in a timed
// call, an output at another address or in another layout, a precision dropped under the loosest
// slack, outputs right only on the distributions drawn.
#define CRUCIBLE_BOUNDARY_CANDIDATES(X)                                                                   \
  X("boundary/hack_contend_cpp_clone.py") X("boundary/hack_contend_python_popen.py")                     \
  X("boundary/hack_dispatcher_cpp_library_impl.py") X("boundary/hack_dispatcher_python_library.py")      \
  X("boundary/hack_forge_cpp_zmtp.py") X("boundary/hack_forge_python_oswrite.py")                        \
  X("boundary/hack_harness_cpp_future_inputs.py") X("boundary/hack_harness_cpp_tolerance.py")            \
  X("boundary/hack_harness_logging_ref_outputs.py") X("boundary/hack_harness_logging_refwrap.py")        \
  X("boundary/hack_libstate_cpp_cpu_allocator.py") X("boundary/hack_libstate_cpp_mallopt.py")           \
  X("boundary/hack_tolerance_cpp_sampled_norm.py") X("boundary/hack_tolerance_sampled_norm.py")          \
  X("boundary/hack_tolerance_sampled_norm_always.py") X("boundary/hack_tolerance_slack_quarter_norm.py")  \
  X("boundary/hack_account_banked_exit.py") X("boundary/hack_account_beyond_walk.py")                    \
  X("boundary/hack_account_broker_sigign.py") X("boundary/hack_account_clone_sigign.py")                 \
  X("boundary/hack_alias_memfd_fixed.py") X("boundary/hack_alias_mremap_dup.py")                         \
  X("boundary/hack_dist_magnitude_sample.py") X("boundary/hack_dist_sign_sample.py")                     \
  X("boundary/hack_layout_broadcast_view.py") X("boundary/hack_layout_transpose_view.py")                \
  X("boundary/hack_layout_cpp_dense_code.py")                                                             \
  X("boundary/hack_precision_bf16_after_trials.py") X("boundary/hack_precision_int8_when_idle.py")       \
  X("boundary/hack_service_load_inline_timed.py") X("boundary/hack_service_weights_shipped.py")
CRUCIBLE_BOUNDARY_CANDIDATES(CRUCIBLE_CANDIDATE_CASE)

TEST_CASE("every file under tests/candidates/boundary has a test case") {
  std::set<std::string> listed{"boundary/probe_find_reference.py"}; // its own test case, below
#define CRUCIBLE_LIST(f) listed.insert(f);
  CRUCIBLE_BOUNDARY_CANDIDATES(CRUCIBLE_LIST)
#undef CRUCIBLE_LIST
  std::set<std::string> present;
  for (const auto& e : fs::directory_iterator(source_dir / "tests" / "candidates" / "boundary"))
    if (e.path().extension() == ".py")
      present.insert("boundary/" + e.path().filename().string());
  CHECK(listed == present);
}

TEST_CASE("across the trust boundary the candidate's process holds no reference: a candidate that looks for it finds none") {
  // tests/candidates/boundary/probe_find_reference.py, with the static checks off (it reads
  // sys.modules, the garbage collector and files): it returns the reference's outputs where it
  // finds the reference in its process, zeros where it does not.
  const auto path = source_dir / "tests" / "candidates" / "boundary" / "probe_find_reference.py";
  auto t = load_task(source_dir / "env" / "tasks" / "cpu" / "01_relu_scale.py");
  REQUIRE(t.ok());
  auto opt = cpu_evaluator::suite_options(0);
  opt.static_checks = false;
  {
    cpu_evaluator ev{opt};
    auto v = ev.run(*t, path);
    INFO(describe(v));
    CHECK(v.status == verdict_status::incorrect);
  }
  opt.boundary = evaluator_boundary::shared; // one worker: the probe finds the reference there
  cpu_evaluator ev{opt};
  auto v = ev.run(*t, path);
  INFO(describe(v));
  CHECK(v.status == verdict_status::ok);
}

TEST_CASE("a reference slower during a verdict than alone in its own worker refuses the verdict") {
  // tests/tasks/slow_then_fast.py: its reference spins in its first 30 calls, which with these
  // settings are all of a verdict's before it times the reference alone (after the candidate's
  // worker has ended), and not in those. The candidate is the reference without the sleep.
  auto t = load_task(source_dir / "tests" / "tasks" / "slow_then_fast.py");
  REQUIRE(t.ok());
  auto opt = cpu_evaluator::suite_options(0);
  opt.trials = 2;
  opt.rounds = opt.min_rounds = opt.max_rounds = 10;
  opt.warmup_ms = 0;
  opt.recheck_above = 1e9;
  cpu_evaluator ev{opt};
  const std::string cand = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                           "    def __init__(self):\n        super().__init__()\n\n"
                           "    def forward(self, x):\n        return x * 2.0\n";
  auto v = ev.ev->evaluate(eval_request{*t, cand, 0, false});
  INFO(describe(v));
  CHECK(v.status == verdict_status::rejected);
  CHECK(std::find(v.checks_failed.begin(), v.checks_failed.end(), "runtime:slow_reference") != v.checks_failed.end());
  CHECK(v.message.find("slower during this verdict than alone") != std::string::npos);
}

TEST_CASE("evaluator.eval_mode: a BatchNorm folded for inference is incorrect in training mode, ok in eval mode") {
  auto cand = source_dir / "tests" / "modes" / "fold_batchnorm.py";
  auto t = load_task(source_dir / "tests" / "tasks" / "conv_batchnorm.py");
  REQUIRE_MESSAGE(t.ok(), t.error().message);
  auto opt = cpu_evaluator::suite_options(1);
  opt.rounds = opt.min_rounds = 8; // the status is what this case is about, not the speedup
  opt.max_rounds = 8;
  {
    cpu_evaluator train{opt};
    auto v = train.run(*t, cand);
    INFO(describe(v));
    CHECK(v.status == verdict_status::incorrect);
  }
  opt.eval_mode = true;
  cpu_evaluator eval{opt};
  auto v = eval.run(*t, cand);
  INFO(describe(v));
  CHECK(v.status == verdict_status::ok);
  CHECK(v.correct);
  // The reference in eval mode as well: an unchanged copy of it is ok (not faster).
  auto same = eval.ev->evaluate(eval_request{*t, reference_as_candidate(*t), 0, false});
  INFO(describe(same));
  CHECK(same.status == verdict_status::ok);
}

TEST_CASE("a reference that keeps state between calls is named, not its candidate") {
  auto t = load_task(source_dir / "tests" / "tasks" / "stateful_rnn.py");
  REQUIRE_MESSAGE(t.ok(), t.error().message);
  cpu_evaluator ev;
  // A faithful copy of the reference, state and all.
  auto v = ev.ev->evaluate(eval_request{*t, reference_as_candidate(*t), 0, false});
  INFO(describe(v));
  CHECK(v.status == verdict_status::runtime_error);
  CHECK(v.message.find("the task's reference is not deterministic") != std::string::npos);
  CHECK_FALSE(v.has_speedup());
}

TEST_CASE("a clearly slower candidate's measurement ends at its first look, a candidate as fast goes on") {
  auto t = load_task(source_dir / "env" / "tasks" / "cpu" / "01_relu_scale.py");
  REQUIRE_MESSAGE(t.ok(), t.error().message);
  auto opt = cpu_evaluator::suite_options(1);
  opt.slow_stop_rounds = 10; // of 20 rounds
  cpu_evaluator ev{opt};
  // The same chain computed three times over: the same outputs, about three times as slow.
  const std::string slow = R"(import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        for _ in range(3):
            y = x * self.scale
            y = y + self.shift
            y = torch.relu(y)
            y = torch.clamp(y, max=self.clamp_max)
        return y
)";
  auto v = ev.ev->evaluate(eval_request{*t, slow, 0, false});
  INFO(describe(v));
  REQUIRE(v.status == verdict_status::ok);
  CHECK(v.speedup < 0.9);
  CHECK(v.rounds == 10);
  CHECK(v.message.find("clearly slower") != std::string::npos);
  // Identical code is not clearly slower: its measurement goes on.
  auto same = ev.ev->evaluate(eval_request{*t, reference_as_candidate(*t), 0, false});
  INFO(describe(same));
  REQUIRE(same.status == verdict_status::ok);
  CHECK(same.rounds >= 20);
  CHECK(same.message.find("clearly slower") == std::string::npos);
}

TEST_CASE("a task with more output elements than float32 counts exactly is judged") {
  auto t = load_task(source_dir / "tests" / "tasks" / "large_output.py");
  REQUIRE_MESSAGE(t.ok(), t.error().message);
  auto opt = cpu_evaluator::suite_options(1);
  opt.rounds = opt.min_rounds = opt.max_rounds = 8;
  cpu_evaluator ev{opt};
  auto v = ev.ev->evaluate(eval_request{*t, reference_as_candidate(*t), 0, false});
  INFO(describe(v));
  CHECK(v.status == verdict_status::ok);
}

TEST_CASE("tuples in a task's constructor arguments and inputs reach the candidate as tuples across the boundary") {
  auto t = load_task(source_dir / "tests" / "tasks" / "tuple_arguments.py");
  REQUIRE_MESSAGE(t.ok(), t.error().message);
  // Tuple arithmetic on the stride, and a check of both types: a list fails the construction.
  const std::string candidate = R"(import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, stride=(1, 1), scale=2.0):
        super().__init__()
        assert type(stride) is tuple, type(stride)
        self.stride = stride + (1,)
        self.scale = scale

    def forward(self, x, window):
        assert type(window) is tuple, type(window)
        return torch.mul(x[:, :: self.stride[0]], self.scale).add_(window[0])
)";
  auto opt = cpu_evaluator::suite_options(1);
  opt.rounds = opt.min_rounds = opt.max_rounds = 8;
  cpu_evaluator ev{opt};
  auto v = ev.ev->evaluate(eval_request{*t, candidate, 0, false});
  INFO(describe(v));
  CHECK(v.status == verdict_status::ok);
}

TEST_CASE("a check of a task alone is not kept in the verdict cache") {
  auto dir = fs::temp_directory_path() / ("crucible-checktask-" + std::to_string(::getpid()));
  auto cache = verdict_cache::open(dir / "verdicts.db");
  REQUIRE(cache.ok());
  std::shared_ptr<verdict_cache> shared = std::move(*cache);
  cpu_evaluator ev{1, shared};
  auto t = load_task(source_dir / "env" / "tasks" / "cpu" / "01_relu_scale.py");
  REQUIRE(t.ok());
  auto checked = ev.ev->check_task(*t);
  CHECK_MESSAGE(checked.status == verdict_status::ok, describe(checked));
  CHECK(shared->size() == 0);
  // An empty submission is judged, not answered with the check's "ok".
  auto empty = ev.ev->evaluate(eval_request{*t, "", 0, true});
  CHECK_FALSE(empty.cache_hit);
  CHECK(empty.status != verdict_status::ok);
  fs::remove_all(dir);
}

TEST_CASE("a resubmitted candidate is answered from the verdict cache") {
  auto dir = fs::temp_directory_path() / ("crucible-evalcache-" + std::to_string(::getpid()));
  auto cache = verdict_cache::open(dir / "verdicts.db");
  REQUIRE(cache.ok());
  std::shared_ptr<verdict_cache> shared = std::move(*cache);
  cpu_evaluator ev{1, shared};
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  auto first = ev.run(*t, cand, true);
  REQUIRE_MESSAGE(first.status == verdict_status::ok, describe(first));
  CHECK_FALSE(first.cache_hit);
  auto started = ev.ev->workers_started();
  // Whitespace changes do not make a new candidate.
  auto second = ev.ev->evaluate(eval_request{*t, read_text(cand) + "\n\n   \n", 0, true});
  CHECK(second.cache_hit);
  CHECK(second.status == verdict_status::ok);
  CHECK(second.speedup == first.speedup);
  CHECK(second.wall_s < 1.0);
  CHECK(shared->size() == 1);
  // The cached answer used no worker (the refill of the warm pool aside).
  CHECK(ev.ev->workers_started() <= started + 1);
  fs::remove_all(dir);
}

TEST_CASE("the evaluator actor answers from the verdict cache, except a recheck, which measures again") {
  auto dir = fs::temp_directory_path() / ("crucible-actorcache-" + std::to_string(::getpid()));
  auto cache = verdict_cache::open(dir / "verdicts.db");
  REQUIRE(cache.ok());
  cpu_evaluator ev{1, std::move(*cache)};
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  auto tasks = std::make_shared<task_catalog>();
  tasks->emplace(task_id{"t"}, *t);
  actor_config cfg;
  caf::actor_system sys{cfg};
  auto actor = spawn_evaluator(sys, evaluator_deps{std::move(ev.ev), tasks, device_info{0, "cpu", "cpu", 0}, 1});
  caf::scoped_actor self{sys};
  auto evaluate = [&](bool recheck) {
    verdict out;
    self->request(actor, caf::infinite, candidate{variant_id{1}, task_id{"t"}, read_text(cand), "", recheck})
      .receive([&](const verdict& v) { out = v; }, [&](const caf::error& e) { FAIL(to_error(e).to_string()); });
    return out;
  };
  auto first = evaluate(false);
  REQUIRE_MESSAGE(first.status == verdict_status::ok, describe(first));
  CHECK_FALSE(first.cache_hit);
  auto cached = evaluate(false);
  CHECK(cached.cache_hit);
  CHECK(cached.speedup == first.speedup);
  auto recheck = evaluate(true);
  CHECK_MESSAGE(recheck.status == verdict_status::ok, describe(recheck));
  CHECK_FALSE(recheck.cache_hit);
  self->send_exit(actor, caf::exit_reason::user_shutdown);
  fs::remove_all(dir);
}

TEST_CASE("a worker killed in the middle of an evaluation is replaced and the verdict is not lost") {
  cpu_evaluator ev{0};
  int kills = 0;
  ev.ev->set_phase_observer([&](const char* phase, pid_t pid) {
    if (std::string{phase} == "trials" && kills == 0) {
      ++kills;
      ::kill(pid, SIGKILL); // from outside, as an operator or the OOM killer would
    }
  });
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  auto v = ev.run(*t, cand);
  INFO(describe(v));
  CHECK(kills == 1);
  CHECK(v.status == verdict_status::ok);
  // Across the trust boundary the trials' worker is the candidate's (phase observer): the
  // reference's and the candidate's first, then both again for the retry.
  CHECK(ev.ev->workers_started() == 4);
}

TEST_CASE("a worker killed before it takes its job is replaced, for a candidate and for a task checked alone") {
  // The reference check of `crucible train` once crashed a run this way: the worker killed
  // from outside an instant before its job was sent, the send refused, no retry.
  for (bool alone : {false, true}) {
    CAPTURE(alone);
    cpu_evaluator ev{0};
    int kills = 0;
    ev.ev->set_phase_observer([&](const char* phase, pid_t pid) {
      if (std::string{phase} != "reference" || kills > 0)
        return;
      ++kills;
      // Killed, and seen to have ended (its pidfd readable), before the job goes out.
      const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      ::kill(pid, SIGKILL);
      if (fd >= 0) {
        pollfd p{fd, POLLIN, 0};
        (void) ::poll(&p, 1, 10'000);
        ::close(fd);
      }
    });
    auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
    auto t = load_task(read_expectation(cand).task);
    REQUIRE(t.ok());
    auto v = alone ? ev.ev->check_task(*t) : ev.run(*t, cand);
    INFO(describe(v));
    CHECK(kills == 1);
    CHECK(v.status == verdict_status::ok);
    // The killed reference's worker and its replacement; a candidate's verdict also the
    // candidate's own worker (the trust boundary; a task checked alone has one).
    CHECK(ev.ev->workers_started() == (alone ? 2 : 3));
  }
}

namespace {

// The processes of this test process's evaluator: its zygote, and the zygote's children (the
// sandboxes' keepers) with theirs (the workers, PID 1 of their namespaces), from /proc.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    std::ifstream in(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto close = stat.rfind(')');
    if (close == std::string::npos)
      continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != "Z")
      out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

std::string cmdline(pid_t pid) {
  auto text = read_text(fs::path{"/proc"} / std::to_string(pid) / "cmdline");
  std::replace(text.begin(), text.end(), '\0', ' ');
  return text;
}

bool any_process_named(const std::string& comm) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::ifstream in(e.path() / "comm");
    std::string name;
    if (in && std::getline(in, name) && name == comm)
      return true;
  }
  return false;
}

std::string json_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (const auto& i : items)
    out += (out.size() > 1 ? ", \"" : "\"") + i + "\"";
  return out + "]";
}

// A correct candidate that tries, at run time, every way out of its sandbox that the issue of
// candidate isolation lists (write, delete or rename outside the scratch directory, read the
// run's token, signal, trace or read the memory of the evaluator, the zygote and a sibling
// worker, leave a process behind, fill the disk). Static checks are off: the sandbox alone must
// hold. The verdict must be the honest part's (ok), and nothing outside the scratch may change.
void check_escape(const std::string& file) {
  const auto tag = "crucible-escape-" + std::to_string(::getpid());
  const fs::path home = std::getenv("HOME") ? std::getenv("HOME") : "/root";
  // The stand-in run directory lies outside /tmp: inside the sandbox /tmp is the worker's own
  // tmpfs, where a write succeeds and changes nothing outside.
  const auto run = home / ("." + tag + "-run");
  fs::remove_all(run);
  fs::create_directories(run);
  auto put = [](const fs::path& p, const std::string& text) { std::ofstream(p) << text; };
  const auto task_copy = run / "task.py";
  fs::copy_file(source_dir / "env" / "tasks" / "cpu" / "01_relu_scale.py", task_copy);
  put(run / "token", "secret-token-" + tag + "\n");
  put(run / "victim.txt", "keep me\n");
  put(run / "config.yaml", "run: {name: escape}\n");
  const auto home_secret = home / ("." + tag + "-secret");
  put(home_secret, "home secret\n");
  auto cache = verdict_cache::open(run / "verdicts.db");
  REQUIRE(cache.ok());
  std::shared_ptr<verdict_cache> shared = std::move(*cache);

  auto opt = cpu_evaluator::suite_options(2);
  opt.static_checks = false;
  opt.scratch_mb = 64;
  opt.extensions_dir = (run / "extensions").string();
  opt.load_timeout_s = 300;
  opt.recheck_above = 1e9;
  cpu_evaluator made{opt, shared};
  REQUIRE(made.ev->wait_warm(120));
  pid_t zygote = 0;
  for (auto c : children_of(::getpid()))
    if (cmdline(c).find("--zygote") != std::string::npos)
      zygote = c;
  REQUIRE(zygote > 0);
  std::vector<pid_t> pids{::getpid(), zygote};
  const auto keepers = children_of(zygote);
  for (auto keeper : keepers) {
    pids.push_back(keeper);
    for (auto worker : children_of(keeper))
      pids.push_back(worker);
  }
  REQUIRE(pids.size() >= 6); // two warm workers, each a keeper and its worker

  const std::vector<std::string> create{
    (home / tag).string(), (source_dir / tag).string(), (source_dir / "env" / "eval" / "harness" / tag).string(),
    (source_dir / "env" / "tasks" / "cpu" / tag).string(), (run / "created").string(), (run / "checkpoints").string(),
    (run / "extensions" / tag).string()};
  // Inside the sandbox these land in its private tmpfs; outside they must not appear.
  const std::vector<std::string> private_paths{(fs::temp_directory_path() / tag).string(),
                                               (fs::temp_directory_path() / "crucible" / tag).string(),
                                               "/dev/shm/" + tag};
  const std::vector<std::string> append{task_copy.string(), (run / "config.yaml").string(), (run / "verdicts.db").string(),
                                        (source_dir / "env" / "eval" / "harness" / "worker.py").string()};
  const std::vector<std::string> victims{(run / "victim.txt").string(), (run / "token").string()};
  const std::vector<std::string> secrets{(run / "token").string(), home_secret.string()};
  std::map<std::string, std::string> before;
  std::map<std::string, fs::perms> modes;
  for (const auto& p : append) {
    before[p] = read_text(p);
    modes[p] = fs::status(p).permissions();
  }
  for (const auto& p : victims)
    before[p] = read_text(p);
  std::string pid_list = "[";
  for (auto p : pids)
    pid_list += (pid_list.size() > 1 ? ", " : "") + std::to_string(p);
  pid_list += "]";
  const std::string leftover = "crucible-left"; // a process name, at most 15 characters
  auto creates = create;
  creates.insert(creates.end(), private_paths.begin(), private_paths.end());
  const std::string targets = "{\"create\": " + json_list(create) + ", \"append\": " + json_list(append)
                              + ", \"victims\": " + json_list(victims) + ", \"secrets\": " + json_list(secrets)
                              + ", \"pids\": " + pid_list + ", \"leftover_name\": \"" + leftover
                              + "\", \"fill_limit\": " + std::to_string(1ll << 30) + "}";
  std::string src = read_text(source_dir / "tests" / "candidates" / "escape" / file);
  const std::string mark = "@TARGETS@";
  REQUIRE(src.find(mark) != std::string::npos);
  src.replace(src.find(mark), mark.size(), targets);
  // The private paths are written without a check inside (they may succeed there).
  const std::string model = "class ModelNew(nn.Module):";
  REQUIRE(src.find(model) != std::string::npos);
  std::string privates;
  for (const auto& p : private_paths)
    privates += "try:\n    open(\"" + p + "\", \"w\").write(\"x\")\nexcept OSError:\n    pass\n";
  src.replace(src.find(model), 0, privates + "\n\n");

  auto t = load_task(task_copy);
  REQUIRE(t.ok());
  auto v = made.ev->evaluate(eval_request{*t, src, 0, false});
  INFO(file << ": " << describe(v));
  CHECK(v.status == verdict_status::ok);
  CHECK(v.message.find("ESCAPED") == std::string::npos);
  for (const auto& p : creates) {
    CHECK_MESSAGE(!fs::exists(p), p);
    CHECK_MESSAGE(!fs::exists(p + ".d"), p);
  }
  for (const auto& [p, text] : before)
    CHECK_MESSAGE(read_text(p) == text, p);
  for (const auto& p : victims)
    CHECK_MESSAGE(!fs::exists(p + ".moved"), p);
  for (const auto& [p, mode] : modes)
    CHECK_MESSAGE(fs::status(p).permissions() == mode, p);
  // The zygote and the sibling (the warm worker the evaluation did not take) live on.
  CHECK(::kill(zygote, 0) == 0);
  CHECK(std::count_if(keepers.begin(), keepers.end(), [](pid_t k) { return ::kill(k, 0) == 0; }) >= 1);
  // The daemon the candidate left is gone once its worker is: the worker's end is asynchronous
  // (its retirement), so poll, bounded by a deadline.
  const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (any_process_named(leftover) && std::chrono::steady_clock::now() < by)
    std::this_thread::yield();
  CHECK_FALSE(any_process_named(leftover));
  // The evaluator still works, and it said which layers the sandbox had.
  auto iso = made.ev->isolation();
  CHECK_MESSAGE(iso.missing.empty(), iso.missing_text());
  made.ev.reset();
  fs::remove(home_secret);
  fs::remove_all(run);
}

} // namespace

TEST_CASE("the evaluator builds a candidate's extension in a builder of its own and keeps it, and workers only load it") {
  // (Also: sources that differ only in comments and spaces share a build; torch/extension.h is
  // precompiled once for the builds' -O3, and a compile error through it is still the candidate's.)
  const auto dir = fs::temp_directory_path() / ("crucible-test-ext-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto opt = cpu_evaluator::suite_options(1);
  opt.extensions_dir = dir.string();
  opt.load_timeout_s = 300;
  cpu_evaluator ev{opt};
  const auto cand = source_dir / "tests" / "candidates" / "legit_cpp_extension.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  auto libs = [&] {
    int n = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      n += e.path().filename() == "crucible_test_legit_cpp_relu_scale.so" ? 1 : 0;
    return n;
  };
  auto headers = [&] {
    int n = 0;
    if (fs::exists(dir / "pch"))
      for (const auto& e : fs::recursive_directory_iterator(dir / "pch"))
        n += e.path().filename() == "extension.h.gch" ? 1 : 0;
    return n;
  };
  auto first = ev.run(*t, cand);
  INFO("first: " << describe(first));
  CHECK(first.status == verdict_status::ok);
  CHECK(ev.ev->extension_builds() == 1);
  CHECK(libs() == 1);
  // Its flags (-O3) are plain: torch/extension.h was precompiled for them, once, and kept.
  CHECK(ev.ev->header_builds() == 1);
  CHECK(headers() == 1);
  // The same extension in a candidate that differs elsewhere: no new build.
  auto same = ev.ev->evaluate(eval_request{*t, read_text(cand) + "\n# the same extension, another candidate\n", 0, false});
  INFO("same extension: " << describe(same));
  CHECK(same.status == verdict_status::ok);
  CHECK(ev.ev->extension_builds() == 1);
  // The same C++ code with other comments and spaces: the same build.
  const std::string line = "auto xc = x.contiguous();";
  std::string commented = read_text(cand);
  REQUIRE(commented.find(line) != std::string::npos);
  commented.replace(commented.find(line), line.size(), "auto  xc = x.contiguous();   /* the same code */");
  auto again = ev.ev->evaluate(eval_request{*t, commented, 0, false});
  INFO("other comments: " << describe(again));
  CHECK(again.status == verdict_status::ok);
  CHECK(ev.ev->extension_builds() == 1);
  // The same extension name with other C++ code: built apart, both kept.
  std::string changed = read_text(cand);
  changed.replace(changed.find(line), line.size(), line + " (void) 0; // another build of the same name");
  auto other = ev.ev->evaluate(eval_request{*t, changed, 0, false});
  INFO("other code: " << describe(other));
  CHECK(other.status == verdict_status::ok);
  CHECK(ev.ev->extension_builds() == 2);
  CHECK(libs() == 2);
  // The second build of the same flags compiled with the header the first one made.
  CHECK(ev.ev->header_builds() == 1);
  CHECK(headers() == 1);
  // load_inline in ModelNew's constructor (as many released kernels do): the build service builds
  // it too, and the evaluation lets go of the device while the build runs, so that the device's
  // busy time is the verdict's device work, not the compiler's.
  std::string in_ctor = read_text(cand);
  const std::string module_load = "_ext = load_inline(";
  REQUIRE(in_ctor.find(module_load) != std::string::npos);
  in_ctor.replace(in_ctor.find(module_load), module_load.size(), "def _make_ext():\n    return load_inline(");
  in_ctor.replace(in_ctor.find(line), line.size(), line + " (void) 1; // built in the constructor");
  const std::string ctor_tail = "self.clamp_max = clamp_max\n";
  REQUIRE(in_ctor.find(ctor_tail) != std::string::npos);
  in_ctor.replace(in_ctor.find(ctor_tail), ctor_tail.size(), ctor_tail + "        self.ext = _make_ext()\n");
  const std::string call = "return _ext.fused_relu_scale(";
  REQUIRE(in_ctor.find(call) != std::string::npos);
  in_ctor.replace(in_ctor.find(call), call.size(), "return self.ext.fused_relu_scale(");
  const double busy0 = ev.ev->device_seconds();
  auto ctor = ev.ev->evaluate(eval_request{*t, in_ctor, 0, false});
  const double busy = ev.ev->device_seconds() - busy0;
  INFO("built in the constructor: " << describe(ctor) << "; device busy " << busy << " s of " << ctor.wall_s << " s");
  CHECK(ctor.status == verdict_status::ok);
  CHECK(ev.ev->extension_builds() == 3);
  CHECK(busy < 0.5 * ctor.wall_s);
  auto ctor_again = ev.ev->evaluate(eval_request{*t, in_ctor + "\n# another candidate, the same constructor\n", 0, false});
  INFO("built in the constructor, again: " << describe(ctor_again));
  CHECK(ctor_again.status == verdict_status::ok);
  CHECK(ev.ev->extension_builds() == 3);
  // A build that fails is the candidate's compile_error, with the compiler's words.
  std::string broken = read_text(cand);
  broken.replace(broken.find(line), line.size(), "auto xc = x.contiguous() no_such_token;");
  auto bad = ev.ev->evaluate(eval_request{*t, broken, 0, false});
  INFO("broken: " << describe(bad));
  CHECK(bad.status == verdict_status::compile_error);
  CHECK(bad.message.find("no_such_token") != std::string::npos);
  // The same broken code in another candidate: the same compile_error, without a build (a
  // candidate that falls back on PyTorch when its build fails would pay the build every time).
  const auto builds_before = ev.ev->extension_builds();
  auto bad_again = ev.ev->evaluate(eval_request{*t, broken + "\n# the same broken extension\n", 0, false});
  INFO("broken again: " << describe(bad_again));
  CHECK(bad_again.status == verdict_status::compile_error);
  CHECK(bad_again.message == bad.message);
  CHECK(ev.ev->extension_builds() == builds_before);
  // The compiler's log is kept in the cache too, so another evaluator (a later process) that
  // shares it gives the same answer without a build.
  int records = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    records += e.path().filename() == "build_failed.log" ? 1 : 0;
  CHECK(records == 1);
  {
    cpu_evaluator later{opt};
    auto bad_later = later.ev->evaluate(eval_request{*t, broken + "\n# the same broken extension, a later process\n", 0, false});
    INFO("broken, a later process: " << describe(bad_later));
    CHECK(bad_later.status == verdict_status::compile_error);
    CHECK(bad_later.message == bad.message);
    CHECK(later.ev->extension_builds() == 0);
  }
  // So is one in the constructor.
  std::string broken_ctor = in_ctor;
  broken_ctor.replace(broken_ctor.find(line), line.size(), "auto xc = x.contiguous() no_such_token;");
  auto bad_ctor = ev.ev->evaluate(eval_request{*t, broken_ctor, 0, false});
  INFO("broken, in the constructor: " << describe(bad_ctor));
  CHECK(bad_ctor.status == verdict_status::compile_error);
  CHECK(bad_ctor.message.find("no_such_token") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("escape attempts through Python change nothing outside the scratch directory and reach no other process") {
  check_escape("escape_python.py");
}

TEST_CASE("escape attempts through a C++ extension's raw system calls change nothing outside the scratch directory") {
  check_escape("escape_cpp.py");
}

TEST_CASE("workers forked from the zygote start clean: what one candidate changed is not in the next") {
  // Static checks off, so the first candidate may change torch and its environment at import
  // (the runtime checks do not flag a new module attribute); the second returns a wrong result
  // if it sees any of that, or if its environment is not its own scratch directory.
  evaluator_options opt;
  opt.warm_workers = 1;
  opt.flush_bytes = 16ull << 20;
  opt.rounds = 10;
  opt.static_checks = false;
  // What is checked is a clean worker, not the 30x speedup: no recheck, whose two measurements
  // on a loaded 2-core machine can disagree and reject the witness (seen under ctest -j2).
  opt.recheck_above = 1e9;
  cpu_evaluator made{opt};
  auto& ev = *made.ev;
  std::vector<pid_t> pids;
  ev.set_phase_observer([&](const char* phase, pid_t pid) {
    if (std::string{phase} == "reference")
      pids.push_back(pid);
  });
  auto t = load_task(source_dir / "env" / "tasks" / "cpu" / "09_diag_matmul.py");
  REQUIRE(t.ok());
  const std::string meddler = R"(import os
import torch
import torch.nn as nn
torch.crucible_leak = True
os.environ["CRUCIBLE_LEAK"] = "1"


class ModelNew(nn.Module):
    def forward(self, a, B):
        return a.unsqueeze(1) * B
)";
  const std::string witness = R"(import os
import tempfile
import torch
import torch.nn as nn
CLEAN = (not hasattr(torch, "crucible_leak") and "CRUCIBLE_LEAK" not in os.environ
         and os.environ.get("HOME") == os.getcwd() and tempfile.gettempdir() == os.getcwd())


class ModelNew(nn.Module):
    def forward(self, a, B):
        out = a.unsqueeze(1) * B
        return out if CLEAN else out + 1
)";
  auto first = ev.evaluate(eval_request{*t, meddler, 0, false});
  INFO(describe(first));
  CHECK(first.status == verdict_status::ok); // its module ran
  auto second = ev.evaluate(eval_request{*t, witness, 0, false});
  INFO(describe(second));
  CHECK(second.status == verdict_status::ok);
  REQUIRE(pids.size() == 2);
  CHECK(pids[0] != pids[1]);
  CHECK(ev.workers_forked() == ev.workers_started());
  CHECK(ev.workers_forked() >= 2);
}

TEST_CASE("a patch a candidate makes while it is timed is caught by the check after that call") {
  // Static checks off, so the patch is made at run time, on the forward's ninth call: after the
  // trials (six calls), inside timing's first calls. The per-call check looks only at namespaces
  // whose dict version tag moved; a module's and a class's namespace must both be caught.
  evaluator_options opt;
  // The in-process timing of the shared path (CUDA devices take it; docs/evaluator.md, Trust boundary).
  opt.boundary = evaluator_boundary::shared;
  opt.warm_workers = 0;
  opt.flush_bytes = 16ull << 20;
  opt.rounds = 10;
  opt.min_rounds = 10;
  opt.static_checks = false;
  cpu_evaluator made{opt};
  auto& ev = *made.ev;
  auto t = load_task(source_dir / "env" / "tasks" / "cpu" / "01_relu_scale.py");
  REQUIRE(t.ok());
  const std::pair<const char*, const char*> patches[] = {
      {"torch.nn.functional.relu", "real = F.relu\n            F.relu = lambda t, inplace=False: real(t, inplace)"},
      {"torch.Tensor.add", "real = torch.Tensor.add\n            torch.Tensor.add = lambda *a, **k: real(*a, **k)"},
  };
  for (const auto& [name, patch] : patches) {
    const std::string cand = R"(import torch
import torch.nn as nn
import torch.nn.functional as F
_calls = [0]


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale, self.shift, self.clamp_max = scale, shift, clamp_max

    def forward(self, x):
        _calls[0] += 1
        if _calls[0] == 9:
            )" + std::string{patch} + R"(
        return torch.clamp(torch.relu(x * self.scale + self.shift), max=self.clamp_max)
)";
    auto v = ev.evaluate(eval_request{*t, cand, 0, false});
    INFO(name << ": " << describe(v));
    CHECK(v.status == verdict_status::rejected);
    CHECK(std::find(v.checks_failed.begin(), v.checks_failed.end(), "runtime:patched") != v.checks_failed.end());
    CHECK(v.message.find(name) != std::string::npos);
    CHECK(v.message.find("warm-up call") != std::string::npos);
  }
}

TEST_CASE("a patch of a function in one of the harness's own modules is caught by the check after that call") {
  // tests/candidates/hack_patch_harness_module.py with the static checks off: in its first call it
  // rebinds _output_items in env/eval/harness/timing.py's globals (reached from sys.modules["__main__"]
  // through the timing function worker.py binds), which would leave every timed call's outputs unchecked while it
  // returns zeros there. worker.py loads its modules by path beside itself; each one's globals are
  // in the integrity snapshot as worker.py's own are.
  auto opt = cpu_evaluator::suite_options(0);
  opt.static_checks = false;
  opt.rounds = opt.min_rounds = opt.max_rounds = 10; // it must not get that far
  cpu_evaluator made{opt};
  auto cand = source_dir / "tests" / "candidates" / "hack_patch_harness_module.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  auto v = made.run(*t, cand);
  INFO(describe(v));
  CHECK(v.status == verdict_status::rejected);
  CHECK(std::find(v.checks_failed.begin(), v.checks_failed.end(), "runtime:patched") != v.checks_failed.end());
  CHECK(v.message.find("timing._output_items") != std::string::npos);
  CHECK(v.message.find("trial 0") != std::string::npos);
  CHECK_FALSE(v.has_speedup());
}

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

TEST_CASE("a task's INPUT_DOMAIN: \"as-given\" keeps the inputs' signs, another value is named as wrong") {
  // The task of hack_assumed_domain.py (a copy for ReLU on torch.rand inputs), declared as
  // keeping its domain: the copy is right on every input drawn, so it is ok. A value that is
  // not a domain is the task's error, named.
  const auto dir = fs::temp_directory_path() / ("crucible-test-domain-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto src = read_text(source_dir / "tests" / "tasks" / "relu_nonnegative.py");
  auto task_with = [&](const std::string& name, const std::string& line) {
    const auto path = dir / name;
    std::ofstream(path) << src << "\n" << line << "\n";
    auto t = load_task(path);
    REQUIRE_MESSAGE(t.ok(), t.error().message);
    return *t;
  };
  cpu_evaluator ev{0};
  const auto copy = source_dir / "tests" / "candidates" / "hack_assumed_domain.py";
  auto kept = ev.run(task_with("kept.py", "INPUT_DOMAIN = \"as-given\""), copy);
  INFO("as-given: " << describe(kept));
  CHECK(kept.status == verdict_status::ok);
  auto any = ev.run(task_with("any.py", "INPUT_DOMAIN = \"any\""), copy);
  INFO("any: " << describe(any));
  CHECK(any.status == verdict_status::incorrect);
  // Distribution 5 (distribution 1 with sparse values negated and scaled) is the first to give
  // the copy negative inputs.
  CHECK(any.message.find("distribution 5") != std::string::npos);
  auto bad = ev.run(task_with("bad.py", "INPUT_DOMAIN = \"positive\""), copy);
  INFO("bad: " << describe(bad));
  CHECK(bad.status == verdict_status::runtime_error);
  CHECK(bad.message.find("INPUT_DOMAIN is 'positive'") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("a verdict records the numeric settings each side ran with, and says where the candidate chose its own") {
  // legit_cudnn_flags.py turns TF32 on for cuBLAS and cuDNN and oneDNN's matmul to TF32: its calls
  // run with them, the reference's with the harness's, and the verdict says so; legit_algebra.py
  // changes nothing, and its verdict lists the same settings for both sides.
  cpu_evaluator ev{0};
  auto flags = source_dir / "tests" / "candidates" / "legit_cudnn_flags.py";
  auto t = load_task(read_expectation(flags).task);
  REQUIRE(t.ok());
  auto v = ev.run(*t, flags);
  INFO(describe(v));
  CHECK(v.status == verdict_status::ok);
  CHECK(v.precision_reference.at("cuda.matmul.allow_tf32") == "False");
  CHECK(v.precision_candidate.at("cuda.matmul.allow_tf32") == "True");
  CHECK(v.precision_candidate.at("fp32_precision.mkldnn.matmul") == "tf32");
  CHECK(v.message.find("The candidate ran with numeric settings of its own, judged on the outputs it returned: ")
        != std::string::npos);
  CHECK(v.message.find("cuda.matmul.allow_tf32: True (reference False)") != std::string::npos);
  CHECK(to_json(v).find("\"precision\":{\"reference\":{") != std::string::npos);

  auto plain = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t2 = load_task(read_expectation(plain).task);
  REQUIRE(t2.ok());
  auto w = ev.run(*t2, plain);
  INFO(describe(w));
  CHECK(w.precision_reference.count("float32_matmul_precision") == 1);
  CHECK(w.precision_candidate == w.precision_reference);
  CHECK(w.precision_changes().empty());
  CHECK(w.message.find("numeric settings") == std::string::npos);
}

TEST_CASE("timing rounds put their inputs at many placements unless placement_jitter_bytes is 0") {
  auto cand = source_dir / "tests" / "candidates" / "legit_algebra.py";
  auto t = load_task(read_expectation(cand).task);
  REQUIRE(t.ok());
  // The worker reports, in its host-time log line, how many distinct addresses the candidate's
  // first input had over the verdict's rounds.
  auto placements = [&](std::uint64_t jitter) {
    auto log_path = fs::temp_directory_path() / ("crucible-placement-" + std::to_string(::getpid()) + "-"
                                                 + std::to_string(jitter) + ".log");
    evaluator_options opt = twenty_rounds(0);
    // The in-process timing of the shared path (CUDA devices take it; docs/evaluator.md, Trust boundary).
    opt.boundary = evaluator_boundary::shared;
    opt.placement_jitter_bytes = jitter;
    auto [v, text] = logged_verdict(opt, *t, read_text(cand), log_path);
    std::smatch m;
    static const std::regex re{"timing: distinct candidate input addresses ([0-9]+)"};
    REQUIRE_MESSAGE(std::regex_search(text, m, re), text);
    return std::make_pair(std::stoi(m[1].str()), v.rounds);
  };
  auto [on, rounds] = placements(64ull << 20);
  auto [off, rounds_off] = placements(0);
  INFO("with jitter " << on << " addresses in " << rounds << " measured rounds; without " << off);
  CHECK(on >= rounds * 9 / 10); // a random lead each round: a repeat is rare
  CHECK(on > off);
}

TEST_CASE("quiet_gc: no cyclic garbage collection runs while a worker times, and one does without it") {
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
    // The in-process timing of the shared path (CUDA devices take it; docs/evaluator.md, Trust boundary).
    opt.boundary = evaluator_boundary::shared;
    opt.quiet_gc = quiet;
    auto text = logged_verdict(opt, *t, read_text(cand), log_path).second;
    // The worker's host-time line names every collection; those inside timing() apart.
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
  CHECK(loud > 0);
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
    opt.boundary = evaluator_boundary::shared; // one worker a verdict: the counts below are its
    cpu_evaluator ev{opt};
    auto v = ev.run(*t, cand);
    INFO(describe(v));
    CHECK(v.status == verdict_status::ok);
    REQUIRE(ev.ev->workers_started() == 1);
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
  evaluator_options opt = twenty_rounds(2);
  opt.refill = worker_refill::when_idle;
  // One worker a verdict, as on a CUDA device: the pool's counts below are a verdict's one take
  // (across the trust boundary a verdict takes two; the pool's rule is the same).
  opt.boundary = evaluator_boundary::shared;
  cpu_evaluator ev{opt};
  REQUIRE(ev.ev->wait_warm(120));
  REQUIRE(ev.ev->workers_started() == 2);
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
        CHECK(n == round + 1); // one worker left in the pool: its replacement waits for the verdict's end
      seen.clear();
    }
    CHECK(ev.ev->wait_warm(120)); // ... and then starts
    CHECK(ev.ev->workers_started() == round + 2);
  }
  // Two at once take the pool's two workers: the empty pool gets one start while they run, the
  // other once they are done.
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
    CHECK(seen.back() == 5);
  }
  CHECK(ev.ev->wait_warm(120));
  CHECK(ev.ev->workers_started() == 6);
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
