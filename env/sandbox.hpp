// env/sandbox.hpp: one sandboxed worker process and its ZeroMQ socket. The evaluator starts
// workers here and exchanges the messages of docs/evaluator-protocol.md with them.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <sys/types.h>

#include "core/error.hpp"

namespace zmq {
class context_t;
class socket_t;
} // namespace zmq

namespace crucible::env {

/// How to start a worker.
struct worker_spec {
  std::string python;                    ///< interpreter with torch
  std::filesystem::path harness;         ///< env/harness/worker.py
  std::string device = "cpu";            ///< "cpu" or "cuda:N" (physical index)
  std::filesystem::path scratch_root;    ///< parent of the private scratch directories
  std::filesystem::path extensions_dir;  ///< TORCH_EXTENSIONS_DIR / TRITON_CACHE_DIR parent
  std::uint64_t memory_limit_mb = 0;     ///< RLIMIT_AS for CPU workers; 0: none
  std::int64_t cpu_threads = 1;
};

/// One message: a JSON header and raw binary frames.
struct worker_message {
  std::string json;
  std::vector<std::vector<std::byte>> frames;
};

/// What receive() saw.
enum class receive_outcome { message, deadline, died };

/// A worker process in its own process group, session, scratch directory and (where the OS
/// allows) network namespace, with a PAIR socket bound to ipc://SCRATCH/worker.sock. Owns the
/// process group (killed on destruction) and the scratch directory (removed on destruction).
/// Not thread-safe: one thread at a time may use it; ownership may move between threads.
class worker final {
public:
  /// Forks and executes the harness. Returns once the process exists; the caller waits for
  /// its `ready` message with receive().
  static result<std::unique_ptr<worker>> start(zmq::context_t& ctx, const worker_spec& spec);

  ~worker();
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  /// Sends a JSON message (no binary frames are ever sent to a worker).
  result<void> send(const std::string& json);
  /// Waits until `deadline` for one message; notices the process dying meanwhile.
  receive_outcome receive(std::chrono::steady_clock::time_point deadline, worker_message& out);
  /// Kills the whole process group (SIGKILL) and reaps the process. Idempotent.
  void kill();
  /// After `died` (or kill()): "exited with code 3", "killed by signal 11 (SIGSEGV)".
  std::string exit_description() const;
  /// True when the process ended by a signal it did not get from us.
  bool died_by_signal() const noexcept { return exit_signal_ != 0 && !killed_by_us_; }
  int exit_signal() const noexcept { return exit_signal_; }

  pid_t pid() const noexcept { return pid_; }
  const std::filesystem::path& scratch() const noexcept { return scratch_; }
  /// True if the worker runs in its own network namespace.
  bool network_isolated() const noexcept { return net_isolated_; }

private:
  worker() = default;
  bool reap(bool block);

  pid_t pid_ = -1;
  int pidfd_ = -1;
  std::unique_ptr<zmq::socket_t> sock_;
  std::filesystem::path scratch_;
  bool exited_ = false;
  bool killed_by_us_ = false;
  int exit_code_ = 0;
  int exit_signal_ = 0;
  bool net_isolated_ = false;
  bool drained_ = false;
};

} // namespace crucible::env
