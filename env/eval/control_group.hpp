// env/eval/control_group.hpp: one worker's control group (cgroup v2). The kernel's own accounting of
// everything the worker starts: its CPU time (reaped or not, walked or not) and its stop and
// continuation as one (the freezer). env/eval/sandbox.cpp puts each worker in one; the evaluator's
// clock charges a timed sample what the group ran (docs/evaluator.md, Trust boundary).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace crucible::env {

/// A cgroup v2 group made for one worker, beneath this process's own group in the cgroup2
/// hierarchy: `<mount>/<own group>/crucible-<pid>/<name>`. A process put in it cannot leave it
/// (a confined worker is `nobody`, with every mount read-only), and every process or thread it
/// starts is born in it. Owns the directory: the destructor kills what is left in the group and
/// removes it (or leaves it for reclaim_control_groups() where a process has not ended within a
/// second). Not thread-safe: one thread at a time, ownership may move between threads.
class control_group final {
public:
  /// Makes the group. Errors: no cgroup2 hierarchy this process may write (available() says why).
  static result<std::unique_ptr<control_group>> create(const std::string& name);
  /// Whether groups can be made here: empty when they can, else why not (no cgroup2 mount, a
  /// read-only one, no permission, a kernel without the freezer). Probed once, then remembered.
  static std::string unavailable_reason();

  ~control_group();
  control_group(const control_group&) = delete;
  control_group& operator=(const control_group&) = delete;

  /// Moves process `pid` (all its threads) into the group. Errors name the pid and the reason.
  result<void> adopt(pid_t pid);
  /// Whether `pid` is in this group (its /proc/PID/cgroup names it).
  bool holds(pid_t pid) const;
  /// The CPU time (ns, at microsecond resolution) every process and thread that was ever in the
  /// group has run: ended ones, reaped or not, included (cpu.stat's usage_usec).
  result<std::uint64_t> cpu_ns() const;
  /// Freezes every process of the group and waits, `timeout` at most, until the kernel says the
  /// whole group is frozen (cgroup.events). A process forked meanwhile is born frozen.
  result<void> freeze(std::chrono::microseconds timeout);
  /// Lets the group run again.
  result<void> thaw();
  /// SIGKILL to every process of the group (cgroup.kill, or each listed process on kernels
  /// before 5.14).
  void kill();
  /// Whether any process is left in the group (cgroup.events' populated).
  bool populated() const;

  const std::filesystem::path& path() const noexcept { return dir_; }

private:
  control_group() = default;
  result<void> write(const char* file, const std::string& text) const;

  std::filesystem::path dir_;
  int freeze_fd_ = -1;
  int events_fd_ = -1;
  int stat_fd_ = -1;
};

/// Removes the groups under this process's own group that an evaluator killed with -9 left
/// behind (`crucible-<pid>` of a pid that no longer runs): kills what is left in them and removes
/// them. Returns how many were removed.
std::size_t reclaim_control_groups();

} // namespace crucible::env
