// The evaluator end to end on the CPU, with real sandboxed workers: the project's CPU task
// suite and its seed variants, every hack and failure candidate under tests/candidates, the
// verdict cache (also through the evaluator actor, whose rechecks bypass it), workers killed in
// the middle of an evaluation, and what a verdict records. Isolation: test_evaluator_isolation.cpp;
// measurement and the worker pool: test_evaluator_measurement.cpp.
#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/evaluator.hpp"
#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "tests/integration/cpu_evaluator.hpp"
#include "tests/test_util/candidate_expectation.hpp"
#include "tests/test_util/read_text.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace crucible::env;
using namespace crucible::testing::cpu_eval;
using crucible::testing::check_expected;
using crucible::testing::read_text;

namespace {

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
      // 43-77% slower; docs/evaluator.md, Not covered yet; the evaluator has judged such a verdict
      // twice already): a faster variant must then be credited by another verdict.
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
  if (e.status == "no-credit" && v.status == verdict_status::ok && v.speedup >= 1.25) {
    // Two processes running the same code alternately on this 2-core VM measure apart by an amount
    // each keeps for its life: 0.95-1.16x between forked twins at worst
    // (tools/bench/process_bias.py), identical code across the boundary 0.99-1.22x, and up to
    // 1.36x with another test's load. A hack that pays does so in every pair of workers; noise
    // does not: a second verdict, with workers of its own, must then stay below the bar.
    cpu_evaluator again{0};
    auto w = again.run(*t, path);
    MESSAGE(file << " again: " << describe(w));
    if (w.status != verdict_status::ok || w.speedup < v.speedup)
      v = w;
  }
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
  X("hack_extra_cores.py") X("hack_memoized_reduction.py")
CRUCIBLE_CANDIDATES(CRUCIBLE_CANDIDATE_CASE)

TEST_CASE("the floor of a task's bound refuses a call that moves its bytes faster than the hardware copies, naming the bound") {
  // The reference reads all 68 MB of its input; its output needs one row. A candidate that reads
  // that row is honest and under half the bound's bytes part: the case docs/evaluator.md names
  // as one the floor refuses wrongly. Here it shows the refusal, which no hack of the suite
  // reaches (their timed inputs are drawn afresh: hack_memoized_reduction.py). On an H200, the same
  // at 1.14 GB (tests/tasks/unneeded_input_gpu.py): 13.26 us against a floor of 134 us.
  auto t = load_task(source_dir / "tests" / "tasks" / "unneeded_input.py");
  REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
  const auto dir = std::filesystem::temp_directory_path() / ("crucible-floor-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "first_row.py";
  std::ofstream(path) << "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                         "    def __init__(self):\n        super().__init__()\n\n"
                         "    def forward(self, x):\n        return x[0].clone()\n";
  cpu_evaluator ev{0};
  auto v = ev.run(*t, path);
  std::filesystem::remove_all(dir);
  INFO(describe(v));
  CHECK(v.status == verdict_status::rejected);
  CHECK(std::find(v.checks_failed.begin(), v.checks_failed.end(), "runtime:below_floor") != v.checks_failed.end());
  CHECK(v.message.find("below the floor of") != std::string::npos);
  CHECK(v.message.find("its task's bound sets on this hardware (half of 71.32 MB read and written") != std::string::npos);
  CHECK_FALSE(v.has_speedup());
}

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
// worker's own socket, which paid while the reference shared the candidate's process (the shared
// path, since removed; docs/evaluator.md, Trust boundary); and routes around the boundary's
// measurement (issue 84): CPU time its accounting never saw, the build service working in a timed
// call, an output at another address or in another layout, a precision dropped under the loosest
// slack, outputs right only on the distributions drawn. control_other_operators.py is no hack: the
// arithmetic of two of them without their routes (their `# control:`).
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
  X("boundary/hack_service_load_inline_timed.py") X("boundary/hack_service_weights_shipped.py")        \
  X("boundary/control_other_operators.py")
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
  // A hack's control (its own arithmetic without its route, which the CUDA hack suite judges
  // beside it) is a candidate of the suite, of the same task.
  std::size_t with_control = 0;
  for (const auto& f : listed) {
    const auto e = read_expectation(source_dir / "tests" / "candidates" / f);
    if (e.control.empty())
      continue;
    ++with_control;
    INFO(f << ": control " << e.control.string());
    CHECK(fs::exists(e.control));
    CHECK(read_expectation(e.control).task == e.task);
    CHECK(read_expectation(e.control).status == "ok");
  }
  CHECK(with_control == 2); // hack_contend_cpp_clone, hack_harness_cpp_future_inputs
}

TEST_CASE("across the trust boundary the candidate's process holds no reference: a candidate that looks for it finds none") {
  // tests/candidates/boundary/probe_find_reference.py, with the static checks off (it reads
  // sys.modules, the garbage collector and files): it returns the reference's outputs where it
  // finds the reference in its process, zeros where it does not.
  const auto path = source_dir / "tests" / "candidates" / "boundary" / "probe_find_reference.py";
  auto t = load_task(source_dir / "env" / "tasks" / "cpu" / "01_relu_scale.py");
  REQUIRE(t.ok());
  // (Where one worker ran both, before the shared path was removed, the probe found the reference
  // and its verdict was ok.)
  auto opt = cpu_evaluator::suite_options(0);
  opt.static_checks = false;
  cpu_evaluator ev{opt};
  auto v = ev.run(*t, path);
  INFO(describe(v));
  CHECK(v.status == verdict_status::incorrect);
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
  // One call a sample: the calls per sample follow the faster side (the candidate, here), and more
  // of them would spend the reference's 30 slow calls before the verdict's rounds end.
  opt.sample_ms = 0;
  cpu_evaluator ev{opt};
  const std::string cand = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                           "    def __init__(self):\n        super().__init__()\n\n"
                           "    def forward(self, x):\n        return x * 2.0\n";
  auto v = ev.ev->evaluate(eval_request{*t, cand, 0, false});
  INFO(describe(v));
  CHECK(v.status == verdict_status::rejected);
  CHECK(std::find(v.checks_failed.begin(), v.checks_failed.end(), "runtime:slow_reference") != v.checks_failed.end());
  CHECK(v.message.find("slower during this verdict than alone") != std::string::npos);
  // Judged twice (a load change on the host does this once): refused in both.
  CHECK(v.message.find("(in two verdicts)") != std::string::npos);
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
  // Identical code is not clearly slower: its measurement goes on. Two processes of one code can
  // measure up to 16% apart for their whole life on the CI VM (tools/bench/process_bias.py), and
  // another test's load adds to it: a first verdict that stopped is followed by one with workers
  // of its own, which must go on (code three times as slow stops in every pair of workers).
  auto same = ev.ev->evaluate(eval_request{*t, reference_as_candidate(*t), 0, false});
  if (same.message.find("clearly slower") != std::string::npos) {
    MESSAGE("identical code stopped as clearly slower: " << describe(same));
    cpu_evaluator again{opt};
    same = again.ev->evaluate(eval_request{*t, reference_as_candidate(*t), 0, false});
  }
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

