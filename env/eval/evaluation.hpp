// env/eval/evaluation.hpp (internal to env/): one candidate's walk through the worker protocol, the
// class device_evaluator::evaluate runs on a worker it took from the pool: the judging
// (env/eval/evaluation.cpp, the phases before the rounds in env/eval/evaluation_trials.cpp) over
// the walk's conversation with the workers (env/eval/walk.hpp), and across the trust boundary the
// boundary's part (env/eval/boundary.hpp). It reaches its evaluator only through an
// evaluation_context. Not included outside env/.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <random>
#include <string>
#include <vector>

#include "env/eval/boundary.hpp"
#include "env/eval/limits.hpp"
#include "env/eval/timing.hpp"
#include "env/eval/walk.hpp"

namespace crucible::env {

// Adds the time between construction and destruction to a counter.
struct time_spent {
  std::atomic<std::uint64_t>& total;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~time_spent() {
    total += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  }
};

/// One candidate's walk through the protocol: the judging (the phases, the trials' comparisons,
/// the measurement and its speedup), over the walk's conversation with the workers
/// (env/eval/walk.hpp); across the trust boundary with the boundary's part (env/eval/boundary.hpp).
/// Lives on the calling thread's stack.
class evaluation : private walk {
public:
  evaluation(const evaluation_context& ctx, const eval_request& req, ready_worker w) : walk(ctx, req, std::move(w)) {}

  /// The verdict. A message of a worker that lacks a field the evaluator needs, or holds one of
  /// the wrong type, ends it with `runtime_error` naming the field (the workers are killed).
  verdict run();
  /// Across the trust boundary, the candidate's worker started now instead of taken from the
  /// idle ones (a retry after a worker was killed from outside: what killed it may have killed
  /// the idle ones too). Before run().
  void use_fresh_workers() noexcept { fresh_workers_ = true; }
  /// The candidate's worker (none in a check of a task alone): for retire().
  std::unique_ptr<worker> take_candidate_process() noexcept { return std::move(cand_.proc); }
  /// The worker was SIGKILLed by someone else (the OOM killer, an operator): worth one retry.
  bool lost_worker() const noexcept { return end_.lost_worker; }
  /// The verdict comes from a failure in the evaluator's own process (its device memory, its
  /// comparison), not from the candidate: it is not cached.
  bool evaluator_failed() const noexcept { return end_.evaluator_failed; }
  /// Closes this evaluation's mappings of the worker's exports (outputs kept on the device), if
  /// an early end left any: before the worker goes.
  void drop_outputs() noexcept {
    reference_.clear();
    if (b_)
      b_->drop_outputs();
  }
  /// Bytes of one trial's inputs and reference outputs (0 before the reference ran): how much
  /// memory the task itself asks of the device. A loss of two 4 GiB inputs has a 4-byte output.
  std::uint64_t task_bytes() const noexcept {
    std::uint64_t n = reported_.input_bytes;
    if (!reference_.empty())
      for (const auto& b : reference_.front())
        if (b.kind.empty())
          n += static_cast<std::uint64_t>(b.numel()) * element_size(b.type);
    return n;
  }
  /// The hardware's peaks the reference's worker measured (asked by the context's ask_peaks), once.
  std::optional<device_peaks> take_peaks() noexcept { return std::exchange(peaks_, std::nullopt); }
  /// The reference's worker measures the peaks in this verdict (the context's ask_peaks, a verdict
  /// that is no check of its task alone): its reference phase holds the device alone, as measured
  /// rounds do, so that no other verdict's work beside it lowers them (KernelBench's activations
  /// measured 1.02-1.03 of their bound on an H200 with peaks taken beside another verdict).
  bool measures_peaks() const noexcept { return ctx_.ask_peaks && !req_.reference_only; }
  /// The worker's process, after run(): for device_evaluator::retire.
  std::unique_ptr<worker> take_process() noexcept { return std::move(w_.proc); }

private:
  // The job message; `role` "reference" or "candidate" for one side of the boundary, null for a
  // check of the task alone.
  std::string job_json(std::uint64_t seed, const char* role) const;
  // Keeps one `reference` message's outputs (and their rounding slack, the trial count and the
  // inputs' size it reports).
  bool keep_reference(const wire::node& n, worker_message& msg);
  // Phase 3 after `run` went to `w`: its device_done (then `device` is released for host bytes)
  // and every trial's outputs, compared with the reference's.
  bool run_trials(worker& w, std::optional<untimed_hold>& device);
  // A check of the task alone (reference_only): its reference in one worker, no candidate; the
  // verdict is the worker's `done`.
  void task_alone(std::uint64_t seed);
  // Phases 1-3 across the boundary (env/eval/evaluation_trials.cpp): the reference worker's
  // reference and inputs (kept in the boundary's facts), the candidate's worker's load and trials
  // on those inputs.
  bool split_trials(std::uint64_t seed);
  // Keeps the reference worker's exported trial outputs in this process's memory and says
  // `taken` (outputs kept on the device).
  bool take_reference_copies(worker& w);
  // run() but for a malformed message (wire::error), which it turns into the verdict.
  verdict judge();
  // One trial's `candidate` message with its outputs decoded (mapped, for outputs on the
  // device); a decoding failure is kept and reported when the checks reach that trial.
  struct trial_outputs {
    wire::node header;
    std::size_t trial = 0; // the header's; past the reference's trials when it names none
    std::vector<tensor_blob> outs, again; // `again`: repeat_outputs, where the message has them
    bool has_again = false;
    std::string outs_error, again_error;
  };
  trial_outputs decode_trial(const wire::node& n, worker_message& msg);
  bool check_candidate(const trial_outputs& tr, const device_differences& ahead);
  // Asks for `rounds` more timed rounds and appends their settled times. A continuation (more
  // rounds of the same measurement, or a recheck) follows the previous request at once and
  // plays no warm-up rounds.
  bool measure(std::int64_t rounds, std::vector<double>& ref, std::vector<double>& cand, bool continuation = false);
  // One measurement: evaluator.rounds rounds, or only evaluator.min_rounds when their band is
  // already within evaluator.early_stop_spread.
  bool measure_once(const timing_policy& policy, std::vector<double>& ref, std::vector<double>& cand);

  /// The trust boundary's part, made by judge() for every verdict but a check of a task alone.
  std::optional<boundary> b_;
  /// The measurement ended at its first look: the candidate is clearly slower (measure_once).
  bool slow_stop_ = false;
};

} // namespace crucible::env
