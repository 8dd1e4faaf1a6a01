// tools/crucible/child_process.hpp: the commands' child processes (the report's plotting script,
// the run's TensorBoard writer): started with posix_spawn, stdin from /dev/null, with the default
// signal mask and dispositions (a run blocks its pause signals in every thread).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "env/eval/worker_pool.hpp"

namespace crucible::cli {

/// Starts argv[0] (a path) with stdout on `out_fd` and stderr on `err_fd` (-1: /dev/null), in a
/// process group of its own where `own_group`; its pid, or -1 where it could not start.
pid_t spawn_child(std::vector<std::string> argv, int out_fd, int err_fd, bool own_group);

/// Runs argv to its end, its stdout and stderr read into `out` and `err`; its exit status, or -1
/// where it could not start or did not exit.
int run_captured(std::vector<std::string> argv, std::string& out, std::string& err);

/// The checkout's tools/NAME beside the located harness (env/eval/harness/worker.py's checkout).
std::filesystem::path checkout_tool(const env::harness_location& where, std::string_view name);

} // namespace crucible::cli
