// tests/integration/process.hpp: runs a program as a child process and captures its output.
#pragma once

#include <string>
#include <vector>

namespace crucible::testing {

struct process_result {
  int exit_code = -1; ///< exit status, or 128 + signal number
  std::string out;
  std::string err;
};

/// Runs `argv` (argv[0] is a path) in `cwd` (empty: inherit) to completion, feeding it no
/// input, and returns its exit code, stdout and stderr.
process_result run_process(const std::vector<std::string>& argv, const std::string& cwd = "");

/// A child process running alongside the test, its stdout and stderr on pipes.
class running_process {
public:
  /// Starts `argv` (argv[0] is a path) with no input.
  explicit running_process(const std::vector<std::string>& argv);
  running_process(const running_process&) = delete;
  running_process& operator=(const running_process&) = delete;
  /// Kills the child if it still runs, and reaps it.
  ~running_process();
  /// Waits at most `timeout_ms` for output on stdout, appending it to what `out` holds;
  /// true when some arrived. Output on stderr is kept for wait().
  bool read_some(int timeout_ms, std::string& out);
  /// Reads stdout into `out` until `out` contains `text` (true) or `timeout_ms` passed (false).
  bool read_until(const std::string& text, int timeout_ms, std::string& out);
  /// Sends signal `sig` to the child (SIGKILL, SIGSTOP, SIGCONT, SIGTERM...).
  void signal(int sig);
  /// The child's process id.
  int pid() const noexcept { return pid_; }
  /// Reads everything that is left and waits for the exit.
  process_result wait();

private:
  int pid_ = -1;
  int out_ = -1;
  int err_ = -1;
  std::string out_text_;
  std::string err_text_;
  bool out_eof_ = false;
  bool err_eof_ = false;
};

} // namespace crucible::testing
