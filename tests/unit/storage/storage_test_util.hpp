// tests/unit/storage/storage_test_util.hpp: a private temp directory per test, and child-process
// helpers for the crash and lock tests.
#pragma once

#include "tests/test_util/temp_dir.hpp"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace crucible::storage::test {

using crucible::testing::temp_dir;

/// waitpid that retries EINTR; returns the raw status, or -1 on failure.
inline int wait_child(pid_t pid) {
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  return r == pid ? status : -1;
}

/// Owns a forked child: SIGKILLs and reaps it on destruction unless reaped already, so a failed
/// REQUIRE in the parent never leaves a child behind holding a lock or ctest's output pipe.
class child_guard final {
public:
  explicit child_guard(pid_t pid) : pid_(pid) {}
  child_guard(const child_guard&) = delete;
  child_guard& operator=(const child_guard&) = delete;
  ~child_guard() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait_child(pid_);
    }
  }
  /// Kills the child and returns its wait status.
  int kill_and_wait() {
    ::kill(pid_, SIGKILL);
    return reaped(wait_child(pid_));
  }
  /// Records that the child was reaped elsewhere; returns `status`.
  int reaped(int status) {
    pid_ = -1;
    return status;
  }

private:
  pid_t pid_;
};

/// Call first in a forked child: it dies with the test process instead of outliving it.
inline void die_with_parent() { ::prctl(PR_SET_PDEATHSIG, SIGKILL); }

/// Number of entries directly in `dir`.
inline std::size_t entry_count(const std::filesystem::path& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

} // namespace crucible::storage::test
