// env/eval/boundary.hpp (internal to env/): the trust boundary's part of a verdict (docs/evaluator.md,
// Trust boundary): the reference in one sandboxed worker, the candidate in another that never sees
// the task. It keeps what the reference's worker told of the task, hands the candidate's worker its
// trials' inputs, and plays the timed rounds: both workers' input buffers, each round's inputs
// drawn by the reference's worker, the clock around each sample (the host's on the CPU, the
// device's on a CUDA device), both sides' outputs read while their workers are stopped and
// compared, the physics floor, and the reference timed alone afterwards. It talks to the workers
// and sets the verdict through the walk it is given (env/eval/walk.hpp); the judging is the
// evaluation's (env/eval/evaluation.hpp). Methods in env/eval/boundary.cpp, the CUDA half (mapped
// device memory, trial inputs on the device, the device clock's sample) in
// env/eval/boundary_device.cpp. Not included outside env/.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "env/eval/device/device_bytes.hpp"
#include "env/eval/walk.hpp"

namespace crucible::env {


class boundary {
public:
  /// One trial's inputs as the reference's worker sent them: its `inputs` message (JSON and
  /// frames). On a CUDA device the message only describes them, and the reference's worker draws
  /// them again from `seed` and `dist` for the candidate's worker (pass_trial_input).
  struct trial_input {
    worker_message msg;
    bool on_device = false;
    std::uint64_t seed = 0;
    int dist = 0;
    std::string digest; // what the reference's worker drew then (env/eval/harness/outputs.py, _inputs_digest)
  };
  /// What the reference's worker told of the task, for the candidate's worker and the rounds.
  struct reference_facts {
    /// Each trial's inputs and the task's data (`reference_info`).
    std::vector<trial_input> trial_inputs;
    std::string info;
    std::vector<int> dists;     // the input distributions the reference allows, for the rounds
    std::vector<bool> aliased;  // which reference outputs alias an input
    /// Per input distribution, per output, the largest rounding slack of that distribution's
    /// trials: a timed call is held to the slack of the inputs it was given, never the loosest.
    std::map<int, std::vector<double>> slack;
  };

  /// `on_device`: the workers' buffers, the clock and the flush are a CUDA device's (the walk's).
  boundary(walk& wk, bool on_device);
  ~boundary();
  boundary(const boundary&) = delete;
  boundary& operator=(const boundary&) = delete;

  bool on_device() const noexcept { return dev_.on; }
  /// Filled while the reference's worker computes the reference (evaluation's trials).
  reference_facts& facts() noexcept { return facts_; }
  /// Hands the candidate's worker trial `t`'s inputs (facts().trial_inputs[t]): as the reference's
  /// worker sent them, or on a CUDA device drawn again there and copied into room the candidate's
  /// worker makes for them. There the candidate's worker may answer `later` (they do not fit its
  /// device now): it asks for them when that trial runs (pass_later_trial_input).
  bool pass_trial_input(worker& cw, std::size_t t);
  /// The candidate's worker's `trial_inputs` during its trials: trial `t`'s inputs, which it
  /// answered `later` to, in the order it did, each once; room made now.
  bool pass_later_trial_input(worker& cw, std::int64_t t);
  /// Appends `rounds` paired rounds' times per call (ms) of each side; a continuation follows
  /// the previous request at once and plays no warm-up rounds. False when the verdict is decided
  /// (the candidate's outputs differ from the reference's on a timed call, below the floor, ...).
  bool measure(std::int64_t rounds, std::vector<double>& ref, std::vector<double>& cand, bool continuation);
  /// After the timing: the candidate's worker ends, and the reference is timed alone in its own
  /// worker, which never loaded candidate code; a reference slower during the verdict than alone
  /// beyond evaluator.reference_band refuses it (runtime:slow_reference).
  bool check_clean_reference(const std::vector<double>& ref);
  /// Closes the mappings of the workers' memory this part holds: before the workers go.
  void drop_outputs() noexcept;

private:
  using clock_type = std::chrono::steady_clock;
  /// One worker's part in the timing rounds: its input buffers, one set per call of a sample (each
  /// tensor's address and size in the worker; plain values stay as the worker has them).
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

  // The walk's, for the methods' bodies.
  bool send(worker& to, const std::string& json, const std::vector<std::vector<std::byte>>* frames = nullptr) {
    return wk_.send(to, json, frames);
  }
  bool receive(worker& from, double seconds, const char* phase, wire::node& header, worker_message& msg,
               double nudge_after = 0, const std::function<void()>& nudge = {}) {
    return wk_.receive(from, seconds, phase, header, msg, nudge_after, nudge);
  }
  void set(verdict_status s, std::string message) { wk_.set(s, std::move(message)); }
  void ended(worker& w, const std::string& when) { wk_.ended(w, when); }
  const char* who(const worker& w) const noexcept { return wk_.who(w); }
  bool freeze(worker& w, clock_type::time_point* stopped_at = nullptr) { return wk_.freeze(w, stopped_at); }
  bool thaw(worker& w) { return wk_.thaw(w); }

  // Gives both sides input buffers for `calls` calls per sample, at once: each side's asked for
  // (its worker thawed), then taken (its worker stopped again).
  bool make_both_buffers(std::int64_t calls);
  bool ask_buffers(side& s, std::int64_t calls);
  bool take_buffers(side& s, std::int64_t calls);
  // Draws one sample's inputs in the reference's worker, from distribution `dist`.
  bool draw(int dist, sample_inputs& in);
  // The reference's worker's `drawn` answer (`n`, `msg`) to a draw of `calls` calls' inputs from
  // distribution `dist` (from `seed` where given, else fresh seeds), on the device with dev_.on;
  // `phase` names the wait, `what` what the inputs are for in the error. The worker is stopped
  // again after it.
  bool request_draw(std::int64_t calls, int dist, std::optional<std::uint64_t> seed, const char* phase,
                    const char* what, wire::node& n, worker_message& msg);
  // Trial `trial`'s inputs on a CUDA device: drawn again by the reference's worker, copied from
  // its memory into room the candidate's worker makes for them (its answer to the trial's
  // message), or with `may_defer` its answer `later` kept in later_.
  bool pass_trial_inputs_on_device(worker& cw, std::size_t trial, bool may_defer);
  // draw's second half on a CUDA device: the drawn tensors, which the reference's worker names
  // in its own memory (`n`, its `drawn` message), mapped here as dev_.staged.
  bool draw_on_device(worker& rw, const wire::node& n, sample_inputs& in);
  // Times one sample of `s` on `in`: its untimed call, its inputs written while it is stopped,
  // the clock around `go` ... `sampled`, its outputs read while it is stopped again (per call).
  // False when the verdict is decided.
  bool time_sample(side& s, const sample_inputs& in, std::vector<std::vector<tensor_blob>>& outs, double& ms);
  // What a CPU sample is charged (ms), from two readings of what its worker ran (worker::cpu_ns),
  // taken while it was stopped before and after: its processes' CPU time over evaluator.cpu_threads.
  double cpu_charge_ms(std::uint64_t before_ns, std::uint64_t after_ns) const;
  // time_sample on a CUDA device (boundary_device.cpp): the clock runs from before this process
  // copies the sample's inputs into the worker's buffers to after it has copied the worker's
  // outputs into its own memory.
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
  /// Milliseconds since `t0`, and a lap of a phase with many exits: what passed from its making to
  /// its end is added to `into` (the rounds' and samples' parts in the debug log).
  static double ms_since(std::chrono::steady_clock::time_point t0);
  struct lap_into {
    double& into;
    std::chrono::steady_clock::time_point from = std::chrono::steady_clock::now();
    ~lap_into() { into += ms_since(from); }
  };
  // Gives `s`'s worker the device clock's event to wait for and takes its own (CUDA).
  bool setup_clock(side& s);
  // The empty sample's round trip across the boundary (ms), fastest of five.
  bool measure_null();
  /// A sample's time per call, net of the empty sample's window on a device.
  double net_ms(double ms) const;
  // One paired round: ms per call of each side; false when decided.
  bool split_round(std::int64_t k, double& ref_ms, double& cand_ms, bool& counted);

  walk& wk_;
  const evaluation_context& ctx_;
  reference_facts facts_;
  std::deque<std::size_t> later_; // the trials whose inputs the candidate's worker asks for as they run
  /// The timed rounds.
  struct split_timing {
    std::int64_t sample_calls = 0; // calls per timed sample (0: not chosen yet)
    std::int64_t round_no = 0;     // rounds played, warm-up included
    bool outputs_reused = false;   // two calls of one sample handed back the same memory: one call per sample
    bool host_shared = false;      // another evaluation was in flight during the measured rounds
    double floor_ms = -1;          // the physics floor of a timed call, once measured
    double null_ms = 0;            // the fastest round trip of an empty sample of the reference's worker
    std::uint64_t floor_bytes = 0; // the output bytes the floor is measured on
    std::mt19937_64 rng{std::random_device{}()}; // the order of each round's two samples
    bool pair_cand_first = false;                // the order of the first round of the pair being played
    std::int64_t measured_rounds = 0, measured_cand_first = 0; // counted rounds, and those with the candidate first (debug log)
    // The host's time in the rounds, in parts (debug log): the round's inputs drawn, its buffers
    // made, its two samples, their outputs compared (ms, summed over the rounds played).
    double host_draw_ms = 0, host_buffers_ms = 0, host_samples_ms = 0, host_compare_ms = 0;
    // A CPU sample's host time besides its wall time (side::wall_ms), in parts, per side
    // (reference, candidate; ms summed, debug log): the untimed call, the inputs written, the
    // cache flush, the outputs read, the candidate's checks after it (its inputs read back,
    // aliasing, its outputs overwritten).
    double cpu_parts[2][5] = {};
  } split_;
  side ref_side_, cand_side_;
  /// On a CUDA device (on): each call's inputs of the sample being timed, in this process's memory
  /// (draw uploads them), the reference's last sample's output copies (for measure_null), the
  /// workers' allocations this process has mapped, by "pid:handle", the clock of the samples
  /// (device_clock) and each worker's go and done words, by pid (setup_clock).
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
    // Per side, a sample in parts (debug log): host ms from `launch` to `launched`, the device's
    // window, let go early (1/0), host ms of the cache flush, of the close and finish, of the
    // checks after it (the inputs read back, the outputs overwritten), and the ms the worker says
    // its host took to queue the calls (`queued_us`: its word, for the log alone).
    std::vector<double> laps[2][7];
    double last_host_ms = 0; // the last sample's host time from `launch` to `launched`
  } dev_;
};

} // namespace crucible::env
