// env/eval/evaluation.hpp (internal to env/): one candidate's walk through the worker protocol, the
// class device_evaluator::evaluate runs on a worker it took from the pool (env/eval/evaluation.cpp;
// across the trust boundary env/eval/boundary.cpp). It reaches its evaluator only through an
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
#include <random>
#include <string>
#include <vector>

#include "env/eval/compare.hpp"
#include "env/eval/device_gate.hpp"
#include "env/eval/build_service.hpp"
#include "env/eval/evaluation_context.hpp"
#include "env/eval/eval_request.hpp"
#include "env/verdict.hpp"
#include "env/eval/timing.hpp"
#include "env/eval/worker_pool.hpp"

namespace crucible::env {

// Adds the time between construction and destruction to a counter.
struct time_spent {
  std::atomic<std::uint64_t>& total;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~time_spent() {
    total += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  }
};

/// One candidate's walk through the protocol. Lives on the calling thread's stack.
class evaluation {
public:
  evaluation(const evaluation_context& ctx, const eval_request& req, ready_worker w)
    : ctx_(ctx), req_(req), w_(std::move(w)) {
    v_.hardware = w_.hardware;
    v_.baseline = to_string(ctx.opt.baseline);
    tol_.f64 = {ctx.opt.fp32_atol, ctx.opt.fp32_rtol};
    tol_.f32 = {ctx.opt.fp32_atol, ctx.opt.fp32_rtol};
    tol_.f16 = {ctx.opt.fp16_atol, ctx.opt.fp16_rtol};
    tol_.bf16 = {ctx.opt.bf16_atol, ctx.opt.bf16_rtol};
  }

  /// The verdict. A message of a worker that lacks a field the evaluator needs, or holds one of
  /// the wrong type, ends it with `runtime_error` naming the field (the workers are killed).
  verdict run();
  /// Across the trust boundary, the candidate's worker started now instead of taken from the
  /// idle ones (a retry after a worker was killed from outside: what killed it may have killed
  /// the idle ones too). Before run().
  void use_fresh_workers() noexcept { fresh_workers_ = true; }
  /// The candidate's worker where the verdict has two (the trust boundary): for retire().
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
    ref_side_.sets.clear();
    cand_side_.sets.clear();
    dev_.staged.clear();
    dev_.last_ref_snaps.clear();
    dev_.clock.reset(); // its queued work waited for before the words it waits on go
    dev_.words.clear();
    dev_.mapped.clear();
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
  /// The worker's process, after run(): for device_evaluator::retire.
  std::unique_ptr<worker> take_process() noexcept { return std::move(w_.proc); }

private:
  enum class next { more, finished };

  // Receives one message from `from` (the evaluation's worker by default) before `deadline`;
  // on death or deadline fills the verdict and returns false.
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
  // reference", "before it took the job"): runtime_error saying how, and lost_worker() when
  // it was killed from outside (retried on a fresh worker).
  void ended(const std::string& when) { ended(*w_.proc, when); }
  void ended(worker& who, const std::string& when);
  // "the worker", "the reference's worker" or "the candidate's worker": who a message names.
  const char* who(const worker& w) const noexcept {
    return !two_workers_ ? "the worker" : &w == w_.proc.get() ? "the reference's worker" : "the candidate's worker";
  }

  // -- the trust boundary (env/eval/boundary.cpp): the reference and the candidate in two workers --
  // The job message; `role` "reference" or "candidate" for one side of the boundary, else null.
  std::string job_json(std::uint64_t seed, const char* role) const;
  // runtime:below_floor: a median timed call of `call_ms` (`besides`: what it excludes) under
  // the floor of `floor_ms`, the fill of `bytes`.
  void refuse_below_floor(double call_ms, double floor_ms, const char* besides, std::uint64_t bytes);
  // Keeps one `reference` message's outputs (and their rounding slack, the trial count and the
  // inputs' size it reports).
  bool keep_reference(const wire::node& n, worker_message& msg);
  // Phase 3 after `run` went to `w`: its device_done (then `device` is released for host bytes)
  // and every trial's outputs, compared with the reference's.
  bool run_trials(worker& w, std::optional<untimed_hold>& device);
  // The candidate's worker stopped or continued (worker::freeze/thaw); a failure decides the
  // verdict (runtime_error, not the candidate's).
  bool freeze(worker& w, std::chrono::steady_clock::time_point* stopped_at = nullptr);
  bool thaw(worker& w);
  // Phases 1-3 where one worker runs both (the CUDA path until the boundary reaches it).
  bool one_process_trials(std::uint64_t seed);
  // Phases 1-3 across the boundary: the reference worker's reference and inputs, the
  // candidate's worker's load and trials on those inputs.
  bool split_trials(std::uint64_t seed);
  // One measurement across the boundary (measure()'s split form).
  bool measure_split(std::int64_t rounds, std::vector<double>& ref, std::vector<double>& cand, bool continuation);
  // After the timing: the candidate's worker ends, and the reference is timed alone in its own
  // worker, which never loaded candidate code; a reference slower during the verdict than alone
  // beyond evaluator.reference_band refuses it (runtime:slow_reference).
  bool check_clean_reference(const std::vector<double>& ref);
  /// One worker's part in the timing rounds across the boundary: its input buffers, one set per
  /// call of a sample (each tensor's address and size in the worker; plain values stay as the
  /// worker has them).
  struct side {
    worker* proc = nullptr;
    struct buffer {
      std::uint64_t addr = 0, bytes = 0;
      bool value = false;
      std::shared_ptr<device_bytes> span; // on a CUDA device: this process's mapping of it
    };
    std::vector<std::vector<buffer>> sets;
    // Its timed CPU samples, their wall times and their charged CPU times (cpu_charge_ms), in all
    // (the debug log's).
    std::int64_t samples = 0;
    double wall_ms = 0, charged_ms = 0;
  };
  /// One sample's inputs as the reference's worker drew them: per call, per input, the tensor's
  /// bytes (empty for a plain value, which the workers keep as the trials gave it).
  using sample_inputs = std::vector<std::vector<std::vector<std::byte>>>;
  /// One trial's inputs as the reference's worker sent them: its `inputs` message (JSON and
  /// frames). On a CUDA device the message only describes them, and the reference's worker draws
  /// them again from `seed` and `dist` for the candidate's worker (pass_trial_inputs_on_device).
  struct trial_input {
    worker_message msg;
    bool on_device = false;
    std::uint64_t seed = 0;
    int dist = 0;
    std::string digest; // what the reference's worker drew then (env/eval/harness/outputs.py, _inputs_digest)
  };
  // Gives `s` input buffers for `calls` calls per sample.
  bool make_buffers(side& s, std::int64_t calls);
  // Draws one sample's inputs in the reference's worker, from distribution `dist`.
  bool draw(int dist, sample_inputs& in);
  // The reference's worker's `drawn` answer (`n`, `msg`) to a draw of `calls` calls' inputs from
  // distribution `dist` (from `seed` where given, else fresh seeds), on the device with dev_.on;
  // `phase` names the wait, `what` what the inputs are for in the error. The worker is stopped
  // again after it.
  bool request_draw(std::int64_t calls, int dist, std::optional<std::uint64_t> seed, const char* phase,
                    const char* what, wire::node& n, worker_message& msg);
  // A trial's inputs on a CUDA device: drawn again by the reference's worker, copied from its
  // memory into room the candidate's worker makes for them (its answer to `t.msg`).
  bool pass_trial_inputs_on_device(worker& cw, const trial_input& t);
  // draw's second half on a CUDA device: the drawn tensors, which the reference's worker names
  // in its own memory (`n`, its `drawn` message), copied into dev_.staged.
  bool draw_on_device(worker& rw, const wire::node& n, sample_inputs& in);
  // Times one sample of `s` on `in`: its untimed call, its inputs written while it is stopped,
  // the clock around `go` ... `sampled`, its outputs read while it is stopped again (per call).
  // False when the verdict is decided.
  bool time_sample(side& s, const sample_inputs& in, std::vector<std::vector<tensor_blob>>& outs, double& ms);
  // What a CPU sample is charged (ms), from two readings of what its worker ran (worker::cpu_ns),
  // taken while it was stopped before and after: its processes' CPU time over evaluator.cpu_threads.
  double cpu_charge_ms(std::uint64_t before_ns, std::uint64_t after_ns) const;
  // time_sample on a CUDA device (boundary.cpp): the clock runs from before this process copies
  // the sample's inputs into the worker's buffers to after it has copied the worker's outputs
  // into its own memory.
  // With `null`: the empty sample of measure_null (one tiny kernel for the calls, the copies of
  // the reference's last outputs for the outputs' copies; `in` unused, `ms` the whole sample's).
  bool time_sample_device(side& s, const sample_inputs& in, std::vector<std::vector<tensor_blob>>& outs, double& ms,
                          bool null = false);
  // The candidate's checks of a timed call's outputs and inputs, shared by both forms of a
  // sample: refuse_unlike_trials refuses output k of another dtype or shape than in the trials
  // (runtime:timing_outputs) and says whether it did; may_not_alias says output k must not share
  // memory with an input (the reference's does not); refuse_aliased (runtime:aliased_output) and
  // refuse_input_mutation (runtime:input_mutation) refuse and return false.
  bool refuse_unlike_trials(std::size_t k, const tensor_blob& b);
  bool may_not_alias(std::size_t k) const { return !(k < facts_.aliased.size() && facts_.aliased[k]); }
  bool refuse_aliased(std::size_t k);
  /// runtime:output_layout: the candidate handed an output back in another layout than row-major.
  bool refuse_layout(std::size_t k);
  /// Writes a sample's inputs into side `s`'s buffers (process_vm_writev), as drawn or
  /// (complement) every byte inverted: the content check of aliasing. False with the verdict set
  /// on failure (the evaluator's own where the worker is the reference's).
  bool write_inputs(const side& s, const sample_inputs& in, bool complement);
  bool refuse_input_mutation();
  // The untimed call before a sample; the worker is stopped after it.
  bool prime(worker& w);
  // The copies of the staged inputs into `s`'s buffers (a CUDA device).
  std::vector<device_copy> input_copies(const side& s) const;
  // This process's mapping of the allocation `handle` of `w` names (kept for the evaluation).
  // Refuses an allocation this process has mapped for another worker: a worker that names the
  // other side's memory is reading what it did not compute (runtime:foreign_memory).
  result<std::shared_ptr<device_bytes>> map_handle(worker& w, const std::string& handle);
  // dev_.mapped's key of a worker's allocation: "pid:handle".
  static std::string mapping_key(const worker& w, const std::string& handle);
  // Gives `s`'s worker the device clock's event to wait for and takes its own (CUDA).
  bool setup_clock(side& s);
  // The empty sample's round trip across the boundary (ms), fastest of five.
  bool measure_null();
  // Keeps the reference worker's exported trial outputs in this process's memory and says
  // `taken` (outputs kept on the device).
  bool take_reference_copies(worker& w);
  /// A sample's time per call, net of the empty sample's window on a device (boundary.cpp).
  double net_ms(double ms) const;
  // One paired round across the boundary: ms per call of each side; false when decided.
  bool split_round(std::int64_t k, double& ref_ms, double& cand_ms, bool& counted);
  // run() but for a malformed message (wire::error), which it turns into the verdict.
  verdict judge();
  // Handles a `done` message: fills the verdict from it.
  void take_done(const wire::node& n);
  void set(verdict_status s, std::string message) {
    v_.status = s;
    v_.message = std::move(message);
    end_.failed = true;
  }
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
  void phase(const char* name) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
    ctx_.log.debug("evaluator", ctx_.device, " ", req_.target.name, ": ", name, " at +", buf, " s");
    if (ctx_.observer) // from the load on, across the boundary: the candidate's worker
      ctx_.observer(name, two_workers_ && cand_.proc ? cand_.proc->pid() : w_.proc->pid());
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
  // Asks for `rounds` more timed rounds and appends their settled times. A continuation (more
  // rounds of the same measurement, or a recheck) follows the previous request at once and
  // plays no warm-up rounds.
  bool measure(std::int64_t rounds, std::vector<double>& ref, std::vector<double>& cand, bool continuation = false);
  // One measurement: evaluator.rounds rounds, or only evaluator.min_rounds when their band is
  // already within evaluator.early_stop_spread.
  bool measure_once(const timing_policy& policy, std::vector<double>& ref, std::vector<double>& cand);

  // The walk's state: what it was given, its workers, then one part per concern (what the
  // reference told, the rounds across the boundary, the device side, what the workers reported,
  // how it ended). About 20 members: each part below is one phase's or one side's own.
  const evaluation_context& ctx_;
  const eval_request& req_;
  ready_worker w_; // the one worker, or the reference's where the verdict has two
  ready_worker cand_; // the candidate's worker, where the verdict has two
  /// The reference and the candidate in two workers (evaluator.boundary: process, on the CPU, and
  /// on a CUDA device with evaluator.cuda_boundary).
  bool fresh_workers_ = false; // use_fresh_workers()
  bool two_workers_ = false;
  /// The measurement ended at its first look: the candidate is clearly slower (measure_once).
  bool slow_stop_ = false;
  /// The trials' hold on the device while run_trials waits on the candidate's worker: a build
  /// that worker asks for meanwhile (its constructor's load_inline) lets go of it (receive).
  std::optional<untimed_hold>* trials_hold_ = nullptr;
  /// Seconds by which builds have extended this verdict's phase deadlines (receive): at most
  /// evaluator.load_timeout_s in all.
  double build_grace_s_ = 0;
  /// What the reference's worker told of the task, for the candidate's worker and the rounds
  /// across the boundary.
  struct reference_facts {
    /// Each trial's inputs and the task's data (`reference_info`).
    std::vector<trial_input> trial_inputs;
    std::string info;
    std::vector<int> dists;     // the input distributions the reference allows, for the rounds
    std::vector<bool> aliased;  // which reference outputs alias an input
    /// Per input distribution, per output, the largest rounding slack of that distribution's
    /// trials: a timed call is held to the slack of the inputs it was given, never the loosest.
    std::map<int, std::vector<double>> slack;
  } facts_;
  /// The timed rounds across the boundary.
  struct split_timing {
    std::int64_t sample_calls = 0; // calls per timed sample (0: not chosen yet)
    std::int64_t round_no = 0;     // rounds played, warm-up included
    bool outputs_reused = false;   // two calls of one sample handed back the same memory: one call per sample
    bool host_shared = false;      // another evaluation was in flight during the measured rounds
    bool clock_running = false;    // a timed sample's clock runs: no service answers the worker (receive)
    double floor_ms = -1;          // the physics floor of a timed call (boundary.cpp), once measured
    double null_ms = 0;            // the fastest round trip of an empty sample of the reference's worker
    std::uint64_t floor_bytes = 0; // the output bytes the floor is measured on
    std::mt19937_64 rng{std::random_device{}()}; // the order of each round's two samples
  } split_;
  side ref_side_, cand_side_;
  /// Across the boundary on a CUDA device (on_device): each call's inputs of the sample being
  /// timed, in this process's memory (draw uploads them), the reference's last sample's output
  /// copies (for measure_null), the workers' allocations this process has mapped, by
  /// "pid:handle", the clock of the samples (device_clock) and each worker's go and done words,
  /// by pid (setup_clock).
  struct clock_words {
    std::shared_ptr<device_bytes> go, done; // mapped from the worker's memory
    std::uint32_t seq = 0;                  // the last sample's number
  };
  struct device_sides {
    bool on = false;
    std::vector<std::vector<std::shared_ptr<device_bytes>>> staged;
    std::vector<std::shared_ptr<device_bytes>> last_ref_snaps;
    std::size_t last_ref_calls = 0; // the calls of the sample last_ref_snaps come from
    std::map<std::string, std::shared_ptr<device_bytes>> mapped;
    std::unique_ptr<device_clock> clock;
    std::map<pid_t, clock_words> words;
    std::vector<double> laps[2][3]; // per side, a sample's clock in parts (debug log)
  } dev_;
  verdict v_;
  tolerances tol_;
  std::vector<std::vector<tensor_blob>> reference_;
  const int cuda_device_ = ctx_.outputs_device; // >= 0: outputs stay on this CUDA device
  struct {
    bool measured = false;  // a measurement was made (its warm-up rounds played)
    bool measuring = false; // the device gate has let this timing begin its measured rounds
  } gate_;
  /// How the walk ended so far.
  struct walk_state {
    bool done = false;             // the worker sent `done` (or died): no further messages
    bool lost_worker = false;
    bool failed = false;           // set() was called: the verdict is decided
    bool evaluator_failed = false; // see evaluator_failed()
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
