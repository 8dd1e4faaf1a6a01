// The workers' control groups (env/eval/control_group.hpp): cgroup v2's core files only (cgroup.procs,
// cgroup.freeze, cgroup.events, cgroup.kill, cpu.stat), which every non-root group has without
// any controller enabled, so a group can be made wherever this process may write its own.
#include "env/eval/control_group.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace crucible::env {

namespace fs = std::filesystem;

namespace {

// Reads a small file of the group (a pread from 0 where `fd` is kept open).
std::string read_small(int fd) {
  char buf[4096];
  const auto n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string{};
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The undoing of mountinfo's octal escapes (\040 for a space).
std::string unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const auto oct = s.substr(i + 1, 3);
      if (oct.size() == 3 && oct.find_first_not_of("01234567") == std::string::npos) {
        out += static_cast<char>(std::stoi(oct, nullptr, 8));
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// This process's own group's directory in the cgroup2 hierarchy, or why there is none.
result<fs::path> own_group_dir() {
  std::string own;
  {
    std::istringstream lines(read_file("/proc/self/cgroup"));
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("0::", 0) == 0)
        own = line.substr(3);
  }
  if (own.empty())
    return fail(errc::unsupported, "this process is in no cgroup v2 group (/proc/self/cgroup has no 0:: line)");
  std::istringstream lines(read_file("/proc/self/mountinfo"));
  for (std::string line; std::getline(lines, line);) {
    const auto dash = line.find(" - ");
    if (dash == std::string::npos)
      continue;
    std::istringstream after(line.substr(dash + 3));
    std::string fstype;
    after >> fstype;
    if (fstype != "cgroup2")
      continue;
    std::istringstream before(line.substr(0, dash));
    std::string id, parent, devno, root, mountpoint, options;
    before >> id >> parent >> devno >> root >> mountpoint >> options;
    root = unescape(root);
    mountpoint = unescape(mountpoint);
    if (options.rfind("ro", 0) == 0 && (options.size() == 2 || options[2] == ','))
      return fail(errc::unsupported, "the cgroup2 hierarchy at ", mountpoint, " is mounted read-only");
    // The group's path is relative to the hierarchy's root; the mount may show a part of it.
    if (root != "/" && own.rfind(root, 0) != 0)
      return fail(errc::unsupported, "this process's group ", own, " lies outside the cgroup2 mount at ", mountpoint);
    const auto rel = root == "/" ? own : own.substr(root.size());
    return fs::path(mountpoint) / fs::path(rel).relative_path();
  }
  return fail(errc::unsupported, "no cgroup2 hierarchy is mounted (/proc/self/mountinfo)");
}

struct group_base {
  std::mutex mtx;
  bool probed = false;
  std::string why_not; // empty: groups can be made under `dir`
  fs::path dir;        // <own group>/crucible-<pid>
};

group_base& base() {
  static group_base b;
  return b;
}

std::atomic<std::uint64_t> group_counter{0};

bool wait_unpopulated(const fs::path& dir, std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  for (;;) {
    const auto ev = read_file(dir / "cgroup.events");
    if (ev.empty() || ev.find("populated 0") != std::string::npos)
      return true;
    if (std::chrono::steady_clock::now() >= until)
      return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void kill_listed(const fs::path& dir) {
  std::istringstream procs(read_file(dir / "cgroup.procs"));
  for (long pid = 0; procs >> pid;)
    if (pid > 0)
      ::kill(static_cast<pid_t>(pid), SIGKILL);
}

// SIGKILL to every process of the group at `dir`: cgroup.kill, or each listed process on kernels
// before 5.14.
void kill_group(const fs::path& dir) {
  std::ofstream k(dir / "cgroup.kill");
  if (k)
    k << "1" << std::flush;
  if (!k)
    kill_listed(dir);
}

// Kills everything in `dir` (a group of ours) and removes it once empty.
bool kill_and_remove(const fs::path& dir) {
  kill_group(dir);
  {
    std::ofstream thaw(dir / "cgroup.freeze"); // a frozen process dies all the same; thawed, at once
    if (thaw)
      thaw << "0";
  }
  wait_unpopulated(dir, std::chrono::milliseconds(1000));
  return ::rmdir(dir.c_str()) == 0 || errno == ENOENT;
}

// Makes the base directory and checks, with a process of our own, that a process can be moved
// into a group there, frozen, and charged.
std::string probe(fs::path& dir) {
  auto own = own_group_dir();
  if (!own)
    return own.error().message;
  dir = *own / ("crucible-" + std::to_string(::getpid()));
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return "cannot make " + dir.string() + ": " + std::strerror(errno);
  const auto test = dir / "probe";
  if (::mkdir(test.c_str(), 0755) != 0 && errno != EEXIST)
    return "cannot make " + test.string() + ": " + std::strerror(errno);
  std::string why;
  if (!fs::exists(test / "cgroup.freeze"))
    why = "the kernel's cgroup v2 has no freezer (cgroup.freeze; Linux 5.2 or later)";
  else if (!fs::exists(test / "cpu.stat"))
    why = "the kernel's cgroup v2 has no cpu.stat";
  if (why.empty()) {
    const pid_t child = ::fork();
    if (child == 0) {
      for (;;)
        ::pause(); // async-signal-safe only: this process is multithreaded
    }
    if (child < 0) {
      why = std::string{"fork: "} + std::strerror(errno);
    } else {
      {
        std::ofstream procs(test / "cgroup.procs");
        procs << child;
        procs.flush();
        if (!procs)
          why = "cannot move a process into " + test.string() + " (permission, or a group that delegates no moves)";
      }
      ::kill(child, SIGKILL);
      int status = 0;
      while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  wait_unpopulated(test, std::chrono::milliseconds(1000));
  ::rmdir(test.c_str());
  return why;
}

} // namespace

std::string control_group::unavailable_reason() {
  auto& b = base();
  std::lock_guard lock{b.mtx};
  if (!b.probed) {
    b.why_not = probe(b.dir);
    b.probed = true;
    // The base goes with this process where its groups went before it (a group whose process
    // outlives its owner is left for reclaim_control_groups()).
    std::atexit([] { ::rmdir(base().dir.c_str()); });
  }
  return b.why_not;
}

result<std::unique_ptr<control_group>> control_group::create(const std::string& name) {
  if (auto why = unavailable_reason(); !why.empty())
    return fail(errc::unsupported, "no control group for a worker: ", why);
  std::unique_ptr<control_group> g{new control_group()};
  g->dir_ = base().dir / (name + "-" + std::to_string(group_counter.fetch_add(1)));
  if (::mkdir(g->dir_.c_str(), 0755) != 0)
    return fail(errc::io, "cannot make the control group ", g->dir_.string(), ": ", std::strerror(errno));
  g->freeze_fd_ = ::open((g->dir_ / "cgroup.freeze").c_str(), O_RDWR | O_CLOEXEC);
  g->events_fd_ = ::open((g->dir_ / "cgroup.events").c_str(), O_RDONLY | O_CLOEXEC);
  g->stat_fd_ = ::open((g->dir_ / "cpu.stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (g->freeze_fd_ < 0 || g->events_fd_ < 0 || g->stat_fd_ < 0)
    return fail(errc::io, "cannot open the files of control group ", g->dir_.string(), ": ", std::strerror(errno));
  return g;
}

control_group::~control_group() {
  for (int fd : {freeze_fd_, events_fd_, stat_fd_})
    if (fd >= 0)
      ::close(fd);
  if (!dir_.empty())
    (void) kill_and_remove(dir_);
}

result<void> control_group::write(const char* file, const std::string& text) const {
  const int fd = ::open((dir_ / file).c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return fail(errc::io, "cannot open ", (dir_ / file).string(), ": ", std::strerror(errno));
  const auto n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size()))
    return fail(errc::io, "cannot write ", text, " to ", (dir_ / file).string(), ": ", std::strerror(err));
  return {};
}

result<void> control_group::adopt(pid_t pid) {
  if (auto r = write("cgroup.procs", std::to_string(pid)); !r)
    return fail(errc::io, "cannot move process ", std::to_string(pid), " into its control group: ", r.error().message);
  return {};
}

bool control_group::holds(pid_t pid) const {
  const auto text = read_file("/proc/" + std::to_string(pid) + "/cgroup");
  std::istringstream lines(text);
  const auto name = dir_.filename().string();
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("0::", 0) == 0) {
      const auto p = line.substr(3);
      return p.size() >= name.size() + 1 && p.compare(p.size() - name.size(), name.size(), name) == 0
             && p[p.size() - name.size() - 1] == '/';
    }
  return false;
}

result<std::uint64_t> control_group::cpu_ns() const {
  const auto text = read_small(stat_fd_);
  const auto at = text.find("usage_usec ");
  if (at == std::string::npos)
    return fail(errc::io, "cannot read the CPU time of control group ", dir_.string());
  return static_cast<std::uint64_t>(std::strtoull(text.c_str() + at + 11, nullptr, 10)) * 1000ull;
}

result<void> control_group::freeze(std::chrono::microseconds timeout) {
  if (::pwrite(freeze_fd_, "1", 1, 0) != 1)
    return fail(errc::io, "cannot freeze control group ", dir_.string(), ": ", std::strerror(errno));
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (int spins = 0;; ++spins) {
    const auto ev = read_small(events_fd_);
    if (ev.find("frozen 1") != std::string::npos)
      return {};
    if (ev.find("populated 0") != std::string::npos)
      return {}; // nothing left to freeze: the worker has ended, which its reader will see
    if (std::chrono::steady_clock::now() >= until)
      return fail(errc::io, "control group ", dir_.string(), " is not frozen ", std::to_string(timeout.count()),
                  " us after it was asked to be");
    if (spins < 100) {
      sched_yield();
    } else {
      // A thread waiting for a core: let it have ours. cgroup.events wakes a poll when it changes.
      struct pollfd p{events_fd_, POLLPRI, 0};
      (void) ::poll(&p, 1, 1);
    }
  }
}

result<void> control_group::thaw() {
  if (::pwrite(freeze_fd_, "0", 1, 0) != 1)
    return fail(errc::io, "cannot thaw control group ", dir_.string(), ": ", std::strerror(errno));
  return {};
}

void control_group::kill() {
  kill_group(dir_);
}

bool control_group::populated() const {
  return read_small(events_fd_).find("populated 1") != std::string::npos;
}

std::size_t reclaim_control_groups() {
  auto own = own_group_dir();
  if (!own)
    return 0;
  std::size_t removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it{*own, ec}, end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name.rfind("crucible-", 0) != 0 || !it->is_directory())
      continue;
    char* stop = nullptr;
    const long pid = std::strtol(name.c_str() + 9, &stop, 10);
    if (pid <= 0 || *stop != '\0' || pid == ::getpid())
      continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)
      continue; // its maker lives
    std::error_code sub;
    for (fs::directory_iterator g{it->path(), sub}, gend; !sub && g != gend; g.increment(sub))
      if (g->is_directory())
        (void) kill_and_remove(g->path());
    if (::rmdir(it->path().c_str()) == 0)
      ++removed;
  }
  return removed;
}

} // namespace crucible::env
