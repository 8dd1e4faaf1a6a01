// env/mps: when the evaluator starts its own CUDA MPS daemon, and what it says where it does not.
// The daemon itself needs a GPU machine (tools/bench/mps_boundary.sh); here, the decision and the
// refusal a machine without the control program gets.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/clock.hpp"
#include "core/log.hpp"
#include "env/eval/device/mps.hpp"

using namespace crucible;
using namespace crucible::env;

TEST_CASE("evaluator.cuda_mps: auto starts the daemon where its control program is, as root too") {
  mps_facts f;
  f.cuda_device = true;
  f.program = "/usr/bin/nvidia-cuda-mps-control";
  auto d = decide_cuda_mps(cuda_mps_mode::auto_, f);
  CHECK(d.start);
  CHECK(d.why_not.empty());

  // Without the program: auto declines with the reason, on refuses with the same.
  mps_facts none = f;
  none.program.clear();
  auto a = decide_cuda_mps(cuda_mps_mode::auto_, none);
  CHECK_FALSE(a.start);
  CHECK_FALSE(a.refuse);
  CHECK_FALSE(a.quiet);
  CHECK(a.why_not.find("nvidia-cuda-mps-control was not found") != std::string::npos);
  auto o = decide_cuda_mps(cuda_mps_mode::on, none);
  CHECK_FALSE(o.start);
  CHECK(o.refuse);
  CHECK(o.why_not == a.why_not);

  // The clients' user: the workers' (nobody as root), this process's own otherwise.
  const auto who = mps_client_identity();
  if (::geteuid() == 0)
    CHECK(who.uid != static_cast<uid_t>(-1));
  else
    CHECK(who.uid == static_cast<uid_t>(-1));

  // A daemon of the user's own (CUDA_MPS_PIPE_DIRECTORY given): used, in either mode.
  mps_facts own = f;
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
  // reason named (no control program; or, where there is one, the device agent that cannot open
  // the device).
  auto r = prepare_cuda_mps(opt, {"cuda:0"}, log);
  if (r.ok()) {
    MESSAGE("this machine started an MPS daemon: " << cuda_mps_pipe());
    CHECK_FALSE(cuda_mps_pipe().empty());
    return;
  }
  INFO(r.error().message);
  CHECK(r.error().message.find("evaluator.cuda_mps") == 0);
  CHECK(cuda_mps_pipe().empty());
  // Decided once a process: the same answer again.
  auto again = prepare_cuda_mps(opt, {"cuda:0"}, log);
  CHECK_FALSE(again.ok());
  // A later evaluator of the same process that does not ask for MPS is not handed that refusal.
  opt.cuda_mps = cuda_mps_mode::off;
  CHECK(prepare_cuda_mps(opt, {"cuda:0"}, log).ok());
  CHECK(prepare_cuda_mps(opt, {"cpu"}, log).ok());
  opt.cuda_mps = cuda_mps_mode::on;
  CHECK_FALSE(prepare_cuda_mps(opt, {"cuda:0"}, log).ok());
}

TEST_CASE("evaluator.cuda_mps: off on a CUDA device warns that speedups across the boundary come out lower") {
  system_clock clk;
  const auto file = std::filesystem::temp_directory_path() / ("crucible-mps-warn-" + std::to_string(::getpid()) + ".log");
  std::filesystem::remove(file);
  auto lines = [&] {
    std::ifstream in{file};
    return std::string{std::istreambuf_iterator<char>(in), {}};
  };
  {
    logger log{clk, log_level::off};
    REQUIRE(log.open_file(file, log_level::info).ok());
    evaluator_options opt;
    opt.cuda_mps = cuda_mps_mode::off;
    CHECK(prepare_cuda_mps(opt, {"cuda:0"}, log).ok());
    CHECK(prepare_cuda_mps(opt, {"cpu"}, log).ok()); // no CUDA device: nothing to say
  }
  const auto text = lines();
  CHECK(text.find("WARN") != std::string::npos);
  CHECK(text.find("evaluator.cuda_mps is off") != std::string::npos);
  CHECK(text.find("lowers their speedups") != std::string::npos);
  CHECK(text.find("lowers their speedups") == text.rfind("lowers their speedups")); // once: the CPU call said nothing
  std::filesystem::remove(file);
}
