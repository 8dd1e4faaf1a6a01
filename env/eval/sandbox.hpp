// env/eval/sandbox.hpp: one sandboxed worker process and its ZeroMQ socket. The evaluator starts
// workers here and exchanges the messages of docs/evaluator-protocol.md with them.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <sys/types.h>

#include "core/error.hpp"
#include "env/eval/control_group.hpp"
#include "env/eval/wire.hpp"

namespace zmq {
class context_t;
class socket_t;
} // namespace zmq

namespace crucible::env {

/// How to start a worker.
struct worker_spec {
  std::string python;                    ///< interpreter with torch
  std::filesystem::path harness;         ///< env/eval/harness/worker.py
  std::filesystem::path kernels;         ///< the harness kernels' fatbin (CUDA workers); empty: none
  std::string device = "cpu";            ///< "cpu" or "cuda:N" (physical index)
  std::filesystem::path scratch_root;    ///< parent of the private scratch directories
  std::filesystem::path extensions_dir;  ///< the build service's cache, which workers read (never write)
  std::uint64_t memory_limit_mb = 0;     ///< RLIMIT_AS for CPU workers; 0: none
  std::int64_t cpu_threads = 1;
  std::int64_t cuda_max_connections = 0; ///< CUDA_DEVICE_MAX_CONNECTIONS; 0: the driver's default
  bool huge_pages = false;               ///< THP_MEM_ALLOC_ENABLE=1 (evaluator.huge_pages)
  bool own_device_only = false;          ///< CRUCIBLE_OWN_DEVICE_ONLY=1 (evaluator.cuda_own_device_only; CUDA workers)
  std::uint64_t scratch_mb = 2048;       ///< size of the worker's private tmpfs (its scratch directory and /tmp)
};

/// What reclaim_scratch() found.
struct scratch_reclaim {
  std::size_t removed = 0; ///< scratch directories of processes that no longer exist, removed
  std::uint64_t bytes = 0; ///< the bytes of the files they held
  std::size_t failed = 0;  ///< such directories that could not be removed
};

/// Removes the scratch directories under `root` (worker and zygote scratch, named
/// "w<pid>-N-XXXXXX" / "z<pid>-N-XXXXXX") whose maker no longer runs: what an evaluator killed
/// with -9 left behind. A directory whose maker lives, or that is not of that form, is left
/// alone. Called by each device evaluator as it starts.
scratch_reclaim reclaim_scratch(const std::filesystem::path& root);

/// The sandbox's layers (env/eval/harness/confine.py) as a worker or a probe reported them.
struct isolation_report {
  std::vector<std::string> layers;                           ///< in force
  std::vector<std::pair<std::string, std::string>> missing;  ///< layer, why it is not
  int landlock_abi = 0;                                      ///< the kernel's Landlock ABI; 0: none
  /// "landlock (the kernel has no Landlock ...); seccomp (...)": the missing layers and why.
  std::string missing_text() const;
};

/// Reads the `isolation` object of a worker's `started` message (or of the probe's output):
/// {"layers": [...], "missing": {layer: why}, "landlock_abi": N}. A worker that sends none is
/// reported as missing every layer.
isolation_report parse_isolation(const wire::node& report);
/// The same from the object's JSON text (the probe's output); text that is not JSON is reported
/// as a malformed report.
isolation_report parse_isolation(const std::string& json_object);

/// Adds the evaluator's own layer to a worker's report: `control-group` (env/eval/control_group.hpp),
/// in force, or missing with the reason no group can be made here.
void add_evaluator_layers(isolation_report& report);

/// Confines a fresh process as a worker would be (`PYTHON -I -B HARNESS_DIR/confine.py`) and
/// returns what this machine allows, for `crucible info`. Errors: the interpreter cannot run.
result<isolation_report> probe_isolation(const std::string& python, const std::filesystem::path& worker_py);

class zygote;

/// One message: a JSON header and raw binary frames.
struct worker_message {
  std::string json;
  std::vector<std::vector<std::byte>> frames;
};

/// What receive() saw.
enum class receive_outcome { message, deadline, died };

/// A worker process in its own process group, session and scratch directory, with a PAIR
/// socket bound to ipc://SCRATCH/worker.sock. The process confines itself before any candidate
/// code runs (env/eval/harness/confine.py: namespaces, a read-only file system with a private
/// scratch, an unprivileged identity, Landlock, seccomp) and says which layers are in force in
/// its `started` message. Where it makes a PID namespace, pid() is the sandbox's keeper and the
/// candidate runs in its one child. Owns the process group and the keeper's child (killed on
/// destruction) and the scratch directory (removed on destruction).
/// Not thread-safe: one thread at a time may use it; ownership may move between threads.
class worker final {
public:
  /// Forks and executes the harness. Returns once the process exists; the caller waits for
  /// its `ready` message with receive().
  static result<std::unique_ptr<worker>> start(zmq::context_t& ctx, const worker_spec& spec);
  /// The same worker, forked by `z` from a process that has already imported the harness
  /// (seconds faster). `spec` must be the one `z` was started with but for the scratch
  /// directory, which is the worker's own. Errors: the zygote refused or is gone.
  static result<std::unique_ptr<worker>> fork_from(zygote& z, zmq::context_t& ctx, const worker_spec& spec);

  ~worker();
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  /// Sends a JSON message.
  result<void> send(const std::string& json);
  /// Sends a JSON message with binary frames (the trial inputs a candidate's worker is given).
  result<void> send(const std::string& json, const std::vector<std::vector<std::byte>>& frames);
  /// Puts every process of the worker (the keeper and all below it) in a control group of its own
  /// (env/eval/control_group.hpp), before any candidate code runs: from then on everything it starts
  /// is born there, and freeze(), thaw(), cpu_ns() and kill() act on the group. Called once the
  /// worker has said `started`. Errors: no group can be made, or a process cannot be moved.
  result<void> enclose();
  /// Whether the worker lives in a control group of its own (enclose() succeeded).
  bool enclosed() const noexcept { return group_ != nullptr; }
  /// Stops every process of the worker and waits, `timeout` at most, until every thread of them
  /// is stopped; thaw() continues them. Enclosed: the group's freezer (a process forked meanwhile
  /// is born frozen). Otherwise SIGSTOP to its process group, then every process below the one
  /// the candidate runs in, whatever group it made for itself (SIGCONT to continue); a thread
  /// with the stop pending runs no more of its own code, but one that waits for a core on a
  /// loaded machine shows as stopped only once it gets one (over 200 ms with CI's tests beside
  /// it). Errors: the worker cannot be stopped, or a thread still runs at the timeout.
  /// `stopped_at`, where given, is set to the moment the stop was asked for (before the wait).
  result<void> freeze(std::chrono::steady_clock::time_point* stopped_at = nullptr,
                      std::chrono::microseconds timeout = std::chrono::seconds{10});
  result<void> thaw();
  /// The CPU time (ns) the worker ran so far. Enclosed: the kernel's charge to its group, of
  /// every process and thread that was ever in it (ended, reaped by anyone or by the kernel
  /// itself, reachable by a walk or not), at microsecond resolution. Otherwise every process of
  /// its tree that a walk finds, its threads' (ended ones too) and its reaped children's. Read
  /// while it is stopped, two readings tell what all its threads ran in between, on however many
  /// cores. Errors: the worker has ended.
  result<std::uint64_t> cpu_ns();
  /// Reads (process_vm_readv) or writes (process_vm_writev) `n` bytes at `addr` of the worker's
  /// address space. Errors name the address and the system's reason (EFAULT: not mapped).
  result<void> read_memory(std::uint64_t addr, std::size_t n, std::byte* out);
  result<void> write_memory(std::uint64_t addr, const std::byte* data, std::size_t n);
  /// The physical frame of each page of [addr, addr + n) in the worker's address space, from its
  /// /proc/PID/pagemap: 0 for a page not present, and for every page where this process may not
  /// see frames (CAP_SYS_ADMIN). Errors: the map cannot be opened.
  result<std::vector<std::uint64_t>> page_frames(std::uint64_t addr, std::size_t n);
  /// The process the candidate's code runs in: the keeper's one child (PID 1 of the worker's PID
  /// namespace), or the started process itself where there is no keeper.
  pid_t inner_pid();
  /// Waits until `deadline` for one message; notices the process dying meanwhile.
  receive_outcome receive(std::chrono::steady_clock::time_point deadline, worker_message& out);
  /// Kills the whole process group (SIGKILL) and reaps the process. Idempotent.
  void kill();
  /// Whether the process has ended, waiting for its end until `until` at most (then
  /// exit_description() and died_by_signal() say how). A worker that stops taking messages may
  /// have been killed from outside an instant before: this tells that from a live one.
  bool ended(std::chrono::steady_clock::time_point until);
  /// After `died` (or kill()): "exited with code 3", "killed by signal 11 (SIGSEGV)".
  std::string exit_description() const;
  /// True when the process ended by a signal it did not get from us.
  bool died_by_signal() const noexcept { return exit_signal_ != 0 && !killed_by_us_; }
  int exit_signal() const noexcept { return exit_signal_; }

  pid_t pid() const noexcept { return pid_; }
  const std::filesystem::path& scratch() const noexcept { return scratch_; }
  /// True if a zygote forked it (fork_from), false if it was executed (start).
  bool forked() const noexcept { return zygote_ != nullptr; }

private:
  worker() = default;
  bool reap(bool block);
  result<void> bind(zmq::context_t& ctx, const worker_spec& spec, std::string& endpoint);

  pid_t pid_ = -1;
  pid_t inner_ = -1; // inner_pid(), once known
  int pidfd_ = -1;
  std::unique_ptr<zmq::socket_t> sock_;
  std::filesystem::path scratch_;
  bool exited_ = false;
  bool killed_by_us_ = false;
  int exit_code_ = 0;
  int exit_signal_ = 0;
  bool drained_ = false;
  std::shared_ptr<zygote> zygote_; // the parent that reaps it, for forked workers
  std::unique_ptr<control_group> group_; // enclose(); destroyed after the process is reaped
};

/// A Python process started like a worker (same sandbox, `worker.py --zygote`) that imports the
/// harness, torch included, never touches the device, and forks one fresh worker per request:
/// tens of milliseconds instead of the seconds an interpreter takes to import torch. Every
/// worker comes from the zygote itself, so no candidate's state reaches another worker. The
/// zygote is the workers' parent and reaps each one only when its `worker` asks, so a pid is
/// not reused while the evaluator may still signal it. Owns the process (killed on
/// destruction) and its scratch directory; workers keep it alive through a shared_ptr.
/// Thread-safe: fork_from() and reaping may be called from any thread.
class zygote final : public std::enable_shared_from_this<zygote> {
public:
  /// Starts the zygote and waits (until `timeout`) for it to report that it is ready.
  static result<std::shared_ptr<zygote>> start(const worker_spec& spec, std::chrono::steady_clock::duration timeout);

  ~zygote();
  zygote(const zygote&) = delete;
  zygote& operator=(const zygote&) = delete;

  /// False once the process has died or broken the protocol; start a new one.
  bool alive();
  pid_t pid() const noexcept { return pid_; }

  /// Forks one worker for the fork request `request` (worker_msg::fork): the new process's pid.
  result<pid_t> fork(const std::string& request);

  struct exit_status {
    int code = 0;
    int signal = 0;
  };
  /// Reaps `pid`, a worker this zygote forked and that has ended: how it ended.
  result<exit_status> reap(pid_t pid);

private:
  zygote() = default;
  // One request line, one reply line (JSON), under mtx_.
  result<std::string> request(const std::string& line);

  std::mutex mtx_;
  pid_t pid_ = -1;
  int ctl_ = -1; // our end of the control socket (the zygote's stdin)
  std::string pending_; // bytes read past the last reply line
  std::filesystem::path scratch_;
  bool broken_ = false;
};

} // namespace crucible::env
