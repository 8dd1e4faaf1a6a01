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

} // namespace crucible::testing
