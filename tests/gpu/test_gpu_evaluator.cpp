// The evaluator on a CUDA device: the comparison kernel against the host comparison on the same
// values, and whole verdicts with outputs kept on the device (CUDA IPC from the worker) and
// copied to the host, which must agree.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <random>

#include "core/log.hpp"
#include "env/eval/compare.hpp"
#include "env/eval/device/device_agent.hpp"
#include "env/eval/device/device_bytes.hpp"
#include "tests/gpu/evaluator_util.hpp"
#include "tests/gpu/uploaded.hpp"
#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "tests/test_util/candidate_expectation.hpp"
#include "tests/test_util/read_text.hpp"

// No LibTorch here: a binary linked to libtorch.so resolved std::filesystem::remove_all to the
// copy libtorch exports, which crashed (the evaluator removes its workers' scratch directories).

namespace fs = std::filesystem;
extern char** environ;

using namespace crucible;
using namespace crucible::env;
using crucible::testing::uploaded;
using crucible::testing::check_expected;
using crucible::testing::read_expectation;
using crucible::testing::read_text;
using crucible::testing::short_evaluator;
using crucible::testing::check_faults_stay_their_own;

namespace {

const fs::path source_dir{CRUCIBLE_SOURCE_DIR};

std::uint16_t to_half(float f) {
  // Round to nearest even through the float's bits (normal range; tests stay well inside it).
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  if (std::isnan(f))
    return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (std::isinf(f))
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  const int exp = static_cast<int>((x >> 23) & 0xffu) - 127 + 15;
  if (exp <= 0)
    return static_cast<std::uint16_t>(sign);
  std::uint32_t mant = x & 0x7fffffu;
  std::uint32_t h = sign | (static_cast<std::uint32_t>(exp) << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
    ++h;
  return static_cast<std::uint16_t>(h);
}

std::uint16_t to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f))
    return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

// The values as `type`, in native bytes.
std::vector<std::byte> encode(const std::vector<float>& v, dtype type) {
  std::vector<std::byte> out(v.size() * element_size(type));
  for (size_t i = 0; i < v.size(); ++i) {
    auto* p = out.data() + i * element_size(type);
    switch (type) {
      case dtype::f64: { double d = v[i]; std::memcpy(p, &d, 8); break; }
      case dtype::f32: std::memcpy(p, &v[i], 4); break;
      case dtype::f16: { auto h = to_half(v[i]); std::memcpy(p, &h, 2); break; }
      case dtype::bf16: { auto b = to_bf16(v[i]); std::memcpy(p, &b, 2); break; }
      case dtype::i32: { auto k = static_cast<std::int32_t>(v[i] * 100); std::memcpy(p, &k, 4); break; }
      case dtype::boolean: { std::uint8_t b = v[i] > 0; std::memcpy(p, &b, 1); break; }
      default: FAIL("type not used here");
    }
  }
  return out;
}

tensor_blob host_blob(const std::vector<float>& v, dtype type) {
  tensor_blob b;
  b.type = type;
  b.shape = {static_cast<std::int64_t>(v.size())};
  b.bytes = encode(v, type);
  return b;
}

tensor_blob device_blob(const std::vector<float>& v, dtype type) {
  tensor_blob b;
  b.type = type;
  b.shape = {static_cast<std::int64_t>(v.size())};
  b.device = std::make_shared<uploaded>(encode(v, type));
  return b;
}

// Compares want/got on the host, on the device, and mixed; all must say the same.
void same_verdict(const std::vector<float>& want, const std::vector<float>& got, dtype type) {
  tolerances tol;
  auto host = compare_outputs({host_blob(want, type)}, {host_blob(got, type)}, tol);
  auto dev = compare_outputs({device_blob(want, type)}, {device_blob(got, type)}, tol);
  auto mixed = compare_outputs({device_blob(want, type)}, {host_blob(got, type)}, tol);
  // The same pair compared ahead in a batch (the evaluator's path for a verdict's trials).
  const std::vector<tensor_blob> want_dev{device_blob(want, type)}, got_dev{device_blob(got, type)};
  const auto ahead = compare_on_device_ahead({{&want_dev, &got_dev}}, tol);
  CHECK(ahead.size() == 1);
  auto batched = compare_outputs(want_dev, got_dev, tol, &ahead);
  INFO(to_string(type) << ": host: " << host.message << " | device: " << dev.message);
  CHECK(host.ok == dev.ok);
  CHECK(host.mismatches == dev.mismatches);
  CHECK(host.max_abs_diff == dev.max_abs_diff);
  CHECK(host.message == dev.message);
  CHECK(mixed.message == host.message);
  CHECK(batched.message == host.message);
  CHECK(batched.mismatches == host.mismatches);
  CHECK(batched.max_abs_diff == host.max_abs_diff);
}

} // namespace

TEST_CASE("the device comparison kernel agrees with the host comparison, element for element") {
  REQUIRE(device_bytes_available());
  std::mt19937 rng{7};
  std::normal_distribution<float> normal;
  const size_t n = 1 << 20;
  std::vector<float> want(n);
  for (auto& x : want)
    x = normal(rng);
  SUBCASE("equal") { same_verdict(want, want, dtype::f32); }
  SUBCASE("within tolerance") {
    auto got = want;
    for (auto& x : got)
      x += 5e-5f;
    same_verdict(want, got, dtype::f32);
  }
  SUBCASE("mismatches, NaN and infinities") {
    auto got = want;
    for (size_t i = 1000; i < n; i += 7919)
      got[i] = 3.0f;
    want[17] = got[17] = std::numeric_limits<float>::quiet_NaN();
    want[23] = std::numeric_limits<float>::infinity();
    got[23] = -std::numeric_limits<float>::infinity();
    got[29] = std::numeric_limits<float>::quiet_NaN();
    same_verdict(want, got, dtype::f32);
    CHECK_FALSE(compare_outputs({device_blob(want, dtype::f32)}, {device_blob(got, dtype::f32)}, tolerances{}).ok);
  }
  SUBCASE("float16, bfloat16, float64, int32, bool") {
    auto noisy = want;
    for (auto& x : noisy)
      x += 0.02f * normal(rng);
    for (auto type : {dtype::f16, dtype::bf16, dtype::f64, dtype::i32, dtype::boolean})
      same_verdict(want, noisy, type);
  }
}

TEST_CASE("pairs compared in one batch each get their own result, as compared one at a time") {
  REQUIRE(device_bytes_available());
  std::mt19937 rng{11};
  std::normal_distribution<float> normal;
  tolerances tol;
  // Five trials' worth of pairs of different sizes and dtypes, some equal, some not (each with its
  // mismatches at its own places), plus a pair with a different shape (left to compare_outputs).
  std::vector<std::vector<tensor_blob>> wants, gots;
  std::vector<comparison> one_by_one;
  const dtype types[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::f64, dtype::i32};
  for (int t = 0; t < 5; ++t) {
    const size_t n = (1u << 16) + 977u * static_cast<size_t>(t);
    std::vector<float> want(n), got;
    for (auto& x : want)
      x = normal(rng);
    got = want;
    for (size_t i = 100 + 31 * static_cast<size_t>(t); t % 2 == 1 && i < n; i += 4099u + static_cast<size_t>(t))
      got[i] += 1.0f;
    wants.push_back({device_blob(want, types[t])});
    gots.push_back({device_blob(got, types[t])});
    one_by_one.push_back(compare_outputs(wants.back(), gots.back(), tol));
  }
  wants.push_back({device_blob({1.0f, 2.0f}, dtype::f32)});
  gots.push_back({device_blob({1.0f, 2.0f, 3.0f}, dtype::f32)});
  one_by_one.push_back(compare_outputs(wants.back(), gots.back(), tol));
  std::vector<output_lists> lists;
  for (size_t k = 0; k < wants.size(); ++k)
    lists.emplace_back(&wants[k], &gots[k]);
  const auto ahead = compare_on_device_ahead(lists, tol);
  CHECK(ahead.size() == 5); // the pair of different shapes is not compared ahead
  for (size_t k = 0; k < wants.size(); ++k) {
    auto batched = compare_outputs(wants[k], gots[k], tol, &ahead);
    INFO("pair " << k << ": one by one: " << one_by_one[k].message << " | batched: " << batched.message);
    CHECK(batched.ok == one_by_one[k].ok);
    CHECK(batched.ok == (k % 2 == 0 && k < 5));
    CHECK(batched.message == one_by_one[k].message);
    CHECK(batched.mismatches == one_by_one[k].mismatches);
    CHECK(batched.max_abs_diff == one_by_one[k].max_abs_diff);
  }
}

TEST_CASE("copies of several device spans, waited for once, hold the same bytes") {
  REQUIRE(device_bytes_available());
  std::vector<std::vector<std::byte>> hosts;
  std::vector<std::shared_ptr<device_bytes>> srcs;
  std::vector<const device_bytes*> ptrs;
  for (size_t k = 0; k < 4; ++k) {
    std::vector<std::byte> h((k == 2 ? 0 : (3u << 20) + 5 * k));
    for (size_t i = 0; i < h.size(); ++i)
      h[i] = static_cast<std::byte>((i * 131 + k) & 0xff);
    srcs.push_back(std::make_shared<uploaded>(h));
    ptrs.push_back(srcs.back().get());
    hosts.push_back(std::move(h));
  }
  auto copies = copy_all_to_owned(ptrs);
  REQUIRE(copies.ok());
  REQUIRE(copies->size() == 4);
  for (size_t k = 0; k < 4; ++k)
    if (!hosts[k].empty())
      CHECK((*copies)[k]->data() != srcs[k]->data());
  srcs.clear(); // the copies are the process's own
  for (size_t k = 0; k < 4; ++k) {
    CHECK((*copies)[k]->size() == hosts[k].size());
    auto back = download(*(*copies)[k]);
    REQUIRE(back.ok());
    CHECK(*back == hosts[k]);
  }
}

TEST_CASE("a hostile device handle is refused with a message, and the process goes on") {
  REQUIRE(device_bytes_available());
  auto bad = map_exported(0, std::string(128, '0'), 0, 16, 4);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("does not open") != std::string::npos);
  auto short_handle = map_exported(0, "abcd", 0, 16, 4);
  REQUIRE_FALSE(short_handle.ok());
  // The device still works after the refusals.
  std::vector<float> ones(4, 1.0f);
  CHECK(compare_outputs({device_blob(ones, dtype::f32)}, {device_blob(ones, dtype::f32)}, tolerances{}).ok);
}

TEST_CASE("CPU-suite tasks on CUDA across the trust boundary: every variant ok, every wrong one incorrect") {
  system_clock clk;
  logger log{clk, log_level::warn};
  auto root = source_dir / "env" / "tasks" / "cpu";
  auto ev = short_evaluator(log);
  for (const char* stem : {"01_relu_scale", "04_layernorm_manual", "09_diag_matmul"}) {
    auto t = load_task(root / (std::string{stem} + ".py"));
    if (!t)
      FAIL(t.error().message);
    for (const auto& e : fs::directory_iterator(root / "variants" / stem)) {
      // cpp_* variants are CPU extensions: they take CPU tensors only.
      if (e.path().extension() != ".py" || e.path().filename().string().rfind("cpp_", 0) == 0)
        continue;
      auto v = ev->evaluate(eval_request{*t, read_text(e.path()), 0, false});
      auto name = e.path().filename().string();
      const std::string label = std::string{stem} + "/" + name + ": " + to_string(v.status);
      INFO(label << " " << v.message);
      MESSAGE(label << " " << v.speedup << "x wall " << v.wall_s << " s");
      if (name.rfind("wrong_", 0) == 0) {
        CHECK(v.status == verdict_status::incorrect);
        CHECK(v.message.find("elements outside") != std::string::npos);
      } else {
        CHECK(v.status == verdict_status::ok);
      }
    }
  }
  auto recycled = load_task(root / "01_relu_scale.py");
  REQUIRE(recycled.ok());
  auto v = ev->evaluate(eval_request{*recycled, read_text(source_dir / "tests" / "candidates" / "hack_recycled_memory.py"), 0, false});
  INFO("recycled memory: " << std::string{to_string(v.status)} << " " << v.message);
  CHECK(v.status != verdict_status::ok);
}

TEST_CASE("a CPU verdict on a GPU host reaches no GPU: a candidate that makes it visible again finds none") {
  // tests/candidates/escape/gpu_from_cpu_worker.py raises "ESCAPED" if it opens a GPU's device
  // file or computes on a GPU after undoing the worker's empty CUDA_VISIBLE_DEVICES: a CPU sample
  // is charged its processes' CPU time, and a GPU's work is not that. Static checks off: the
  // sandbox alone must hold (confine.py, DeviceKind.device_nodes).
  REQUIRE(fs::exists("/dev/nvidiactl")); // the host has what the candidate reaches for
  system_clock clk;
  logger log{clk, log_level::warn};
  evaluator_options opt;
  opt.devices = {"cpu"};
  opt.cuda_mps = cuda_mps_mode::off; // as short_evaluator: MPS starts once a process (test_gpu_mps)
  opt.static_checks = false;
  opt.rounds = 10;
  opt.max_rounds = 10;
  opt.recheck_above = 1e9;
  auto where = locate_harness(opt);
  REQUIRE(where.ok());
  auto ev = device_evaluator::create(opt, reward_options{}, *where, "cpu", log, nullptr);
  REQUIRE(ev.ok());
  auto t = load_task(source_dir / "env" / "tasks" / "cpu" / "01_relu_scale.py");
  REQUIRE(t.ok());
  auto v = (*ev)->evaluate(eval_request{*t, read_text(source_dir / "tests" / "candidates" / "escape" / "gpu_from_cpu_worker.py"), 0, false});
  INFO(std::string{to_string(v.status)} << " " << v.message);
  MESSAGE("gpu_from_cpu_worker.py on cpu: " << std::string{to_string(v.status)} << " " << v.message.substr(0, 200));
  CHECK(v.message.find("ESCAPED") == std::string::npos);
  CHECK(v.status == verdict_status::ok);
}

TEST_CASE("a task checked alone on CUDA (the run's reference check) is ok") {
  system_clock clk;
  logger log{clk, log_level::warn};
  {
    auto ev = short_evaluator(log);
    // Several in a row on one evaluator: the worker ends after its reference, and nothing is
    // sent to it after that (a message it was not waiting for failed `crucible train` so).
    for (const char* name : {"level1/13_cross_entropy_fp32", "level2/10_rope_bf16", "level2/15_add_layernorm_bf16"}) {
      auto t = load_task(source_dir / "env" / "tasks" / "gpu" / (std::string{name} + ".py"));
      if (!t)
        FAIL(t.error().message);
      auto v = ev->check_task(*t);
      INFO(std::string{name} << ": " << std::string{to_string(v.status)} << " " << v.message);
      CHECK(v.status == verdict_status::ok);
    }
  }
}

TEST_CASE("outputs of several tensors and dtypes are compared on the device, each on its own") {
  // Three outputs of different dtypes and sizes, each exported on its own; a wrong value in the
  // last one must be found there.
  const auto dir = fs::temp_directory_path() / "crucible-test-packed-outputs";
  fs::create_directories(dir);
  const auto task_file = dir / "multi_out.py";
  {
    std::ofstream(task_file) << R"(import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0, (x > 0).sum(dim=1), x[:, :3].to(torch.float16)


def get_inputs():
    return [torch.randn(257, 129)]


def get_init_inputs():
    return []
)";
  }
  const std::string good = R"(import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x + x, (x > 0).sum(dim=1), x[:, :3].half()
)";
  const std::string wrong_last = R"(import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        h = x[:, :3].half()
        h[-1, -1] += 1.0
        return x + x, (x > 0).sum(dim=1), h
)";
  auto t = load_task(task_file);
  if (!t)
    FAIL(t.error().message);
  system_clock clk;
  logger log{clk, log_level::warn};
  {
    auto ev = short_evaluator(log);
    auto ok = ev->evaluate(eval_request{*t, good, 0, false});
    INFO(std::string{to_string(ok.status)} << " " << ok.message);
    CHECK(ok.status == verdict_status::ok);
    auto bad = ev->evaluate(eval_request{*t, wrong_last, 0, false});
    INFO(std::string{to_string(bad.status)} << " " << bad.message);
    CHECK(bad.status == verdict_status::incorrect);
    CHECK(bad.message.find("output 2") != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("the harness's own kernels and torch's operations pass and catch the same candidates") {
  // Workers load env/eval/harness/harness_kernels.cu's fatbin for their own device work (the
  // input-unchanged check, the scaling of the input distributions); named as a file that does not
  // exist, they fall back to torch operations. Both must give the same statuses and name the same
  // checks (the timed outputs are checked by the evaluator, across the boundary).
  const auto dir = fs::temp_directory_path() / "crucible-test-harness-kernels";
  fs::create_directories(dir);
  const auto task_file = dir / "mixed_out.py";
  std::ofstream(task_file) << R"(import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2.0, (x > 0).sum(dim=1), x[:, :3].to(torch.float16)


def get_inputs():
    return [torch.randn(4096, 129)]


def get_init_inputs():
    return []
)";
  // Correct in the trials, then (from the 13th call, in the timing rounds) one output is the
  // first one computed: only the timed calls' output check can see it, in that output's dtype.
  auto stale = [](const char* which) {
    return std::string{R"(import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.first = None

    def forward(self, x):
        self.calls += 1
        out = [x + x, (x > 0).sum(dim=1), x[:, :3].half()]
        if self.first is None:
            self.first = [o.clone() for o in out]
        if self.calls > 12:
            out[)"} + which + "] = self.first[" + which + "].clone()\n        return tuple(out)\n";
  };
  auto mixed = load_task(task_file);
  auto relu = load_task(source_dir / "env" / "tasks" / "cpu" / "01_relu_scale.py");
  if (!mixed || !relu)
    FAIL("cannot load the tasks");
  const auto candidates = source_dir / "tests" / "candidates";
  struct expectation {
    const task* t;
    std::string source;
    verdict_status status;
    const char* check; // named in checks_failed, or empty
  };
  const std::vector<expectation> cases{
      {&*relu, read_text(source_dir / "env" / "tasks" / "cpu" / "variants" / "01_relu_scale" / "fast_inplace.py"),
       verdict_status::ok, ""},
      {&*relu, read_text(candidates / "hack_stale_after_trials.py"), verdict_status::rejected, "runtime:timing_outputs"},
      {&*relu, read_text(candidates / "hack_mutate_input.py"), verdict_status::rejected, "runtime:input_mutation"},
      {&*mixed, stale("0"), verdict_status::rejected, "runtime:timing_outputs"},
      {&*mixed, stale("1"), verdict_status::rejected, "runtime:timing_outputs"},
      {&*mixed, stale("2"), verdict_status::rejected, "runtime:timing_outputs"},
  };
  system_clock clk;
  logger log{clk, log_level::warn};
  for (bool own : {true, false}) {
    if (own)
      ::unsetenv("CRUCIBLE_HARNESS_KERNELS");
    else
      ::setenv("CRUCIBLE_HARNESS_KERNELS", (dir / "missing.fatbin").c_str(), 1);
    auto ev = short_evaluator(log);
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      auto v = ev->evaluate(eval_request{*c.t, c.source, 0, false});
      std::string checks;
      for (const auto& n : v.checks_failed)
        checks += n + " ";
      const std::string label = std::string{own ? "own kernels" : "torch operations"} + ", case " + std::to_string(i)
                                + ": " + std::string{to_string(v.status)} + " [" + checks + "] " + v.message;
      INFO(label);
      CHECK(v.status == c.status);
      if (*c.check != '\0')
        CHECK(checks.find(c.check) != std::string::npos);
    }
    CHECK(ev->workers_lack_kernels() == !own);
  }
  ::unsetenv("CRUCIBLE_HARNESS_KERNELS");
  fs::remove_all(dir);
}

TEST_CASE("a Triton kernel is built by the evaluator's build service once, and later workers load it") {
  // Triton's C modules (its driver's cuda_utils, the kernel's launcher) and the kernel's binary
  // come from builders and are kept in the extension cache: a second verdict of the candidate,
  // and a candidate that differs outside the kernel, build nothing; another kernel builds once
  // more (its launcher's C source is the same).
  system_clock clk;
  logger log{clk, log_level::warn};
  const auto dir = fs::temp_directory_path() / ("crucible-test-triton-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto made = short_evaluator(log, dir);
  auto& ev = *made;
  const auto bench = source_dir / "tools" / "bench" / "eval_gpu";
  auto t = load_task(bench / "tasks" / "gelu_tanh_affine.py");
  if (!t)
    FAIL(t.error().message);
  const auto cand = read_text(bench / "candidates" / "gelu_tanh_affine.py");
  auto kernels = [&] {
    int n = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      n += e.path().filename() == "kernel.json" ? 1 : 0;
    return n;
  };
  auto first = ev.evaluate(eval_request{*t, cand, 0, false});
  INFO("first: " << std::string{to_string(first.status)} << " " << first.message);
  CHECK(first.status == verdict_status::ok);
  CHECK(ev.extension_builds() == 3);
  CHECK(kernels() == 1);
  auto again = ev.evaluate(eval_request{*t, cand + "\n# the same kernel, another candidate\n", 0, false});
  INFO("again: " << std::string{to_string(again.status)} << " " << again.message);
  CHECK(again.status == verdict_status::ok);
  CHECK(ev.extension_builds() == 3);
  std::string other = cand;
  const std::string line = "g = 0.5 * x * (1.0 + t)";
  REQUIRE(other.find(line) != std::string::npos);
  other.replace(other.find(line), line.size(), "g = x * (0.5 + 0.5 * t)");
  auto changed = ev.evaluate(eval_request{*t, other, 0, false});
  INFO("another kernel: " << std::string{to_string(changed.status)} << " " << changed.message);
  CHECK(changed.status == verdict_status::ok);
  CHECK(ev.extension_builds() == 4);
  CHECK(kernels() == 2);
  made.reset();
  fs::remove_all(dir);
}

TEST_CASE("GPU hack candidates get no speed credit, and each rejection names its check") {
  // tests/candidates/gpu/: headers and expectations as in tests/candidates
  // (tests/test_util/candidate_expectation.hpp).
  system_clock clk;
  logger log{clk, log_level::warn};
  auto ev = short_evaluator(log);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(source_dir / "tests" / "candidates" / "gpu"))
    if (e.path().extension() == ".py")
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 4);
  for (const auto& path : files) {
    const auto e = read_expectation(path, source_dir);
    REQUIRE_MESSAGE(!e.status.empty(), path.filename().string() << " has no '# expect:' line");
    auto t = load_task(e.task);
    if (!t)
      FAIL(t.error().message);
    auto v = ev->evaluate(eval_request{*t, read_text(path), 0, false});
    const std::string label = path.filename().string() + ": " + to_string(v.status);
    INFO(label << " " << v.message);
    MESSAGE(label << " speedup " << v.speedup << " " << v.message);
    check_expected(e, v);
  }
}

namespace {
// The trust boundary's hack suite on CUDA, in parts a case each (a part's verdicts fit one case's
// time, and a part that runs out leaves the others' results): tests/candidates/boundary/hack_*.py
// (written for the CPU; each runs on CUDA as it is, the C++ ones on tensors of the CPU may fail
// instead) and tests/candidates/gpu/boundary/ (classes of the device alone), in name order, the
// `part`-th of `parts`, each judged as configured by default (cuda_mps auto): whatever its
// verdict, no speed credit (`no-credit`, held here to 1.05 at most: the device's noise, not the
// CPU's 1.25).
void hack_suite_across(std::size_t part, std::size_t parts) {
  system_clock clk;
  logger log{clk, log_level::warn};
  // Runs of 30 s: a hack written for the CPU may wait forever on the device's tensors
  // (hack_account_beyond_walk's computing process faults on a device pointer and its forward waits
  // for it), which is a timeout, no credit; at the default 300 s a run kept the case past 450 s on
  // its second candidate.
  // CUDA MPS as configured by default (`auto`: where nvidia-cuda-mps-control is found), so that the
  // attacks on the MPS set-up (hack_mps_control, hack_ipc_guess) meet it: each case is a process of
  // its own under ctest, and MPS starts once a process.
  const auto short_runs = [](evaluator_options& opt) {
    opt.run_timeout_s = 30;
    opt.cuda_mps = cuda_mps_mode::auto_;
  };
  auto across = short_evaluator(log, {}, short_runs);
  std::vector<fs::path> files;
  for (const auto& dir : {source_dir / "tests" / "candidates" / "boundary", source_dir / "tests" / "candidates" / "gpu" / "boundary"})
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".py" && e.path().filename().string().rfind("hack_", 0) == 0)
        files.push_back(e.path());
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  REQUIRE(files.size() >= 35);
  const std::size_t from = files.size() * part / parts, to = files.size() * (part + 1) / parts;
  std::map<fs::path, double> controls; // a control's measured ratio (its medians'), judged once
  for (std::size_t i = from; i < to; ++i) {
    const auto& path = files[i];
    const auto e = read_expectation(path, source_dir);
    auto t = load_task(e.task);
    if (!t)
      FAIL(t.error().message);
    auto v = across->evaluate(eval_request{*t, read_text(path), 0, false});
    const std::string label = path.filename().string() + ": " + to_string(v.status);
    INFO(label << " " << v.message);
    MESSAGE(label << " speedup " << v.speedup << " " << v.message.substr(0, 160));
    // No credit beyond the device's noise: identical code across measures within 1.00 +- 2% here
    // (the CPU suite's bar of 1.25 is that 2-core machine's process bias). A hack whose own
    // arithmetic differs from the reference's is held to what that arithmetic measures alone (its
    // control, judged here too: its medians' ratio, not its credit, which the evaluator caps at
    // 1.00x where it ran the reference's own kernels): on two H200s under MPS (2026-11-30)
    // hack_harness_cpp_future_inputs measured 1.052x and hack_contend_cpp_clone 1.036x, their routes
    // inert across, and the control alone 1.033x (medians 1.028x).
    double bar = 1.05;
    if (!e.control.empty() && v.status == verdict_status::ok) {
      auto c = controls.find(e.control);
      if (c == controls.end()) {
        auto cv = across->evaluate(eval_request{*t, read_text(e.control), 0, false});
        MESSAGE("  its control " << e.control.filename().string() << ": " << to_string(cv.status) << " speedup "
                                 << cv.speedup << " (medians " << cv.ref_ms / cv.cand_ms << ") "
                                 << cv.message.substr(0, 120));
        REQUIRE(cv.status == verdict_status::ok);
        c = controls.emplace(e.control, cv.ref_ms / cv.cand_ms).first;
      }
      bar = 1.05 * std::max(1.0, c->second);
    }
    CHECK((v.status != verdict_status::ok || v.speedup <= bar));
  }
}
} // namespace

TEST_CASE("the trust boundary's hack suite on CUDA, part 1 of 3: nothing is credited across the boundary") {
  hack_suite_across(0, 3);
}

TEST_CASE("the trust boundary's hack suite on CUDA, part 2 of 3: nothing is credited across the boundary") {
  hack_suite_across(1, 3);
}

TEST_CASE("the trust boundary's hack suite on CUDA, part 3 of 3: nothing is credited across the boundary") {
  hack_suite_across(2, 3);
}

TEST_CASE("verdicts in flight together on one device all end: no thread works on the device while a clock holds it") {
  // Eight verdicts at once, four in flight: a verdict's device clock holds the device with a kernel
  // from arm to finish, and a call of another verdict's that waited for the device meanwhile (an
  // IPC mapping closed after its reference's copies, a trial's outputs mapped) held the driver where
  // the clock's thread needed it before letting go: two evaluations at once on an H200 stopped for
  // good within two seconds (KernelBench's level1/1 beside level1/46, 2026-11-30).
  // device_work_mutex now holds every other thread's device work until the clock is finished.
  system_clock clk;
  logger log{clk, log_level::warn};
  auto ev = short_evaluator(log, {}, [](evaluator_options& opt) {
    opt.concurrency = 4;
    opt.warm_workers = 8;
  });
  auto root = source_dir / "env" / "tasks" / "cpu";
  std::vector<std::pair<task, std::string>> work;
  // Four tasks with two torch variants each (fast_*: no build, every one correct).
  for (const char* stem : {"02_silu_bias_residual", "03_softmax_rows", "05_logsumexp_rows", "13_sort_range"}) {
    auto t = load_task(root / (std::string{stem} + ".py"));
    if (!t)
      FAIL(t.error().message);
    std::vector<fs::path> fast;
    for (const auto& e : fs::directory_iterator(root / "variants" / stem))
      if (e.path().extension() == ".py" && e.path().filename().string().rfind("fast_", 0) == 0)
        fast.push_back(e.path());
    std::sort(fast.begin(), fast.end());
    for (std::size_t i = 0; i < fast.size() && i < 2; ++i)
      work.emplace_back(*t, read_text(fast[i]));
  }
  REQUIRE(work.size() == 8);
  std::vector<std::future<verdict>> flights;
  for (const auto& [t, source] : work)
    flights.push_back(std::async(std::launch::async, [&ev, &t = t, &source = source] {
      return ev->evaluate(eval_request{t, source, 0, false});
    }));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  for (auto& f : flights)
    if (f.wait_until(deadline) != std::future_status::ready) {
      // Threads stuck in the driver cannot be joined: the process ends here.
      std::fprintf(stderr, "verdicts in flight together did not end within 240 s\n");
      std::_Exit(1);
    }
  for (auto& f : flights) {
    auto v = f.get();
    INFO(std::string{to_string(v.status)} << " " << v.message);
    CHECK(v.status == verdict_status::ok);
  }
}

TEST_CASE("the reference's graph baselines are timed across the boundary: one call a sample, a correct candidate ok") {
  // cuda-graph: the reference's worker captures a graph on each sample's input buffers and replays
  // it; compile-reduce-overhead: a new step of its graphs before every call (executor.py,
  // executor_call). Both hand back memory of their own every call: one call a sample.
  system_clock clk;
  logger log{clk, log_level::warn};
  auto t = load_task(source_dir / "env" / "tasks" / "cpu" / "01_relu_scale.py");
  if (!t)
    FAIL(t.error().message);
  const auto cand = read_text(source_dir / "env" / "tasks" / "cpu" / "variants" / "01_relu_scale" / "fast_inplace.py");
  for (auto baseline : {timing_baseline::cuda_graph, timing_baseline::compile_reduce_overhead}) {
    auto ev = short_evaluator(log, {}, [&](evaluator_options& opt) { opt.baseline = baseline; });
    auto v = ev->evaluate(eval_request{*t, cand, 0, false});
    INFO(to_string(baseline) << ": " << std::string{to_string(v.status)} << " " << v.message);
    MESSAGE(to_string(baseline) << ": " << std::string{to_string(v.status)} << " " << v.message);
    CHECK(v.status == verdict_status::ok);
    CHECK(v.message.find(" calls") == std::string::npos); // no "of N calls": one call a sample
  }
}

TEST_CASE("a legitimate candidate that reuses its output buffer is ok across the CUDA boundary, not below the floor") {
  // Its calls of a sample hand back one buffer, so the verdict goes on with one call per sample;
  // the empty sample's round trip must be measured again for one call (it holds the copies of
  // every call's inputs and outputs), or the floor takes a round trip of many calls off a sample
  // of one: -194 us on 01_relu_scale on an H200 before it was.
  system_clock clk;
  logger log{clk, log_level::warn};
  auto across = short_evaluator(log);
  for (const auto& [task_file, candidate] : {std::pair{"tests/tasks/small_elementwise.py", "tests/candidates/legit_reused_output.py"},
                                             std::pair{"env/tasks/cpu/01_relu_scale.py", "tests/candidates/legit_reused_output.py"}}) {
    auto t = load_task(source_dir / task_file);
    if (!t)
      FAIL(t.error().message);
    auto v = across->evaluate(eval_request{*t, read_text(source_dir / candidate), 0, false});
    INFO(task_file << ": " << std::string{to_string(v.status)} << " " << v.message);
    CHECK(v.status == verdict_status::ok);
    CHECK(std::find(v.checks_failed.begin(), v.checks_failed.end(), "runtime:below_floor") == v.checks_failed.end());
  }
}

TEST_CASE("a candidate's fault stays its own: an illegal address, a kernel that never ends, one left running, with another verdict in flight") {
  system_clock clk;
  logger log{clk, log_level::warn};
  auto ev = short_evaluator(log, {}, [](evaluator_options& opt) {
    opt.concurrency = 2;
    opt.run_timeout_s = 30;
  });
  check_faults_stay_their_own(*ev);
}

TEST_CASE("the device agent does the evaluator's device work in a process of its own, and is started again after it ends") {
  // Last in this file: from here on device 0's work of this process runs in the agent.
  auto program = find_device_agent();
  REQUIRE_MESSAGE(program.ok(), (program ? std::string{} : program.error().message));
  device_agent_spec spec;
  spec.program = *program;
  for (char** e = environ; *e != nullptr; ++e)
    spec.environment.emplace_back(*e);
  auto started = start_device_agent(0, spec);
  REQUIRE_MESSAGE(started.ok(), (started ? std::string{} : started.error().message));
  const pid_t first = device_agent_pid(0);
  REQUIRE(first > 0);

  // Memory of the agent's: written, copied, compared and read back through it.
  std::vector<float> host(1024);
  for (std::size_t i = 0; i < host.size(); ++i)
    host[i] = static_cast<float>(i) * 0.5f - 3.0f;
  auto a = allocate_owned(0, host.size() * sizeof(float));
  REQUIRE(a.ok());
  REQUIRE(upload(**a, reinterpret_cast<const std::byte*>(host.data()), host.size() * sizeof(float)).ok());
  auto b = copy_to_owned(**a);
  REQUIRE(b.ok());
  auto half = subspan(*b, 512 * sizeof(float), 512 * sizeof(float), sizeof(float));
  REQUIRE(half.ok());
  auto back = download(**half);
  REQUIRE(back.ok());
  REQUIRE(back->size() == 512 * sizeof(float));
  CHECK(std::memcmp(back->data(), host.data() + 512, back->size()) == 0);
  auto same = device_compare(**a, **b, dtype::f32, host.size(), tolerance{1e-6, 1e-6});
  REQUIRE(same.ok());
  CHECK(same->mismatches == 0);
  REQUIRE(fill_all({b->get()}, 0).ok());
  auto differ = device_compare(**a, **b, dtype::f32, host.size(), tolerance{1e-6, 1e-6});
  REQUIRE(differ.ok());
  CHECK(differ->mismatches > 0);
  auto name = device_name(0);
  REQUIRE(name.ok());
  CHECK_FALSE(name->empty());

  // A verdict across the boundary with the agent doing the copies, the clock and the comparisons.
  system_clock clk;
  logger log{clk, log_level::warn};
  auto across = short_evaluator(log);
  auto task = load_task(source_dir / "env" / "tasks" / "cpu" / "04_layernorm_manual.py");
  REQUIRE(task.ok());
  auto v = across->evaluate(eval_request{*task, read_text(source_dir / "env" / "tasks" / "cpu" / "variants" / "04_layernorm_manual" / "fast_functional.py"), 0, false});
  INFO(to_string(v.status) << " " << v.message);
  CHECK(v.status == verdict_status::ok);
  CHECK(v.speedup > 1.0);
  CHECK(device_agent_pid(0) == first);

  // The agent killed (as a device fault ends it): the next call says so, the one after starts a
  // new agent, and the old agent's memory is refused by name.
  REQUIRE(::kill(first, SIGKILL) == 0);
  auto lost = allocate_owned(0, 256);
  REQUIRE_FALSE(lost.ok());
  CHECK(lost.error().message.find("ended") != std::string::npos);
  auto again = allocate_owned(0, 256);
  REQUIRE_MESSAGE(again.ok(), (again ? std::string{} : again.error().message));
  CHECK(device_agent_pid(0) != first);
  auto stale = download(**a);
  REQUIRE_FALSE(stale.ok());
  CHECK(stale.error().message.find("before it ended and was started again") != std::string::npos);
  auto v2 = across->evaluate(eval_request{*task, read_text(source_dir / "env" / "tasks" / "cpu" / "variants" / "04_layernorm_manual" / "fast_functional.py"), 0, false});
  INFO(to_string(v2.status) << " " << v2.message);
  CHECK(v2.status == verdict_status::ok);
}
