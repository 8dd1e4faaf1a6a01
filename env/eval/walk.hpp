// env/eval/walk.hpp (internal to env/): one verdict's conversation with its workers and what it has
// found so far, shared by its two parts: the judging (env/eval/evaluation.hpp: the phases, the
// comparisons, the speedup) and the trust boundary (env/eval/boundary.hpp: the reference and the
// candidate in two workers, the timed rounds between them). Messages go out and come back through
// here, a decided verdict is set here, and whoever decides it leaves the rest of the walk to end.
// Its methods are env/eval/walk.cpp's. Not included outside env/.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "env/eval/compare.hpp"
#include "env/eval/device_gate.hpp"
#include "env/eval/build_service.hpp"
#include "env/eval/evaluation_context.hpp"
#include "env/eval/eval_request.hpp"
#include "env/eval/limits.hpp"
#include "env/verdict.hpp"
#include "env/eval/worker_pool.hpp"

namespace crucible::env {

/// One verdict's walk: its workers, its messages, and the verdict as found so far.
struct walk {
  walk(const evaluation_context& ctx, const eval_request& req, ready_worker w) : ctx_(ctx), req_(req), w_(std::move(w)) {
    v_.hardware = w_.hardware;
    v_.baseline = to_string(ctx.opt.baseline);
    tol_.f64 = {ctx.opt.fp32_atol, ctx.opt.fp32_rtol};
    tol_.f32 = {ctx.opt.fp32_atol, ctx.opt.fp32_rtol};
    tol_.f16 = {ctx.opt.fp16_atol, ctx.opt.fp16_rtol};
    tol_.bf16 = {ctx.opt.bf16_atol, ctx.opt.bf16_rtol};
  }
  walk(const walk&) = delete;
  walk& operator=(const walk&) = delete;

  // Receives one message from `from` (the walk's worker by default) before `deadline`; on death or
  // deadline fills the verdict and returns false. A `build` is answered by the build service (never
  // while a timed sample's clock runs: runtime:service_in_timing), a `done` taken (take_done).
  bool receive(double seconds, const char* phase, wire::node& header, worker_message& msg) {
    return receive(*w_.proc, seconds, phase, header, msg);
  }
  // `nudge`, where given, is called once when no message came within `nudge_after` seconds, and
  // the wait goes on to the deadline.
  bool receive(worker& from, double seconds, const char* phase, wire::node& header, worker_message& msg,
               double nudge_after = 0, const std::function<void()>& nudge = {});
  bool send(const std::string& json) { return send(*w_.proc, json); }
  bool send(worker& to, const std::string& json, const std::vector<std::vector<std::byte>>* frames = nullptr);
  // The worker's process has ended (died, or was killed) `when` ("while computing the
  // reference", "before it took the job"): runtime_error saying how, and lost_worker when
  // it was killed from outside (retried on a fresh worker).
  void ended(const std::string& when) { ended(*w_.proc, when); }
  void ended(worker& who, const std::string& when);
  // "the worker", "the reference's worker" or "the candidate's worker": who a message names.
  const char* who(const worker& w) const noexcept {
    return req_.reference_only ? "the worker" : &w == w_.proc.get() ? "the reference's worker" : "the candidate's worker";
  }
  // A worker stopped or continued (worker::freeze/thaw); a failure decides the verdict
  // (runtime_error, not the candidate's).
  bool freeze(worker& w, std::chrono::steady_clock::time_point* stopped_at = nullptr);
  bool thaw(worker& w);
  // Handles a `done` message: fills the verdict from it.
  void take_done(const wire::node& n);
  void set(verdict_status s, std::string message) {
    v_.status = s;
    v_.message = std::move(message);
    end_.failed = true;
  }
  // runtime:below_floor: a median timed call of `call_ms` (`besides`: what it excludes) under
  // the floor of `floor_ms`, the fill of `bytes`.
  void refuse_below_floor(double call_ms, double floor_ms, const char* besides, std::uint64_t bytes);
  /// The bound's floor on the candidate's median call on this hardware (limits.hpp,
  /// bound_floor_ms), from this verdict's peaks or the process's for its hardware; NaN where it is
  /// not known, evaluator.limits is off, or the reference's own median call (`ref_call_ms`) is
  /// under it: that task's calls read fewer bytes than its inputs hold, and so may a candidate's.
  double bound_floor_ms(double ref_call_ms) const;
  /// The candidate's median call under it: rejected (runtime:below_floor), the bound named.
  void refuse_below_bound(double call_ms, double floor_ms, const char* besides);
  void phase(const char* name) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
    ctx_.log.debug("evaluator", ctx_.device, " ", req_.target.name, ": ", name, " at +", buf, " s");
    if (ctx_.observer) // from the load on, across the boundary: the candidate's worker
      ctx_.observer(name, cand_.proc ? cand_.proc->pid() : w_.proc->pid());
  }
  // A timing's measured rounds begin at the device gate (device_gate::begin_measure), on either
  // path: at debug level what is inside there is said before the wait, so that a wait that never
  // ends names its cause, and the wait itself after it.
  void begin_measured_rounds() {
    const auto wait0 = std::chrono::steady_clock::now();
    if (ctx_.log.enabled(log_level::debug))
      if (const auto in = ctx_.gate.inside(); !in.empty())
        ctx_.log.debug("evaluator", ctx_.device, " ", req_.target.name, ": measured rounds wait for ", in);
    ctx_.gate.begin_measure();
    gate_.measuring = true;
    log_gate_wait(wait0, "measured rounds", "starting workers' initialisation",
                  ctx_.gate.untimed_beside_warmup() ? " and other evaluations' untimed work" : "");
  }
  // At debug level, a wait at the device gate since `since` longer than a millisecond:
  // "<who> waited S s for <why...> to finish".
  template <class... Why>
  void log_gate_wait(std::chrono::steady_clock::time_point since, const char* who, const Why&... why) {
    const auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
    if (waited <= 1e-3 || !ctx_.log.enabled(log_level::debug))
      return;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", waited);
    ctx_.log.debug("evaluator", ctx_.device, " ", req_.target.name, ": ", who, " waited ", buf, " s for ", why...,
                   " to finish");
  }

  // What it was given and its workers.
  const evaluation_context& ctx_;
  const eval_request& req_;
  ready_worker w_;    // the reference's worker (a check of a task alone: its one worker)
  ready_worker cand_; // the candidate's worker, once taken
  bool fresh_workers_ = false; // evaluation::use_fresh_workers()
  const int cuda_device_ = ctx_.outputs_device; // >= 0: outputs stay on this CUDA device
  /// A timed sample's clock runs: no service answers the worker (receive).
  bool clock_running_ = false;
  /// The trials' hold on the device while the trials wait on the candidate's worker: a build
  /// that worker asks for meanwhile (its constructor's load_inline) lets go of it (receive).
  std::optional<untimed_hold>* trials_hold_ = nullptr;
  /// Seconds by which builds have extended this verdict's phase deadlines (receive): at most
  /// evaluator.load_timeout_s in all.
  double build_grace_s_ = 0;

  // What it has found.
  verdict v_;
  /// The hardware's peaks this verdict's reference worker measured (evaluator.limits: the first
  /// verdict on its hardware in this process), kept by the evaluator after the verdict.
  std::optional<device_peaks> peaks_;
  tolerances tol_;
  /// The reference's outputs, one list per trial.
  std::vector<std::vector<tensor_blob>> reference_;
  struct {
    bool measured = false;  // a measurement was made (its warm-up rounds played)
    bool measuring = false; // the device gate has let this timing begin its measured rounds
  } gate_;
  /// How the walk ended so far.
  struct walk_state {
    bool done = false;             // the worker sent `done` (or died): no further messages
    bool lost_worker = false;
    bool failed = false;           // set() was called: the verdict is decided
    bool evaluator_failed = false; // see evaluation::evaluator_failed()
  } end_;
  /// What the workers reported of the job (data to check, never a verdict).
  struct worker_reports {
    /// Kernels (or operators) of the candidate's profiled call that the reference's did not run
    /// (the worker's own_work); -1 unknown. 0: no speed credit.
    long own_kernels = -1;
    /// Calls per timed sample (evaluator.sample_ms; the worker's choice): the times are per call.
    long calls = 1;
    /// Correctness trials: evaluator.trials, or fewer where the worker found that their outputs
    /// would not fit the device (its reference messages say so; reference.py's fit_trials).
    std::int64_t trials = 0;
    std::uint64_t input_bytes = 0; // one trial's inputs, from the reference messages
  } reported_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

} // namespace crucible::env
