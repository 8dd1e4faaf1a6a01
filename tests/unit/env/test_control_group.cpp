// env/control_group: the kernel's accounting and freezer for one worker's processes, with real
// processes. Skipped (with the reason) where this machine gives no cgroup v2 group to write.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <filesystem>
#include <thread>

#include "env/eval/control_group.hpp"

using namespace crucible::env;

namespace {

// Burns `ms` of CPU time in this process.
void burn(double ms) {
  timespec t0{}, t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
  volatile double x = 1;
  for (;;) {
    for (int i = 0; i < 10000; ++i)
      x = x * 1.0000001 + 1e-9;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    if ((t.tv_sec - t0.tv_sec) * 1e3 + (t.tv_nsec - t0.tv_nsec) / 1e6 >= ms)
      return;
  }
}

// A process that waits for a byte on `go`, then makes a child with SIGCHLD ignored (the kernel
// reaps it at once: its CPU time goes to no one's reaped-children clock) that burns 200 ms and
// exits, waits for it to end, and sleeps until killed. Returns its pid.
pid_t start_hidden_worker(int go) {
  const pid_t p = ::fork();
  if (p == 0) {
    char c;
    if (::read(go, &c, 1) != 1)
      ::_exit(1);
    ::signal(SIGCHLD, SIG_IGN);
    const pid_t child = ::fork();
    if (child == 0) {
      burn(200);
      ::_exit(0);
    }
    while (::kill(child, 0) == 0)
      ::usleep(1000);
    for (;;)
      ::pause();
  }
  return p;
}

} // namespace

TEST_CASE("a control group charges the CPU time of a child the kernel reaped by itself, and freezes every process") {
  if (auto why = control_group::unavailable_reason(); !why.empty()) {
    MESSAGE("skipped: ", why);
    return;
  }
  auto g = control_group::create("test");
  REQUIRE_MESSAGE(g.ok(), g.error().message);
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t w = start_hidden_worker(pipefd[0]);
  REQUIRE(w > 0);
  REQUIRE((*g)->adopt(w).ok());
  CHECK((*g)->holds(w));
  CHECK_FALSE((*g)->holds(::getpid()));
  const auto before = (*g)->cpu_ns();
  REQUIRE(before.ok());
  REQUIRE(::write(pipefd[1], "x", 1) == 1);
  // Until the child has ended: the worker then sleeps. Its own clocks and its reaped children's
  // show none of the 200 ms; the group's does.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::uint64_t ran = 0;
  while (std::chrono::steady_clock::now() < until) {
    ran = *(*g)->cpu_ns() - *before;
    if (ran >= 190'000'000ull)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(ran >= 190'000'000ull);
  // Frozen, nothing of it runs; thawed, it answers signals again.
  REQUIRE((*g)->freeze(std::chrono::seconds(5)).ok());
  std::ifstream events((*g)->path() / "cgroup.events");
  std::string text((std::istreambuf_iterator<char>(events)), {});
  CHECK(text.find("frozen 1") != std::string::npos);
  REQUIRE((*g)->thaw().ok());
  // kill() ends every process of the group.
  (*g)->kill();
  int status = 0;
  REQUIRE(::waitpid(w, &status, 0) == w);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  // The kernel takes a process out of its group's count a moment after its parent has reaped it.
  const auto gone = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while ((*g)->populated() && std::chrono::steady_clock::now() < gone)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK_FALSE((*g)->populated());
  const auto dir = (*g)->path();
  g->reset();
  CHECK_FALSE(std::filesystem::exists(dir)); // removed with its owner
  ::close(pipefd[0]);
  ::close(pipefd[1]);
}

TEST_CASE("a process forked inside a frozen group is born frozen, and its CPU time is the group's") {
  if (auto why = control_group::unavailable_reason(); !why.empty()) {
    MESSAGE("skipped: ", why);
    return;
  }
  auto g = control_group::create("test");
  REQUIRE_MESSAGE(g.ok(), g.error().message);
  // A process that forks children in a loop, each burning 5 ms: a walk of the tree would meet
  // few of them alive.
  const pid_t w = ::fork();
  if (w == 0) {
    ::signal(SIGCHLD, SIG_IGN);
    for (;;) {
      if (::fork() == 0) {
        burn(5);
        ::_exit(0);
      }
      ::usleep(2000);
    }
  }
  REQUIRE((*g)->adopt(w).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE((*g)->freeze(std::chrono::seconds(5)).ok());
  const auto a = (*g)->cpu_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto b = (*g)->cpu_ns();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*a == *b); // frozen: nothing of it runs, born before or during the freeze
  CHECK(*a >= 50'000'000ull); // the children's 5 ms each, reaped by the kernel
  (*g)->kill();
  int status = 0;
  CHECK(::waitpid(w, &status, 0) == w);
}
