// env/evaluator.hpp: evaluates candidates on one device: warm sandboxed workers in, verdicts
// out. Drives the protocol of docs/evaluator-protocol.md, compares outputs itself and turns
// the timed rounds into a speedup (env/timing.hpp) and a reward (env/reward.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "env/device_gate.hpp"
#include "env/sandbox.hpp"
#include "env/solo_gate.hpp"
#include "env/task.hpp"
#include "env/verdict.hpp"
#include "env/verdict_cache.hpp"

namespace zmq {
class context_t;
}
namespace YAML {
class Node;
}

namespace crucible::env {

/// Version of the measurement protocol; part of every cache key.
inline constexpr const char* protocol_version = "crucible-eval-12"; // 12: the CUDA boundary's device clock; 11: input distribution 4; 10: the trust boundary (evaluator.boundary); 9: bands with the repeat floor

/// One candidate for one task.
struct eval_request {
  task target;
  std::string candidate;   ///< Python source defining ModelNew
  std::uint64_t seed = 0;  ///< 0: a fresh random seed
  bool use_cache = true;
  /// The task alone (device_evaluator::check_task): its reference is built and run once, on one
  /// trial's inputs, and `candidate` is not looked at.
  bool reference_only = false;
};

/// Where the harness and the interpreter are; found once by locate_harness().
struct harness_location {
  std::string python;
  std::filesystem::path worker_py;
  /// The harness's own kernels (env/harness/harness_kernels.cu, built into a fatbin); empty
  /// when the build has no CUDA or the file is gone (CUDA workers then use torch operations).
  std::filesystem::path kernels;
};

/// Finds env/harness/worker.py (next to the executable's source tree, or CRUCIBLE_HARNESS),
/// the harness kernels' fatbin (CRUCIBLE_HARNESS_KERNELS, else the one this build made) and
/// the Python interpreter (`opt.python`, the checkout's .venv, or python3 on PATH).
result<harness_location> locate_harness(const evaluator_options& opt);

/// Evaluator for one device. Keeps `warm_workers` started workers ready (started in parallel),
/// uses the device only while the reference, the trials and the timing run (not while a
/// candidate imports and compiles), so several evaluations overlap. Timed rounds have the
/// device to themselves; untimed device work of several evaluations may share it.
/// Thread-safe: evaluate() may be called from up to `concurrency` threads at once. Owns its workers and a background thread that starts them.
class device_evaluator final {
public:
  /// Starts the warm pool and waits for the first worker, which names the hardware.
  static result<std::unique_ptr<device_evaluator>> create(const evaluator_options& opt,
                                                          const reward_options& reward,
                                                          const harness_location& where,
                                                          std::string device, logger& log,
                                                          std::shared_ptr<verdict_cache> cache);
  ~device_evaluator();
  device_evaluator(const device_evaluator&) = delete;
  device_evaluator& operator=(const device_evaluator&) = delete;

  /// Evaluates one candidate. Never throws; every outcome of the candidate is a verdict.
  verdict evaluate(const eval_request& req);

  /// Runs `t`'s reference once in a sandboxed worker, as every verdict does before its candidate
  /// loads (task source executed, Model built, get_inputs(), forward, a second call on the same
  /// inputs): status ok, or runtime_error whose message has the exception with the task file's
  /// line (or says the reference is not deterministic), timeout, compile_error. Not cached.
  verdict check_task(const task& t);

  /// Called on the evaluating thread as each evaluation enters a phase ("reference", "load",
  /// "trials", "timing") with the worker's pid: for progress reports and for tests that kill
  /// a worker at a chosen moment. Set it before the first evaluate().
  void set_phase_observer(std::function<void(const char* phase, pid_t worker)> f) { observer_ = std::move(f); }

  const std::string& device() const noexcept { return device_; }
  /// Device model reported by the workers, e.g. "NVIDIA H100 80GB HBM3" or "cpu: AMD EPYC ...".
  std::string hardware() const;
  /// The build service: builds a worker's `build` request (the load_inline or load call its
  /// candidate's module made, as JSON) in a sandboxed builder process of its own, keeps the
  /// library in the extension cache under the hash of the whole request, and returns the reply
  /// for the worker (`built` with the cache directory, or `build_failed` with the log). Only
  /// this process writes the cache. Concurrent requests of one key build once.
  std::string build_extension(const std::string& request, std::chrono::steady_clock::time_point deadline);
  /// Extension builds made so far (not answered from the cache), for tests and metrics.
  std::uint64_t extension_builds() const noexcept { return builds_; }
  /// The sandbox layers the last started worker reported (env/harness/confine.py).
  isolation_report isolation() const;
  /// Waits until the warm pool holds warm_workers workers, or until timeout_s has passed; true
  /// when it is full. (With refill `when-idle` it fills only while nothing is evaluated.)
  bool wait_warm(double timeout_s);
  /// Workers in the warm pool now.
  std::size_t warm_now() const;
  /// Workers started so far (for tests and metrics).
  std::uint64_t workers_started() const noexcept { return started_; }
  /// Of those, workers forked from the zygote (evaluator.zygote) rather than executed.
  std::uint64_t workers_forked() const noexcept { return forked_; }
  /// Seconds spent in timed rounds so far, all evaluations together (for throughput figures).
  double timing_seconds() const noexcept { return static_cast<double>(timing_ns_.load()) * 1e-9; }
  /// Seconds inside the timed calls themselves (the settled reference and candidate times of
  /// every measured round), all evaluations together: the strictest "device timing" figure.
  double timed_call_seconds() const noexcept { return static_cast<double>(timed_calls_ns_.load()) * 1e-9; }
  /// Seconds during which the device was in use by at least one evaluation or starting worker
  /// (references, trials, timing, and the steps of device initialisation evaluator.init_hold names).
  double device_seconds() const { return static_cast<double>(gate_.busy_ns()) * 1e-9; }
  /// Seconds during which an evaluation was ready to time but waited for other evaluations'
  /// untimed work (and starting workers' held initialisation steps) to finish.
  double drain_seconds() const { return static_cast<double>(gate_.drain_ns()) * 1e-9; }
  /// Seconds during which a timing's measured rounds waited for starting workers' held
  /// initialisation (evaluator.starts_beside_warmup) and other evaluations' untimed work
  /// (evaluator.untimed_beside_warmup) to finish: part of timing_seconds().
  double measure_wait_seconds() const { return static_cast<double>(gate_.measure_wait_ns()) * 1e-9; }
  /// Seconds during which a timing's warm-up and a starting worker's held initialisation shared
  /// the device.
  double beside_seconds() const { return static_cast<double>(gate_.beside_ns()) * 1e-9; }
  /// Seconds during which a timing's warm-up and other evaluations' untimed work shared the
  /// device (evaluator.untimed_beside_warmup).
  double untimed_beside_seconds() const { return static_cast<double>(gate_.untimed_beside_ns()) * 1e-9; }
  /// Seconds workers spent initialising the device, summed over workers (several may
  /// initialise at once).
  double init_seconds() const noexcept { return static_cast<double>(init_ns_.load()) * 1e-9; }
  /// Of those, seconds spent holding the device (the steps evaluator.init_hold names: never
  /// beside timed rounds), summed over workers.
  double init_held_seconds() const noexcept { return static_cast<double>(init_held_ns_.load()) * 1e-9; }
  /// True once a CUDA worker has said it uses torch operations for the harness's own device
  /// work (no harness kernels: none built, or CRUCIBLE_HARNESS_KERNELS names what it cannot load).
  bool workers_lack_kernels() const noexcept { return kernels_warned_.load(); }
  /// Most evaluations and starting workers that shared the device's untimed work at once.
  int max_untimed_users() const { return gate_.max_untimed(); }
  /// Every step through the device gate from now on (record(true)) until taken: for timelines.
  void record_gate(bool on) { gate_.record(on); }
  std::vector<device_gate::event> take_gate_events() { return gate_.take_events(); }

private:
  device_evaluator(const evaluator_options& opt, const reward_options& reward, harness_location where,
                   std::string device, logger& log, std::shared_ptr<verdict_cache> cache);

  struct ready_worker {
    std::unique_ptr<worker> proc;
    std::string hardware;
  };
  worker_spec spec() const;
  result<ready_worker> start_worker();
  // A started process (forked from the zygote where there is one) that has said `started` with
  // the sandbox's layers, checked against evaluator.isolation; for builders.
  result<std::unique_ptr<worker>> start_builder(std::chrono::steady_clock::time_point deadline);
  result<void> check_isolation(const YAML::Node& started);
  result<ready_worker> handshake(std::unique_ptr<worker> proc);
  std::shared_ptr<zygote> current_zygote(const worker_spec& spec);
  result<ready_worker> take_worker();
  void give_back(ready_worker w);
  void refill_loop();
  // A finished worker is killed, reaped and its scratch directory removed on retire_thread_,
  // not on the evaluating thread: a CUDA process takes ~0.1 s to exit, which the verdict
  // need not wait for. With evaluator.teardown_hold it holds the device as untimed work.
  void retire(std::unique_ptr<worker> w);
  void retire_loop();
  /// Waits until every worker given to retire() so far has been killed and reaped: their device
  /// memory is the driver's again (an evaluation retried alone on the device needs it).
  void await_retired();
  std::string protocol_key() const;

  friend class evaluation;

  evaluator_options opt_;
  reward_options reward_;
  harness_location where_;
  std::string device_;
  logger& log_;
  std::shared_ptr<verdict_cache> cache_;
  std::unique_ptr<zmq::context_t> zmq_;
  std::filesystem::path scratch_root_;
  std::filesystem::path extensions_dir_;
  std::mutex build_mtx_;              // guards building_
  std::condition_variable build_cv_;  // a build ended
  std::set<std::string> building_;    // cache keys being built now
  std::atomic<std::uint64_t> builds_{0};
  isolation_report isolation_;        // the last worker's sandbox layers (guarded by mtx_)

  mutable std::mutex mtx_;            // guards idle_, hardware_, isolation_, stopping_, in_flight_
  std::condition_variable refill_cv_;
  std::condition_variable pool_cv_;   // a worker joined the pool, or a refill gave up (wait_warm())
  std::int64_t in_flight_ = 0;        // evaluations inside evaluate() (evaluator.refill when-idle)
  std::vector<ready_worker> idle_;
  std::string hardware_;
  bool stopping_ = false;
  std::atomic<std::uint64_t> started_{0};
  std::atomic<std::uint64_t> forked_{0};
  std::atomic<std::uint64_t> forked_ready_{0};   // forked workers that started
  std::atomic<int> fork_failures_in_a_row_{0};   // forked workers that failed since the last that started
  std::mutex zygote_mtx_;             // guards zygote_, zygote_off_
  std::shared_ptr<zygote> zygote_;
  bool zygote_off_ = false;           // the zygote failed: workers are executed from now on
  std::atomic<std::uint64_t> timing_ns_{0};
  std::atomic<std::uint64_t> timed_calls_ns_{0};
  std::atomic<std::uint64_t> init_ns_{0};
  std::atomic<std::uint64_t> init_held_ns_{0};
  std::atomic<bool> kernels_warned_{false}; // a CUDA worker without the harness kernels was reported
  std::function<void(const char*, pid_t)> observer_;
  int outputs_device_ = -1;          // >= 0: outputs stay on this CUDA device of this process
  /// Evicts the last-level cache by reading evaluator.flush_bytes of this process's own memory
  /// (64 MiB on the CPU): before each timed sample across the trust boundary, under the timed gate.
  void flush_caches();
  std::vector<std::uint64_t> flush_buf_; // flush_caches(); used under the timed gate only
  std::mutex alone_mtx_;              // guards ref_alone_ms_
  std::map<std::string, std::vector<double>> ref_alone_ms_; // the reference's samples timed alone (evaluation::check_clean_reference), by task and protocol
  device_gate gate_;                  // measured rounds alone; untimed work shared (evaluator.share_untimed, *_beside_warmup)
  solo_gate solo_;                    // an evaluation out of device memory beside others is retried alone
  int starting_ = 0;                  // workers being started by the refill threads (guarded by mtx_)
  std::vector<std::thread> refill_;
  std::mutex retire_mtx_;             // guards retiring_, retire_stop_, reaping_
  std::condition_variable retire_cv_;
  std::condition_variable retired_cv_; // retiring_ empty and no batch being reaped
  std::vector<std::unique_ptr<worker>> retiring_;
  bool reaping_ = false;              // the retire thread is reaping a batch
  bool retire_stop_ = false;
  std::thread retire_thread_;
};

} // namespace crucible::env
