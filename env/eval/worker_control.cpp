// A started worker's control from outside it: its processes enclosed in its control group, stopped
// and resumed (the clock's freeze and thaw), its CPU time read, and its memory read, located and
// written (the trust boundary's inputs and outputs). Starting, talking to and killing a worker:
// sandbox.cpp.
#include "env/eval/sandbox.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <signal.h>
#include <string>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace crucible::env {

namespace {

// Reads the pids in /proc/PID/task/TID/children into `out`.
void children_of(const std::filesystem::path& task, std::vector<pid_t>& out) {
  if (std::FILE* c = std::fopen((task / "children").c_str(), "r")) {
    long child = 0;
    while (std::fscanf(c, "%ld", &child) == 1)
      out.push_back(static_cast<pid_t>(child));
    std::fclose(c);
  }
}

// The state letter of /proc/PID/task/TID/stat ('R', 'S', 'T', ...), 0 where it cannot be read
// (a thread that has ended).
char task_state(const std::filesystem::path& task) {
  std::FILE* f = std::fopen((task / "stat").c_str(), "r");
  if (!f)
    return 0;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close = std::strrchr(buf, ')'); // the name may hold spaces and parentheses
  return close && close[1] && close[2] ? close[2] : 0;
}

// Sends `sig` to every process below `root` (its threads' children, theirs, ...) that is not
// stopped (SIGSTOP) or is stopped (SIGCONT), and for SIGSTOP reports whether every thread of
// them was stopped already. Every process of a worker's PID namespace descends from its PID 1
// (`root`): orphans are reparented to it, whatever session or group they made for themselves.
bool signal_tree(pid_t root, int sig) {
  bool all = true;
  std::vector<pid_t> todo{root};
  for (size_t k = 0; k < todo.size() && k < 4096; ++k) {
    const pid_t pid = todo[k];
    bool stopped = true;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
      const char st = task_state(e.path());
      if (st != 0 && st != 'T' && st != 't' && st != 'Z' && st != 'X')
        stopped = false;
      children_of(e.path(), todo);
    }
    if (ec)
      continue; // ended meanwhile
    if (sig == SIGSTOP && !stopped) {
      all = false;
      ::kill(pid, SIGSTOP);
    } else if (sig == SIGCONT) {
      ::kill(pid, SIGCONT);
    }
  }
  return all;
}

} // namespace

result<void> worker::enclose() {
  auto g = control_group::create("w" + std::to_string(pid_));
  if (!g)
    return g.error();
  // The keeper first, then every process below it, walked again until none is outside: a process
  // forked after its parent moved is born inside. The worker has said `started` and waits for its
  // next command: only the harness's own processes exist, none of them forking.
  for (int pass = 0; pass < 20; ++pass) {
    std::vector<pid_t> tree{pid_};
    for (size_t k = 0; k < tree.size() && k < 4096; ++k) {
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(tree[k]) + "/task", ec))
        children_of(e.path(), tree);
    }
    bool all = true;
    for (const pid_t p : tree) {
      if ((*g)->holds(p))
        continue;
      all = false;
      if (auto r = (*g)->adopt(p); !r && ::kill(p, 0) == 0)
        return r.error();
    }
    if (all) {
      group_ = std::move(*g);
      return {};
    }
  }
  return fail(errc::io, "worker ", std::to_string(pid_), "'s processes kept escaping its control group");
}

result<void> worker::freeze(std::chrono::steady_clock::time_point* stopped_at, std::chrono::microseconds timeout) {
  if (group_) {
    // The kernel's freezer: every process of the group, whatever it made of its session, group or
    // parent, and whatever it forks meanwhile.
    if (stopped_at)
      *stopped_at = std::chrono::steady_clock::now();
    if (auto r = group_->freeze(timeout); !r)
      return fail(errc::io, "cannot stop worker ", std::to_string(pid_), ": ", r.error().message);
    return {};
  }
  // The group first (one signal reaches every process that kept it), then every process of the
  // worker's tree, until a walk finds nothing running.
  if (::kill(-pid_, SIGSTOP) != 0)
    return fail(errc::io, "cannot stop worker ", std::to_string(pid_), ": ", std::strerror(errno));
  if (stopped_at)
    *stopped_at = std::chrono::steady_clock::now();
  const pid_t inner = inner_pid();
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (int spins = 0; !signal_tree(inner, SIGSTOP); ++spins) {
    if (std::chrono::steady_clock::now() >= until)
      return fail(errc::io, "worker ", std::to_string(inner), " still runs ", std::to_string(timeout.count()),
                  " us after SIGSTOP");
    if (spins < 100)
      sched_yield();
    else
      ::usleep(100); // a thread waiting for a core: let it have ours
  }
  return {};
}

result<void> worker::thaw() {
  if (group_) {
    if (auto r = group_->thaw(); !r)
      return fail(errc::io, "cannot continue worker ", std::to_string(pid_), ": ", r.error().message);
    return {};
  }
  if (::kill(-pid_, SIGCONT) != 0)
    return fail(errc::io, "cannot continue worker ", std::to_string(pid_), ": ", std::strerror(errno));
  (void) signal_tree(inner_pid(), SIGCONT); // those that left the group
  return {};
}

result<std::uint64_t> worker::cpu_ns() {
  if (group_) {
    if (reap(false))
      return fail(errc::io, "cannot read the CPU time of worker ", std::to_string(pid_), ": it has ended");
    return group_->cpu_ns();
  }
  static const double ns_per_tick = 1e9 / static_cast<double>(::sysconf(_SC_CLK_TCK));
  const pid_t root = inner_pid();
  std::uint64_t total = 0;
  std::vector<pid_t> todo{root};
  for (size_t k = 0; k < todo.size() && k < 4096; ++k) {
    const pid_t pid = todo[k];
    const auto dir = "/proc/" + std::to_string(pid);
    // Its own threads', ended ones included (the process's CPU clock, in ns).
    clockid_t id{};
    timespec ts{};
    const bool clocked = ::clock_getcpuclockid(pid, &id) == 0 && ::clock_gettime(id, &ts) == 0;
    if (clocked)
      total += static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
    // Its reaped children's (fields 16 and 17 of its stat, in clock ticks), and its own from there
    // where its clock cannot be read.
    if (std::FILE* f = std::fopen((dir + "/stat").c_str(), "r")) {
      char buf[1024];
      const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
      std::fclose(f);
      buf[n] = 0;
      if (const char* close = std::strrchr(buf, ')')) { // the name may hold spaces and parentheses
        unsigned long long field[15] = {};
        int got = 0;
        const char* p = close + 1;
        for (; got < 15 && *p; ++got) { // fields 3 to 17
          while (*p == ' ')
            ++p;
          field[got] = std::strtoull(p, nullptr, 10);
          while (*p && *p != ' ')
            ++p;
        }
        if (got == 15) {
          const unsigned long long ticks = field[13] + field[14] + (clocked ? 0 : field[11] + field[12]);
          total += static_cast<std::uint64_t>(static_cast<double>(ticks) * ns_per_tick);
        }
      }
    } else if (pid == root) {
      return fail(errc::io, "cannot read the CPU time of worker ", std::to_string(root), ": it has ended");
    }
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir + "/task", ec))
      children_of(e.path(), todo);
  }
  return total;
}

result<void> worker::read_memory(std::uint64_t addr, std::size_t n, std::byte* out) {
  const pid_t inner = inner_pid();
  size_t done = 0;
  while (done < n) {
    iovec local{out + done, n - done};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr + done)), n - done};
    const ssize_t got = ::process_vm_readv(inner, &local, 1, &remote, 1, 0);
    if (got <= 0)
      return fail(errc::io, "cannot read ", std::to_string(n), " bytes at ", std::to_string(addr), " of worker ",
                  std::to_string(inner), ": ", got < 0 ? std::strerror(errno) : "nothing read");
    done += static_cast<size_t>(got);
  }
  return {};
}

result<std::vector<std::uint64_t>> worker::page_frames(std::uint64_t addr, std::size_t n) {
  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<std::uint64_t> frames;
  if (n == 0)
    return frames;
  const std::uint64_t first = addr / page, last = (addr + n - 1) / page;
  frames.resize(last - first + 1);
  const auto path = "/proc/" + std::to_string(inner_pid()) + "/pagemap";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return fail(errc::io, "cannot open ", path, ": ", std::strerror(errno));
  std::vector<std::uint64_t> entries(frames.size());
  std::size_t done = 0;
  while (done < entries.size()) {
    const auto got = ::pread(fd, entries.data() + done, (entries.size() - done) * 8, static_cast<off_t>((first + done) * 8));
    if (got <= 0)
      break;
    done += static_cast<std::size_t>(got) / 8;
  }
  ::close(fd);
  // Bit 63: present; bits 0-54: the frame (0 where this process may not see frames).
  for (std::size_t i = 0; i < done; ++i)
    frames[i] = (entries[i] >> 63) != 0 ? entries[i] & ((1ull << 55) - 1) : 0;
  return frames;
}

result<void> worker::write_memory(std::uint64_t addr, const std::byte* data, std::size_t n) {
  const pid_t inner = inner_pid();
  size_t done = 0;
  while (done < n) {
    iovec local{const_cast<std::byte*>(data + done), n - done};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr + done)), n - done};
    const ssize_t put = ::process_vm_writev(inner, &local, 1, &remote, 1, 0);
    if (put <= 0)
      return fail(errc::io, "cannot write ", std::to_string(n), " bytes at ", std::to_string(addr), " of worker ",
                  std::to_string(inner), ": ", put < 0 ? std::strerror(errno) : "nothing written");
    done += static_cast<size_t>(put);
  }
  return {};
}

} // namespace crucible::env
