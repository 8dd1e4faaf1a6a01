// The evaluator's isolation on the CPU, with real sandboxed workers: candidates' extensions built
// apart and only loaded by workers, escape attempts out of the sandbox, workers forked clean from
// the zygote, and patches a candidate makes at run time caught by the per-call check.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "tests/integration/cpu_evaluator.hpp"
#include "tests/test_util/read_text.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace crucible::env;
using namespace crucible::testing::cpu_eval;
using crucible::testing::read_text;

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
  // Device files any user may open but the plain ones a CPU worker keeps (confine.py,
  // _PLAIN_DEVICES): /dev/ptmx here, a GPU's /dev/nvidia* on a GPU host.
  std::vector<std::string> devices;
  for (const char* dir : {"/dev", "/dev/dri", "/dev/net", "/dev/nvidia-caps"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      struct stat st {};
      const auto p = e.path().string();
      if (::lstat(p.c_str(), &st) == 0 && S_ISCHR(st.st_mode) && (st.st_mode & S_IWOTH) && p != "/dev/null"
          && p != "/dev/zero" && p != "/dev/full" && p != "/dev/random" && p != "/dev/urandom" && p != "/dev/tty")
        devices.push_back(p);
    }
  }
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
                              + ", \"devices\": " + json_list(devices)
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
  // trials (six calls), inside the timing's first calls (the candidate's worker's untimed call
  // before a sample). The per-call check looks only at namespaces
  // whose dict version tag moved; a module's and a class's namespace must both be caught.
  evaluator_options opt;
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
    CHECK(v.message.find("timing, untimed call") != std::string::npos); // the ninth: the priming call before a sample
  }
}

TEST_CASE("a patch of a function in one of the harness's own modules is caught by the check after that call") {
  // tests/candidates/hack_patch_harness_module.py with the static checks off: in its first call it
  // rebinds _dense in env/eval/harness/executor.py's globals (reached from sys.modules["__main__"]
  // through the executor_loop function worker.py binds), which would describe no output of a timed
  // call to the evaluator while it returns zeros there. worker.py loads its modules by path beside itself; each one's globals are
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
  CHECK(v.message.find("executor._dense") != std::string::npos);
  CHECK(v.message.find("trial 0") != std::string::npos);
  CHECK_FALSE(v.has_speedup());
}
