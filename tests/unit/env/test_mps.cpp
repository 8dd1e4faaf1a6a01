// env/mps: when the evaluator starts its own CUDA MPS daemon, and what it says where it does not.
// The daemon itself needs a GPU machine (tools/bench/mps_boundary.sh); here, the decision and the
// refusal a machine without the control program gets.
#include <doctest/doctest.h>

#include <string>

#include "core/clock.hpp"
#include "core/log.hpp"
#include "env/mps.hpp"

using namespace crucible;
using namespace crucible::env;

TEST_CASE("evaluator.cuda_mps: auto starts the daemon only where every client can share it") {
  mps_facts f;
  f.cuda_device = true;
  f.program = "/usr/bin/nvidia-cuda-mps-control";
  auto d = decide_cuda_mps(cuda_mps_mode::auto_, f);
  CHECK(d.start);
  CHECK(d.why_not.empty());

  // Each reason not to, named; auto declines, on refuses.
  struct reason {
    const char* what;
    mps_facts facts;
    const char* names;
  };
  mps_facts root = f, none = f, started = f;
  root.root = true;
  none.program.clear();
  started.cuda_started = true;
  for (const auto& r : {reason{"root", root, "one user at a time"}, reason{"no program", none, "nvidia-cuda-mps-control was not found"},
                        reason{"CUDA started", started, "already started in this process"}}) {
    INFO(r.what);
    auto a = decide_cuda_mps(cuda_mps_mode::auto_, r.facts);
    CHECK_FALSE(a.start);
    CHECK_FALSE(a.refuse);
    CHECK_FALSE(a.quiet);
    CHECK(a.why_not.find(r.names) != std::string::npos);
    auto o = decide_cuda_mps(cuda_mps_mode::on, r.facts);
    CHECK_FALSE(o.start);
    CHECK(o.refuse);
    CHECK(o.why_not == a.why_not);
  }

  // A daemon of the user's own (CUDA_MPS_PIPE_DIRECTORY given): used, in either mode.
  mps_facts own = root;
  own.external_pipe = "/run/user/mps";
  for (auto mode : {cuda_mps_mode::auto_, cuda_mps_mode::on}) {
    auto u = decide_cuda_mps(mode, own);
    CHECK_FALSE(u.start);
    CHECK_FALSE(u.refuse);
    CHECK(u.why_not.find("/run/user/mps") != std::string::npos);
  }

  // off, and no CUDA device: nothing started, nothing said.
  auto off = decide_cuda_mps(cuda_mps_mode::off, f);
  CHECK_FALSE(off.start);
  CHECK(off.quiet);
  mps_facts cpu = f;
  cpu.cuda_device = false;
  auto c = decide_cuda_mps(cuda_mps_mode::on, cpu);
  CHECK_FALSE(c.start);
  CHECK_FALSE(c.refuse);
  CHECK(c.quiet);
}

TEST_CASE("evaluator.cuda_mps: on, where the daemon cannot start, refuses and names why, and CPU devices need none") {
  system_clock clk;
  logger log{clk, log_level::warn};
  evaluator_options opt;
  opt.cuda_mps = cuda_mps_mode::on;
  // CPU devices: nothing to do, whatever the mode.
  CHECK(prepare_cuda_mps(opt, {"cpu"}, log).ok());
  CHECK(cuda_mps_pipe().empty());
  // This machine (CI's kind) has no GPU driver: a CUDA device with cuda_mps on is refused, the
  // reason named (no control program, or root).
  auto r = prepare_cuda_mps(opt, {"cuda:0"}, log);
  if (r.ok()) {
    MESSAGE("this machine started an MPS daemon: " << cuda_mps_pipe());
    CHECK_FALSE(cuda_mps_pipe().empty());
    return;
  }
  INFO(r.error().message);
  CHECK(r.error().message.find("evaluator.cuda_mps is on, but ") == 0);
  CHECK(cuda_mps_pipe().empty());
  // Decided once a process: the same answer again.
  auto again = prepare_cuda_mps(opt, {"cuda:0"}, log);
  CHECK_FALSE(again.ok());
}
