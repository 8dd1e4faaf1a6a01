// The sandbox with real processes: a probe script stands in for the harness and reports what
// the sandbox gave it (working directory, environment, network, limits, process group).
#include <doctest/doctest.h>

#include <zmq.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "env/eval/sandbox.hpp"
#include "env/eval/wire.hpp"

namespace fs = std::filesystem;
using namespace crucible::env;
using namespace std::chrono_literals;

namespace {

worker_spec probe_spec(const std::string& device = "cpu") {
  worker_spec spec;
  spec.python = CRUCIBLE_PYTHON;
  spec.harness = fs::path{CRUCIBLE_SOURCE_DIR} / "tests" / "unit" / "env" / "sandbox_probe.py";
  spec.device = device;
  spec.scratch_root = fs::temp_directory_path() / "crucible-test";
  spec.memory_limit_mb = 4096;
  return spec;
}

wire::node expect_message(worker& w, std::chrono::seconds within = 60s) {
  worker_message msg;
  auto got = w.receive(std::chrono::steady_clock::now() + within, msg);
  REQUIRE(got == receive_outcome::message);
  return wire::parse(msg.json);
}

bool process_gone(pid_t pid) {
  // Gone, or a zombie waiting for init: either way it runs no more.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat)
    return true;
  std::string line;
  std::getline(stat, line);
  auto close = line.rfind(')');
  return close != std::string::npos && line.size() > close + 2 && line[close + 2] == 'Z';
}

} // namespace

TEST_CASE("a worker runs in its scratch directory, with a scrubbed environment, limits and its own session") {
  ::setenv("CRUCIBLE_TEST_SECRET", "hunter2", 1);
  zmq::context_t ctx;
  auto w = worker::start(ctx, probe_spec());
  REQUIRE(w.ok());
  auto r = expect_message(**w);
  auto scratch = (*w)->scratch();
  CHECK(fs::equivalent(r["cwd"].as<std::string>(), scratch));
  CHECK(r["env"]["HOME"].as<std::string>() == scratch.string());
  CHECK(r["env"]["TMPDIR"].as<std::string>() == scratch.string());
  CHECK_FALSE(r["env"]["CRUCIBLE_TEST_SECRET"].defined());
  CHECK(r["env"]["CUDA_VISIBLE_DEVICES"].as<std::string>() == "");
  CHECK(r["rlimit_core"].as<long>() == 0);
  CHECK(r["rlimit_as"].as<long long>() == 4096ll << 20);
  // No file larger than the scratch (evaluator.scratch_mb, 2048 by default), not 8 GiB.
  CHECK(r["rlimit_fsize"].as<long long>() == 2048ll << 20);
  CHECK(r["pid"].as<int>() == (*w)->pid());
  CHECK(r["pgid"].as<int>() == (*w)->pid());
  CHECK(r["sid"].as<int>() == (*w)->pid());
  CHECK(r["device"].as<std::string>() == "cpu");
  w->reset();
  CHECK_FALSE(fs::exists(scratch));
  ::unsetenv("CRUCIBLE_TEST_SECRET");
}

TEST_CASE("a CUDA worker sees exactly its one device and no address-space limit") {
  zmq::context_t ctx;
  auto w = worker::start(ctx, probe_spec("cuda:3"));
  REQUIRE(w.ok());
  auto r = expect_message(**w);
  CHECK(r["env"]["CUDA_VISIBLE_DEVICES"].as<std::string>() == "3");
  CHECK(r["device"].as<std::string>() == "cuda");
  CHECK(r["rlimit_as_unlimited"].as<bool>());
  CHECK_FALSE(r["env"]["CUDA_DEVICE_MAX_CONNECTIONS"].defined()); // 0: the driver's default
}

TEST_CASE("cuda_max_connections reaches a worker as CUDA_DEVICE_MAX_CONNECTIONS") {
  zmq::context_t ctx;
  auto spec = probe_spec("cuda:0");
  spec.cuda_max_connections = 2;
  auto w = worker::start(ctx, spec);
  REQUIRE(w.ok());
  auto r = expect_message(**w);
  REQUIRE(r["env"]["CUDA_DEVICE_MAX_CONNECTIONS"].defined());
  CHECK(r["env"]["CUDA_DEVICE_MAX_CONNECTIONS"].as<std::string>() == "2");
}

TEST_CASE("evaluator.huge_pages and cuda_own_device_only reach a worker as THP_MEM_ALLOC_ENABLE and CRUCIBLE_OWN_DEVICE_ONLY, each only when on") {
  zmq::context_t ctx;
  for (const bool on : {false, true}) {
    auto spec = probe_spec();
    spec.huge_pages = on;
    spec.own_device_only = !on; // each alone
    auto w = worker::start(ctx, spec);
    REQUIRE(w.ok());
    auto r = expect_message(**w);
    CHECK(r["env"]["THP_MEM_ALLOC_ENABLE"].defined() == on);
    CHECK(r["env"]["CRUCIBLE_OWN_DEVICE_ONLY"].defined() == !on);
    CHECK(r["env"][on ? "THP_MEM_ALLOC_ENABLE" : "CRUCIBLE_OWN_DEVICE_ONLY"].as<std::string>() == "1");
  }
}

TEST_CASE("exit codes and signals are reported, final messages are not lost") {
  zmq::context_t ctx;
  {
    auto w = worker::start(ctx, probe_spec());
    REQUIRE(w.ok());
    expect_message(**w);
    REQUIRE((*w)->send(R"({"type":"exit","code":3})").ok());
    CHECK(expect_message(**w)["type"].as<std::string>() == "bye");
    worker_message msg;
    CHECK((*w)->receive(std::chrono::steady_clock::now() + 60s, msg) == receive_outcome::died);
    CHECK((*w)->exit_description() == "exited with code 3");
    CHECK_FALSE((*w)->died_by_signal());
  }
  {
    auto w = worker::start(ctx, probe_spec());
    REQUIRE(w.ok());
    expect_message(**w);
    REQUIRE((*w)->send(R"({"type":"segv"})").ok());
    worker_message msg;
    CHECK((*w)->receive(std::chrono::steady_clock::now() + 60s, msg) == receive_outcome::died);
    CHECK((*w)->exit_description() == "killed by signal 11 (SIGSEGV)");
    CHECK((*w)->died_by_signal());
  }
}

TEST_CASE("a worker killed from outside stops taking messages, and ended() tells how it ended") {
  zmq::context_t ctx;
  auto w = worker::start(ctx, probe_spec());
  REQUIRE(w.ok());
  expect_message(**w);
  CHECK_FALSE((*w)->ended(std::chrono::steady_clock::now())); // alive: no wait, not ended
  ::kill((*w)->pid(), SIGKILL);                               // an operator, the OOM killer
  // Sends are queued until the connection's end is noticed: poll for the refusal, bounded.
  const auto refused_by = std::chrono::steady_clock::now() + 30s;
  bool refused = false;
  while (!refused && std::chrono::steady_clock::now() < refused_by)
    refused = !(*w)->send(R"({"type":"ping"})").ok();
  CHECK(refused);
  CHECK((*w)->ended(std::chrono::steady_clock::now() + 10s));
  CHECK((*w)->died_by_signal());
  CHECK((*w)->exit_signal() == SIGKILL);
  CHECK((*w)->exit_description().rfind("killed by signal 9 (SIGKILL)", 0) == 0);
}

TEST_CASE("binary frames arrive intact, empty ones included") {
  zmq::context_t ctx;
  auto w = worker::start(ctx, probe_spec());
  REQUIRE(w.ok());
  expect_message(**w);
  REQUIRE((*w)->send(R"({"type":"frames"})").ok());
  worker_message msg;
  REQUIRE((*w)->receive(std::chrono::steady_clock::now() + 60s, msg) == receive_outcome::message);
  REQUIRE(msg.frames.size() == 2);
  CHECK(msg.frames[0].size() == 3);
  CHECK(msg.frames[0][2] == std::byte{3});
  CHECK(msg.frames[1].empty());
}

TEST_CASE("a deadline passes without a message, and kill() ends the whole process group") {
  zmq::context_t ctx;
  auto w = worker::start(ctx, probe_spec());
  REQUIRE(w.ok());
  expect_message(**w);
  REQUIRE((*w)->send(R"({"type":"spawn"})").ok());
  auto grandchild = expect_message(**w)["pid"].as<int>();
  REQUIRE((*w)->send(R"({"type":"hang"})").ok());
  worker_message msg;
  auto t0 = std::chrono::steady_clock::now();
  CHECK((*w)->receive(t0 + 300ms, msg) == receive_outcome::deadline);
  CHECK(std::chrono::steady_clock::now() - t0 >= 300ms);
  (*w)->kill();
  CHECK((*w)->exit_description() == "killed by signal 9 (SIGKILL)");
  CHECK_FALSE((*w)->died_by_signal()); // we killed it
  // SIGKILL delivery and the reaping of the orphan are asynchronous: poll, bounded by a deadline
  // (200 yields were seen to be too few on a loaded 2-core machine), not a sleep.
  const auto gone_by = std::chrono::steady_clock::now() + 10s;
  while (!process_gone(grandchild) && std::chrono::steady_clock::now() < gone_by)
    std::this_thread::yield();
  CHECK(process_gone(grandchild));
}

TEST_CASE("a missing interpreter is an error naming it") {
  zmq::context_t ctx;
  auto spec = probe_spec();
  spec.python = "/nonexistent/python3";
  auto w = worker::start(ctx, spec);
  REQUIRE_FALSE(w.ok());
  CHECK(w.error().message.find("/nonexistent/python3") != std::string::npos);
}

namespace {

// The /proc view of another process: one line of /proc/PID/FILE that starts with `prefix`, or
// the whole file with NULs as newlines (environ).
std::string proc_text(pid_t pid, const char* file) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::replace(text.begin(), text.end(), '\0', '\n');
  return text;
}

// Fields 4 (ppid), 5 (pgrp) and 6 (session) of /proc/PID/stat.
std::array<long, 3> parent_group_session(pid_t pid) {
  auto stat = proc_text(pid, "stat");
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string state;
  std::array<long, 3> out{};
  rest >> state >> out[0] >> out[1] >> out[2];
  return out;
}

worker_spec harness_spec() {
  auto spec = probe_spec();
  spec.harness = fs::path{CRUCIBLE_SOURCE_DIR} / "env" / "eval" / "harness" / "worker.py";
  spec.memory_limit_mb = 16384;
  return spec;
}

} // namespace

TEST_CASE("a worker forked from the zygote gets the sandbox of an executed one, and its own network") {
  ::setenv("CRUCIBLE_TEST_SECRET", "hunter2", 1);
  auto spec = harness_spec();
  auto z = zygote::start(spec, 180s);
  REQUIRE_MESSAGE(z.ok(), z.error().message);
  zmq::context_t ctx;
  auto a = worker::fork_from(**z, ctx, spec);
  REQUIRE_MESSAGE(a.ok(), a.error().message);
  auto b = worker::fork_from(**z, ctx, spec);
  REQUIRE_MESSAGE(b.ok(), b.error().message);
  for (auto* w : {a->get(), b->get()}) {
    CHECK(w->forked());
    auto started = expect_message(*w);
    CHECK(started["type"].as<std::string>() == "started");
    // The worker confined itself: every layer in force on this machine (a machine without one
    // fails here, as evaluator.isolation strict would refuse it). pid() is the sandbox's
    // keeper; the worker is PID 1 of its own PID namespace.
    auto iso = parse_isolation(started["isolation"]);
    CHECK_MESSAGE(iso.missing.empty(), iso.missing_text());
    CHECK(std::find(iso.layers.begin(), iso.layers.end(), "pid-namespace") != iso.layers.end());
    CHECK(started["pid"].as<int>() == 1);
    const auto pid = w->pid();
    CHECK(fs::equivalent(fs::read_symlink("/proc/" + std::to_string(pid) + "/cwd"), w->scratch()));
    // /proc shows the environment the zygote was executed with (the worker replaces it in
    // Python; test_evaluator checks what a candidate sees): scrubbed all the same.
    auto environ = "\n" + proc_text(pid, "environ");
    CHECK(environ.find("\nCUDA_VISIBLE_DEVICES=\n") != std::string::npos);
    CHECK(environ.find("CRUCIBLE_TEST_SECRET") == std::string::npos);
    auto [ppid, pgrp, session] = parent_group_session(pid);
    CHECK(ppid == (*z)->pid()); // the zygote's child, not ours
    CHECK(pgrp == pid);
    CHECK(session == pid);
    auto limits = proc_text(pid, "limits");
    CHECK(limits.find("Max core file size        0") != std::string::npos);
    CHECK(limits.find(std::to_string(16384ll << 20)) != std::string::npos); // the address-space limit
  }
  CHECK((*a)->scratch() != (*b)->scratch());
  {
    auto net = [](pid_t pid) { return fs::read_symlink("/proc/" + std::to_string(pid) + "/ns/net"); };
    CHECK(net((*a)->pid()) != net((*b)->pid()));
    CHECK(net((*a)->pid()) != net((*z)->pid()));
    CHECK(net((*z)->pid()) != net(::getpid()));
  }
  // The exit status comes through the zygote; a worker's end ends only that worker. The keeper
  // dies here, not the worker inside its PID namespace (PID 1 there, running as nobody when we
  // are root): that worker must not outlive its keeper.
  const auto keeper = (*a)->pid();
  const auto inner = proc_text(keeper, ("task/" + std::to_string(keeper) + "/children").c_str());
  REQUIRE_FALSE(inner.empty());
  const pid_t inner_pid = std::stoi(inner);
  ::kill(keeper, SIGSEGV);
  worker_message msg;
  CHECK((*a)->receive(std::chrono::steady_clock::now() + 60s, msg) == receive_outcome::died);
  CHECK((*a)->exit_description() == "killed by signal 11 (SIGSEGV)");
  CHECK((*a)->died_by_signal());
  const auto gone_by = std::chrono::steady_clock::now() + 10s;
  while (!process_gone(inner_pid) && std::chrono::steady_clock::now() < gone_by)
    std::this_thread::yield();
  CHECK(process_gone(inner_pid));
  auto scratch = (*b)->scratch();
  const auto b_pid = (*b)->pid();
  // Device initialisation, one step at a time at our word.
  REQUIRE((*b)->send(R"({"type":"init"})").ok());
  CHECK(expect_message(**b)["type"].as<std::string>() == "driver");
  REQUIRE((*b)->send(R"({"type":"context"})").ok());
  CHECK(expect_message(**b)["type"].as<std::string>() == "context");
  CHECK(expect_message(**b)["type"].as<std::string>() == "ready");
  (*b)->kill();
  CHECK((*b)->exit_description() == "killed by signal 9 (SIGKILL)");
  CHECK_FALSE((*b)->died_by_signal());
  CHECK(process_gone(b_pid));
  b->reset();
  CHECK_FALSE(fs::exists(scratch));
  CHECK((*z)->alive());
  ::unsetenv("CRUCIBLE_TEST_SECRET");
}

TEST_CASE("scratch folders of makers that no longer run are reclaimed, a living maker's and other folders are not") {
  const auto root = fs::temp_directory_path() / ("crucible-reclaim-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  // A pid that no longer runs: a child that has exited and been reaped.
  pid_t dead = ::fork();
  if (dead == 0)
    ::_exit(0);
  REQUIRE(dead > 0);
  int status = 0;
  REQUIRE(::waitpid(dead, &status, 0) == dead);
  const auto me = std::to_string(::getpid());
  const auto gone_w = root / ("w" + std::to_string(dead) + "-3-AbC123");
  const auto gone_z = root / ("z" + std::to_string(dead) + "-0-xYz789");
  const auto alive = root / ("w" + me + "-1-QwErTy");
  const auto other = root / "notes";
  const auto odd = root / ("w" + std::to_string(dead) + "-x-AbC123");
  for (const auto& d : {gone_w, gone_z, alive, other, odd})
    fs::create_directories(d / "sub");
  std::ofstream(gone_w / "sub" / "worker.log") << std::string(5000, 'x');
  std::ofstream(gone_z / "task.py") << "print(1)\n";
  auto r = reclaim_scratch(root);
  CHECK(r.removed == 2);
  CHECK(r.failed == 0);
  CHECK(r.bytes == 5000 + 9);
  CHECK_FALSE(fs::exists(gone_w));
  CHECK_FALSE(fs::exists(gone_z));
  CHECK(fs::exists(alive));
  CHECK(fs::exists(other));
  CHECK(fs::exists(odd));
  // A root that does not exist is nothing to reclaim.
  CHECK(reclaim_scratch(root / "none").removed == 0);
  fs::remove_all(root);
}
