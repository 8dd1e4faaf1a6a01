// env/eval/evaluator.hpp: evaluates candidates on one device: warm sandboxed workers in, verdicts
// out. Drives the protocol of docs/evaluator-protocol.md, compares outputs itself and turns
// the timed rounds into a speedup (env/eval/timing.hpp) and a reward (env/reward.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "env/eval/device_gate.hpp"
#include "env/eval/eval_request.hpp"
#include "env/eval/evaluation_context.hpp"
#include "env/eval/sandbox.hpp"
#include "env/eval/solo_gate.hpp"
#include "env/task.hpp"
#include "env/verdict.hpp"
#include "env/eval/verdict_cache.hpp"
#include "env/eval/worker_pool.hpp"

namespace crucible::env {

class build_service;

/// Version of the measurement protocol; part of every cache key.
inline constexpr const char* protocol_version = "crucible-eval-13"; // 13: each two rounds in both orders, a slowed reference judged twice, a CPU worker reaching no device file but the plain ones; 12: the CUDA boundary's device clock; 11: input distribution 4; 10: the trust boundary (evaluator.boundary); 9: bands with the repeat floor

/// Finds env/eval/harness/worker.py (next to the executable's source tree, or CRUCIBLE_HARNESS),
/// the harness kernels' fatbin (CRUCIBLE_HARNESS_KERNELS, else the one this build made) and
/// the Python interpreter (`opt.python`, the checkout's .venv, or python3 on PATH).
result<harness_location> locate_harness(const evaluator_options& opt);

class device_evaluator;

/// Which verdict cache a set of evaluators shares: evaluator.cache's, or none.
enum class verdict_cache_use { configured, none };


/// The device evaluators every caller makes (the run, `crucible eval`, `eval --pairs` and
/// `--set`, `tasks import`, an evaluator node): the harness located once, one evaluator per
/// device in order, all launched before any is waited for (the devices' warm pools start
/// together), all sharing one verdict cache. Returns when each device has a started worker. An
/// error names the device (evaluator.devices[i] where `devices` is evaluator.devices).
result<std::vector<std::unique_ptr<device_evaluator>>> make_device_evaluators(const evaluator_options& opt,
                                                                              const reward_options& reward,
                                                                              const std::vector<std::string>& devices,
                                                                              logger& log, verdict_cache_use cache);

/// Evaluator for one device. Keeps `warm_workers` started workers ready (started in parallel),
/// uses the device only while the reference, the trials and the timing run (not while a
/// candidate imports and compiles), so several evaluations overlap. Timed rounds have the
/// device to themselves; untimed device work of several evaluations may share it.
/// Thread-safe: evaluate() may be called from up to `concurrency` threads at once. Owns its workers and a background thread that starts them.
class device_evaluator final {
public:
  /// Starts the warm pool and waits for the first worker, which names the hardware: launch(),
  /// then wait_started().
  static result<std::unique_ptr<device_evaluator>> create(const evaluator_options& opt,
                                                          const reward_options& reward,
                                                          const harness_location& where,
                                                          std::string device, logger& log,
                                                          std::shared_ptr<verdict_cache> cache);
  /// The evaluator with its warm pool starting (returns at once): several devices' evaluators
  /// launched one after another warm up together (make_device_evaluators).
  static std::unique_ptr<device_evaluator> launch(const evaluator_options& opt, const reward_options& reward,
                                                  const harness_location& where, std::string device,
                                                  logger& log, std::shared_ptr<verdict_cache> cache);
  /// Waits for the first worker of a launched evaluator (the hardware is then known), or the
  /// error that kept every start of its warm pool from succeeding.
  result<void> wait_started();
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
  std::uint64_t extension_builds() const noexcept;
  /// Precompiled torch/extension.h headers the build service made so far (one per set of C++
  /// flags, kept in the extension cache's pch/), for tests and metrics.
  std::uint64_t header_builds() const noexcept;
  /// The sandbox layers the last started worker reported (env/eval/harness/confine.py).
  isolation_report isolation() const;
  /// Waits until the warm pool holds warm_workers workers, or until timeout_s has passed; true
  /// when it is full. (With refill `when-idle` it fills only while nothing is evaluated.)
  bool wait_warm(double timeout_s);
  /// Workers in the warm pool now.
  std::size_t warm_now() const;
  /// Workers started so far (for tests and metrics).
  std::uint64_t workers_started() const noexcept { return pool_->workers_started(); }
  /// Of those, workers forked from the zygote (evaluator.zygote) rather than executed.
  std::uint64_t workers_forked() const noexcept { return pool_->workers_forked(); }
  /// Seconds spent in timed rounds so far, all evaluations together (for throughput figures).
  double timing_seconds() const noexcept { return static_cast<double>(counters_.timing_ns.load()) * 1e-9; }
  /// Seconds inside the timed calls themselves (the settled reference and candidate times of
  /// every measured round), all evaluations together: the strictest "device timing" figure.
  double timed_call_seconds() const noexcept { return static_cast<double>(counters_.timed_calls_ns.load()) * 1e-9; }
  /// Seconds during which the device was in use by at least one evaluation or starting worker
  /// (references, trials, timing, and the steps of device initialisation evaluator.init_hold names).
  double device_seconds() const { return static_cast<double>(gate_->busy_ns()) * 1e-9; }
  /// Seconds during which an evaluation was ready to time but waited for other evaluations'
  /// untimed work (and starting workers' held initialisation steps) to finish.
  double drain_seconds() const { return static_cast<double>(gate_->drain_ns()) * 1e-9; }
  /// Seconds during which a timing's measured rounds waited for starting workers' held
  /// initialisation (evaluator.starts_beside_warmup) and other evaluations' untimed work
  /// (evaluator.untimed_beside_warmup) to finish: part of timing_seconds().
  double measure_wait_seconds() const { return static_cast<double>(gate_->measure_wait_ns()) * 1e-9; }
  /// Seconds during which a timing's warm-up and a starting worker's held initialisation shared
  /// the device.
  double beside_seconds() const { return static_cast<double>(gate_->beside_ns()) * 1e-9; }
  /// Seconds during which a timing's warm-up and other evaluations' untimed work shared the
  /// device (evaluator.untimed_beside_warmup).
  double untimed_beside_seconds() const { return static_cast<double>(gate_->untimed_beside_ns()) * 1e-9; }
  /// Seconds workers spent initialising the device, summed over workers (several may
  /// initialise at once).
  double init_seconds() const noexcept { return pool_->init_seconds(); }
  /// Of those, seconds spent holding the device (the steps evaluator.init_hold names: never
  /// beside timed rounds), summed over workers.
  double init_held_seconds() const noexcept { return pool_->init_held_seconds(); }
  /// True once a CUDA worker has said it uses torch operations for the harness's own device
  /// work (no harness kernels: none built, or CRUCIBLE_HARNESS_KERNELS names what it cannot load).
  bool workers_lack_kernels() const noexcept { return pool_->workers_lack_kernels(); }
  /// Most evaluations and starting workers that shared the device's untimed work at once.
  int max_untimed_users() const { return gate_->max_untimed(); }
  /// Every step through the device gate from now on (record(true)) until taken: for timelines.
  void record_gate(bool on) { gate_->record(on); }
  std::vector<device_gate::event> take_gate_events() { return gate_->take_events(); }

private:
  device_evaluator(const evaluator_options& opt, const reward_options& reward, harness_location where,
                   std::string device, logger& log, std::shared_ptr<verdict_cache> cache);
  std::string protocol_key() const;

  evaluator_options opt_;
  reward_options reward_;
  harness_location where_;
  std::string device_;
  logger& log_;
  std::shared_ptr<verdict_cache> cache_;
  std::function<void(const char*, pid_t)> observer_;
  int outputs_device_ = -1;          // >= 0: outputs stay on this CUDA device of this process
  std::optional<error> start_error_; // why it did not start its warm pool (no such device here)
  /// Measured rounds alone; untimed work shared (evaluator.share_untimed, *_beside_warmup). On a
  /// CUDA device, the process's one gate of that device (shared_gate), which the policy's work on
  /// the same GPU takes too (host_hold): no timed round overlaps a generation or an update.
  std::shared_ptr<device_gate> gate_;
  solo_gate solo_;                    // an evaluation out of device memory beside others is retried alone
  reference_baselines baselines_;
  std::atomic<bool> peaks_asked_{false}; // a verdict's reference worker measures the peaks now (evaluator.limits)
  evaluation_counters counters_;
  host_cache_flush flush_;
  std::unique_ptr<worker_pool> pool_;
  std::unique_ptr<build_service> builds_;
};

} // namespace crucible::env
