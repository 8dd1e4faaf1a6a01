// env/eval/worker_pool.hpp: the warm workers of one device: a zygote to fork them from (where it
// starts), their start and handshake (the sandbox's layers checked, the device initialised in
// held steps), the refill threads that keep evaluator.warm_workers ready, and the retire thread
// that kills and reaps the finished ones off the evaluating threads. Internal to env/.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "env/eval/device_gate.hpp"
#include "env/eval/sandbox.hpp"
#include "env/eval/wire.hpp"

namespace zmq {
class context_t;
}

namespace crucible::env {

/// Where the harness and the interpreter are; found once by locate_harness() (evaluator.hpp).
struct harness_location {
  std::string python;
  std::filesystem::path worker_py;
  /// The harness's own kernels (env/eval/harness/harness_kernels.cu, built into a fatbin); empty
  /// when the build has no CUDA or the file is gone (CUDA workers then use torch operations).
  std::filesystem::path kernels;
};

/// A worker that has said `ready`, with the device model it reported.
struct ready_worker {
  std::unique_ptr<worker> proc;
  std::string hardware;
};

/// The workers of one device. Thread-safe. start() makes the first worker (which names the
/// hardware) and the threads; the destructor stops the threads and kills every worker it holds.
class worker_pool final {
public:
  worker_pool(const evaluator_options& opt, harness_location where, std::string device, logger& log,
              device_gate& gate, std::filesystem::path scratch_root, std::filesystem::path extensions_dir);
  ~worker_pool();
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  /// Starts the refill and retire threads and returns at once: the refill threads start the
  /// warm workers side by side, the zygote on the first of them (a thread that lives as long as
  /// the pool, as the zygote must: PR_SET_PDEATHSIG is per thread). Several devices' pools so
  /// launched warm up together.
  void launch();
  /// Waits until a worker has started (its hardware is then known), or until every refill thread's
  /// start has failed with no worker started: the first of those errors.
  result<void> wait_started();

  /// An idle worker, or one started here and now when none is idle.
  result<ready_worker> take();
  /// A worker that never saw a candidate goes back to the idle ones.
  void give_back(ready_worker w);
  /// A worker started now, not taken from the idle ones (a retry after a worker was killed from
  /// outside: what killed it may have killed them too).
  result<ready_worker> start_fresh() { return start_worker(); }
  /// A process started like a worker (forked from the zygote where there is one) that has said
  /// `started` with its sandbox's layers, checked against evaluator.isolation: a builder.
  result<std::unique_ptr<worker>> start_builder(std::chrono::steady_clock::time_point deadline);
  /// Kills, reaps and removes a finished worker on the retire thread (a CUDA process takes
  /// ~0.1 s to exit); with evaluator.teardown_hold it holds the device as untimed work.
  void retire(std::unique_ptr<worker> w);
  /// Waits until every worker given to retire() so far has been killed and reaped.
  void await_retired();
  /// Retires every idle worker (after a device fault that ended their contexts: under MPS a
  /// faulted client's error reaches every client); the refill threads start new ones.
  void discard_idle();

  /// An evaluation begins or ends (evaluator.refill when-idle refills only while none is in
  /// flight).
  void evaluation_begins();
  void evaluation_ends();
  /// Evaluations in flight now, the caller's included.
  std::int64_t in_flight() const;

  bool wait_warm(double timeout_s);
  std::size_t warm_now() const;
  std::string hardware() const;
  isolation_report isolation() const;
  std::uint64_t workers_started() const noexcept { return started_; }
  std::uint64_t workers_forked() const noexcept { return forked_; }
  double init_seconds() const noexcept { return static_cast<double>(init_ns_.load()) * 1e-9; }
  double init_held_seconds() const noexcept { return static_cast<double>(init_held_ns_.load()) * 1e-9; }
  bool workers_lack_kernels() const noexcept { return kernels_warned_.load(); }

private:
  worker_spec spec() const;
  result<ready_worker> start_worker();
  result<void> check_isolation(const wire::node& started);
  result<ready_worker> handshake(std::unique_ptr<worker> proc);
  std::shared_ptr<zygote> current_zygote(const worker_spec& spec);
  void refill_loop();
  void retire_loop();

  // About 25 members: what starts a worker (the options, where the harness is, the device, the
  // folders), then one group per thread that shares the pool (the idle workers and the refill
  // threads under mtx_, the zygote under zygote_mtx_, the retiring workers under retire_mtx_),
  // each with its lock and its conditions beside it, and the start counters.
  const evaluator_options& opt_;
  harness_location where_;
  std::string device_;
  logger& log_;
  device_gate& gate_;
  std::filesystem::path scratch_root_;
  std::filesystem::path extensions_dir_;
  std::unique_ptr<zmq::context_t> zmq_;

  mutable std::mutex mtx_;            // guards idle_, hardware_, isolation_, stopping_, in_flight_, starting_
  std::condition_variable refill_cv_;
  std::condition_variable pool_cv_;   // a worker joined the pool, or a refill gave up (wait_warm())
  std::vector<ready_worker> idle_;
  std::string hardware_;
  isolation_report isolation_;        // the last worker's sandbox layers
  bool stopping_ = false;
  std::int64_t in_flight_ = 0;
  int starting_ = 0;                  // workers being started by the refill threads
  bool any_started_ = false;          // a worker has started since launch()
  std::size_t failed_starts_ = 0;     // starts that failed before any worker started
  std::optional<error> first_failure_; // the first of those
  std::vector<std::thread> refill_;

  std::atomic<std::uint64_t> started_{0};
  std::atomic<std::uint64_t> forked_{0};
  std::atomic<std::uint64_t> forked_ready_{0};   // forked workers that started
  std::atomic<int> fork_failures_in_a_row_{0};   // forked workers that failed since the last that started
  std::atomic<std::uint64_t> init_ns_{0};
  std::atomic<std::uint64_t> init_held_ns_{0};
  std::atomic<bool> kernels_warned_{false}; // a CUDA worker without the harness kernels was reported

  std::mutex zygote_mtx_;             // guards zygote_, zygote_off_
  std::shared_ptr<zygote> zygote_;
  bool zygote_off_ = false;           // the zygote failed: workers are executed from now on

  std::mutex retire_mtx_;             // guards retiring_, retire_stop_, reaping_
  std::condition_variable retire_cv_;
  std::condition_variable retired_cv_; // retiring_ empty and no batch being reaped
  std::vector<std::unique_ptr<worker>> retiring_;
  bool reaping_ = false;
  bool retire_stop_ = false;
  std::thread retire_thread_;
};

} // namespace crucible::env
