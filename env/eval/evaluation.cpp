// One candidate's walk through the worker protocol (env/eval/evaluation.hpp): the job goes to a worker
// the pool handed over, the reference's and candidate's messages come back, outputs are compared
// on raw bytes or on the device, the timing rounds are asked for and the verdict is built.
// device_evaluator::evaluate (env/eval/evaluator.cpp) runs it and owns the retries and the cache.
#include "env/eval/evaluation.hpp"
#include "env/eval/device_kind.hpp"
#include "env/eval/worker_messages.hpp"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "env/eval/device/device_bytes.hpp"
#include "env/reward.hpp"

namespace crucible::env {

using clock_type = std::chrono::steady_clock;

namespace {

// Decodes the outputs listed in a message header, taking their bytes from the frames, or mapping
// the device memory the worker exported (on CUDA device `cuda_device` of this process).
result<std::vector<tensor_blob>> decode_outputs(const wire::node& list, worker_message& msg, int cuda_device) {
  std::vector<tensor_blob> out;
  if (!list.defined() || list.is_null())
    return out;
  if (!list.is_list())
    return fail(errc::protocol, "outputs is not a list");
  for (const auto& item : list) {
    tensor_blob b;
    if (item["kind"].defined()) {
      b.kind = item["kind"].as<std::string>();
      out.push_back(std::move(b));
      continue;
    }
    auto type = parse_dtype(item["dtype"].as<std::string>());
    if (!type) {
      b.kind = "tensor of unsupported dtype " + item["dtype"].as<std::string>();
      out.push_back(std::move(b));
      continue;
    }
    b.type = *type;
    for (const auto& d : item["shape"])
      b.shape.push_back(d.as<std::int64_t>());
    if (item["ipc"].defined()) {
      if (cuda_device < 0)
        return fail(errc::protocol, "a device output arrived but this evaluator asked for host bytes");
      auto mapped = map_exported(cuda_device, item["ipc"].as<std::string>(), item["offset"].as<std::uint64_t>(),
                                 item["bytes"].as<std::uint64_t>(), element_size(b.type));
      if (!mapped)
        return mapped.error();
      b.device = std::move(*mapped);
      out.push_back(std::move(b));
      continue;
    }
    auto frame = item["frame"].as<std::size_t>();
    if (frame == 0 || frame > msg.frames.size())
      return fail(errc::protocol, "output refers to missing frame ", std::to_string(frame));
    b.bytes = std::move(msg.frames[frame - 1]);
    out.push_back(std::move(b));
  }
  return out;
}

} // namespace

evaluation::trial_outputs evaluation::decode_trial(const wire::node& n, worker_message& msg) {
  trial_outputs tr;
  tr.header = n; // shares the parsed message, which no later message changes
  tr.trial = n["trial"].as<std::size_t>(reference_.size());
  if (auto outs = decode_outputs(n["outputs"], msg, cuda_device_))
    tr.outs = std::move(*outs);
  else
    tr.outs_error = outs.error().message;
  if (n["repeat_outputs"].defined()) {
    tr.has_again = true;
    if (auto again = decode_outputs(n["repeat_outputs"], msg, cuda_device_))
      tr.again = std::move(*again);
    else
      tr.again_error = again.error().message;
  }
  return tr;
}

namespace {

// A worker's report of the settings its side's calls ran with ({"name": "value"}; data from its
// process: each name and value cut to printable ASCII and 80 characters, at most 64 of them).
void take_precision(const wire::node& p, std::map<std::string, std::string>& into) {
  if (!p.is_object())
    return;
  auto printable = [](std::string s) {
    if (s.size() > 80)
      s.resize(80);
    for (auto& c : s)
      if (c < 0x20 || c > 0x7e)
        c = '?';
    return s;
  };
  into.clear();
  for (const auto& [name, value] : p.fields()) {
    if (into.size() == 64)
      break;
    if (value.is_scalar())
      into[printable(name)] = printable(value.as<std::string>(""));
  }
}

} // namespace

bool evaluation::check_candidate(const trial_outputs& tr, const device_differences& ahead) {
  const auto& n = tr.header;
  const auto trial = tr.trial;
  if (trial >= reference_.size()) {
    set(verdict_status::runtime_error, "the worker reported an unknown trial");
    return false;
  }
  if (!tr.outs_error.empty()) {
    set(verdict_status::runtime_error, "the worker broke the protocol: " + tr.outs_error);
    return false;
  }
  if (n["threads_after"].defined() && n["threads_before"].defined()
      && n["threads_after"].as<int>() > n["threads_before"].as<int>()) {
    v_.checks_failed.push_back("runtime:threads");
    set(verdict_status::rejected, "the candidate left threads running after its forward");
    return false;
  }
  if (const auto own = n["own_kernels"]; own.is_scalar())
    reported_.own_kernels = own.as<long>(-1);
  take_precision(n["precision"], v_.precision_candidate);
  // The candidate's own profile, for a multi-turn episode's feedback only (verdict::profile): data
  // from its process, so each name is cut to printable ASCII and 160 characters (it goes into the
  // policy's next prompt and into JSON), a share outside [0, 1] is left out, and nothing of it
  // enters a check or the reward.
  if (const auto p = n["profile"]; p.is_list() && v_.profile.empty())
    for (const auto& k : p) {
      if (v_.profile.size() == 5)
        break;
      if (!k.is_list() || k.size() != 2 || !k[std::size_t{0}].is_scalar() || !k[std::size_t{1}].is_scalar())
        continue;
      const double share = k[std::size_t{1}].as<double>(NAN);
      if (!(share >= 0 && share <= 1))
        continue;
      auto name = k[std::size_t{0}].as<std::string>("");
      if (name.size() > 160)
        name.resize(160);
      for (auto& c : name)
        if (c < 0x20 || c > 0x7E)
          c = '?';
      v_.profile.push_back({std::move(name), share});
    }
  if (const auto o = n["own_share"]; o.is_scalar())
    if (const double x = o.as<double>(NAN); x >= 0 && x <= 1)
      v_.own_share = x;
  if (n["kernels"].defined() && n["kernels"].as<long>(1) == 0) {
    v_.checks_failed.push_back("runtime:no_kernel");
    set(verdict_status::rejected, "no kernel or operator ran in the candidate's forward");
    return false;
  }
  auto cmp = compare_outputs(reference_[trial], tr.outs, tol_, &ahead);
  if (!cmp.ok && cmp.evaluator_error) {
    end_.evaluator_failed = true;
    set(verdict_status::runtime_error, "trial " + std::to_string(trial) + ": " + cmp.message);
    return false;
  }
  if (!cmp.ok) {
    // The worker's input distributions (docs/evaluator.md, Correctness).
    static const char* const dists[] = {"the task's inputs", "inputs scaled by U(0.5, 2)",
                                        "inputs scaled by U(0.5, 2) with random signs",
                                        "inputs scaled by U(0.5, 2) with random signs, times 32",
                                        "inputs scaled by U(0.5, 2), one run of each scaled by 16 more"};
    const int d = n["distribution"].as<int>(static_cast<int>(trial % 2));
    set(verdict_status::incorrect, "trial " + std::to_string(trial) + " (distribution " + std::to_string(d)
                                     + (d >= 0 && d <= 4 ? std::string{": "} + dists[d] : std::string{}) + "): " + cmp.message);
    return false;
  }
  if (!n["inputs_unchanged"].as<bool>(true)) {
    v_.checks_failed.push_back("runtime:input_mutation");
    set(verdict_status::rejected, "the candidate changed its inputs (trial " + std::to_string(trial) + ")");
    return false;
  }
  if (tr.has_again) {
    if (!tr.again_error.empty()) {
      set(verdict_status::runtime_error, "the worker broke the protocol: " + tr.again_error);
      return false;
    }
    auto same = compare_outputs(tr.outs, tr.again, tol_, &ahead);
    if (!same.ok && same.evaluator_error) {
      end_.evaluator_failed = true;
      set(verdict_status::runtime_error, "trial " + std::to_string(trial) + ", second call: " + same.message);
      return false;
    }
    if (!same.ok) {
      set(verdict_status::incorrect, "not deterministic: a second call on the same inputs gave " + same.message);
      return false;
    }
  }
  return true;
}

bool evaluation::measure_once(const timing_policy& policy, std::vector<double>& ref, std::vector<double>& cand) {
  const auto& opt = ctx_.opt;
  const auto from = ref.size();
  auto this_measurement = [&] { // the summary of this measurement's rounds so far
    return summarize_rounds(std::vector<double>(ref.begin() + static_cast<long>(from), ref.end()),
                            std::vector<double>(cand.begin() + static_cast<long>(from), cand.end()), policy);
  };
  std::int64_t done = 0; // rounds of this measurement so far
  // A first look for a clearly slower candidate (evaluator.slow_stop_rounds): its whole band well
  // below the reference's speed already, more rounds would only narrow a figure that earns no credit.
  const auto look = opt.slow_stop_rounds;
  if (look >= static_cast<std::int64_t>(policy.buckets) && look < opt.rounds) {
    if (!measure(look, ref, cand))
      return false;
    done = look;
    if (clearly_slower(this_measurement(), opt.slow_stop_below)) {
      slow_stop_ = true;
      return true;
    }
  }
  const auto first = std::max<std::int64_t>({opt.min_rounds, static_cast<std::int64_t>(policy.buckets), done});
  if (opt.early_stop_spread <= 0 || first >= opt.rounds)
    return measure(opt.rounds - done, ref, cand, done > 0);
  if (first > done && !measure(first - done, ref, cand, done > 0))
    return false;
  if (may_stop_early(this_measurement(), opt.early_stop_spread, policy))
    return true; // already far inside max_spread: more rounds would cost time and tell little
  return measure(opt.rounds - first, ref, cand, true);
}

bool evaluation::measure(std::int64_t rounds, std::vector<double>& ref, std::vector<double>& cand, bool continuation) {
  time_spent timed{ctx_.counters.timing_ns};
  return b_->measure(rounds, ref, cand, continuation);
}

std::string evaluation::job_json(std::uint64_t seed, const char* role) const {
  const auto& opt = ctx_.opt;
  // The candidate's side of the boundary gets nothing of the task's and nothing the verdict
  // depends on: no task source, no tolerances (docs/evaluator.md, Trust boundary).
  const bool candidate_side = role && std::string_view{role} == "candidate";
  worker_msg::job_fields f;
  f.task_name = req_.target.name;
  if (!candidate_side)
    f.task_source = req_.target.source;
  f.candidate_source = req_.candidate;
  f.seed = seed;
  f.trials = req_.reference_only ? 1 : opt.trials;
  f.reference_only = req_.reference_only;
  f.baseline = to_string(opt.baseline);
  f.placement_jitter_bytes = opt.placement_jitter_bytes;
  f.quiet_gc = opt.quiet_gc;
  f.eval_mode = opt.eval_mode;
  f.static_checks = opt.static_checks;
  if (!candidate_side) {
    f.tol = tol_;
    f.rounding_factor = opt.rounding_factor;
  }
  f.outputs_on_device = cuda_device_ >= 0 && !req_.reference_only;
  f.peaks = measures_peaks() && !candidate_side;
  if (role)
    f.role = role;
  return worker_msg::job(f);
}

bool evaluation::take_reference_copies(worker& w) {
  // The worker's exports are poisoned before the candidate loads: keep a copy of each, all queued
  // together and waited for once. The mappings are closed after the worker has been told, while
  // it goes on (it frees its exports only when its next command comes).
  std::vector<const device_bytes*> exported;
  for (const auto& outs_of_trial : reference_)
    for (const auto& b : outs_of_trial)
      if (b.device)
        exported.push_back(b.device.get());
  auto own = copy_all_to_owned(exported);
  if (!own) {
    end_.evaluator_failed = true;
    set(verdict_status::runtime_error, "cannot keep a reference output: " + own.error().message);
    return false;
  }
  std::vector<std::shared_ptr<device_bytes>> mappings;
  size_t k = 0;
  for (auto& outs_of_trial : reference_)
    for (auto& b : outs_of_trial)
      if (b.device)
        mappings.push_back(std::exchange(b.device, std::move((*own)[k++])));
  if (!send(w, worker_msg::command("taken")))
    return false;
  phase("reference kept"); // the worker now poisons its exports
  mappings.clear();
  return true;
}

bool evaluation::keep_reference(const wire::node& n, worker_message& msg) {
  take_precision(n["precision"], v_.precision_reference);
  auto outs = decode_outputs(n["outputs"], msg, cuda_device_);
  if (!outs) {
    set(verdict_status::runtime_error, std::string{who(*w_.proc)} + " broke the protocol: " + outs.error().message);
    return false;
  }
  // The reference's own rounding error per output (its distance from a float64 copy of
  // itself on these inputs, measured before any candidate code existed) widens atol.
  if (const auto r = n["rounding"]; r.is_list()) {
    for (size_t i = 0; i < std::min<size_t>(r.size(), outs->size()); ++i) {
      const double e = r[i].as<double>(0);
      if (std::isfinite(e) && e > 0)
        (*outs)[i].slack = ctx_.opt.rounding_factor * e;
    }
  }
  reference_.push_back(std::move(*outs));
  if (const auto k = n["trials"]; k.is_scalar()) // only ever fewer
    reported_.trials = std::clamp<std::int64_t>(k.as<std::int64_t>(reported_.trials), 1, reported_.trials);
  if (const auto b = n["input_bytes"]; b.is_scalar())
    reported_.input_bytes = std::max<std::uint64_t>(reported_.input_bytes, b.as<std::uint64_t>(0));
  // The reference's work in one call (reference.py's count_work), counted before any candidate
  // code existed: carried by the verdict as the worker counted it, where it reads as a verdict's
  // `work` does (a worker that sends anything else has its count left out).
  if (const auto w = n["work"]; w.is_object())
    if (auto work = task_work_from_json(*w.value()))
      v_.work = std::move(*work);
  // The hardware's peaks, where the job asked (evaluator.limits), measured by the same worker
  // before any candidate code existed; the evaluator keeps them for its hardware. A worker that
  // sends anything else has them left out, and the next verdict asks again.
  if (const auto p = n["peaks"]; p.is_object())
    peaks_ = peaks_from_json(*p.value(), "");
  return true;
}

bool evaluation::run_trials(worker& w, std::optional<untimed_hold>& device) {
  const auto& opt = ctx_.opt;
  wire::node n;
  worker_message msg;
  trials_hold_ = &device;
  bool got = receive(w, opt.run_timeout_s, "running the correctness trials", n, msg);
  // Across the boundary on a device, a trial's inputs that did not fit the candidate's worker's
  // budget when they were passed on are asked for as that trial runs.
  while (got && b_ && b_->on_device() && n["type"].as<std::string>() == "trial_inputs") {
    if (!b_->pass_later_trial_input(w, n["trial"].as<std::int64_t>(-1)))
      got = false;
    else
      got = receive(w, opt.run_timeout_s, "running the correctness trials", n, msg);
  }
  trials_hold_ = nullptr;
  if (!got)
    return false;
  if (n["type"].as<std::string>() != "device_done") {
    set(verdict_status::runtime_error, "unexpected message " + n["type"].as<std::string>() + " during the trials");
    return false;
  }
  if (cuda_device_ < 0)
    device.reset(); // host bytes: moving and comparing them needs no device
  phase("trial outputs");
  {
    // Every trial's outputs first, then all device comparisons in one batch (one wait on the
    // device instead of one per output), then the checks trial by trial, in order.
    std::vector<trial_outputs> trials;
    for (std::int64_t t = 0; t < reported_.trials; ++t) {
      if (!receive(w, opt.run_timeout_s, "running the correctness trials", n, msg))
        return false;
      if (n["type"].as<std::string>() != "candidate") {
        set(verdict_status::runtime_error, "unexpected message " + n["type"].as<std::string>() + " during the trials");
        return false;
      }
      trials.push_back(decode_trial(n, msg));
    }
    std::vector<output_lists> lists;
    for (const auto& tr : trials) {
      if (tr.trial < reference_.size() && tr.outs_error.empty())
        lists.emplace_back(&reference_[tr.trial], &tr.outs);
      if (tr.has_again && tr.outs_error.empty() && tr.again_error.empty())
        lists.emplace_back(&tr.outs, &tr.again);
    }
    const auto ahead = compare_on_device_ahead(lists, tol_);
    const bool all_pass = std::all_of(trials.begin(), trials.end(),
                                      [&](const trial_outputs& tr) { return check_candidate(tr, ahead); });
    trials.clear(); // the mappings close before the worker frees what they map (at its next message)
    if (!all_pass) {
      (void) w.send(worker_msg::command("stop"));
      return false;
    }
  }
  return true;
}

verdict evaluation::run() {
  try {
    auto v = judge();
    // A candidate that chose numeric settings of its own (TF32, a reduced-precision reduction) is
    // judged on the outputs it returned, and its verdict says so.
    if (const auto changes = v.precision_changes(); !changes.empty()) {
      std::string list;
      for (const auto& c : changes)
        list += (list.empty() ? "" : "; ") + c;
      v.message += (v.message.empty() ? "" : " ") + std::string{"The candidate ran with numeric settings of its own, "
                                                                "judged on the outputs it returned: "} + list + ".";
    }
    return v;
  } catch (const wire::error& e) {
    // The workers run candidate code, so a message may be anything; none is trusted further.
    if (w_.proc)
      w_.proc->kill();
    if (cand_.proc)
      cand_.proc->kill();
    end_.done = true;
    set(verdict_status::runtime_error, std::string{"a worker broke the protocol: "} + e.what());
    return v_;
  }
}

verdict evaluation::judge() {
  const auto& opt = ctx_.opt;
  auto seed = req_.seed;
  if (seed == 0) {
    std::random_device rd;
    seed = (static_cast<std::uint64_t>(rd()) << 20) ^ rd();
    seed &= (1ull << 52) - 1; // exact in a JSON double
    if (seed == 0)
      seed = 1;
  }
  reported_.trials = req_.reference_only ? 1 : opt.trials;
  // A check of the task alone runs no candidate: its reference in one worker (task_alone). It
  // says where the outputs sit within the tolerance, so that the comparison judges them relative
  // to their scale (crucible tasks import; env/eval/compare.hpp).
  if (req_.reference_only) {
    task_alone(seed);
    if (v_.status == verdict_status::ok && !reference_.empty())
      if (auto line = within_tolerance_line(reference_.front(), tol_); !line.empty())
        v_.message += "\n" + line;
    return v_;
  }
  // Every verdict crosses the trust boundary (env/eval/boundary.hpp): the reference and the
  // candidate in two workers. Where samples run on the device the boundary needs this process's
  // own view of the workers' device memory (outputs kept on the device): without it the verdict
  // is not judged at all.
  const auto& kind = kind_of(ctx_.device);
  if (kind.samples_on_device && cuda_device_ < 0) {
    end_.evaluator_failed = true;
    set(verdict_status::runtime_error, "cannot judge across the trust boundary on " + ctx_.device
                                         + ": this process has no view of the device's memory (its context on the device "
                                           "did not start; the evaluator's log says why)");
    return v_;
  }
  v_.judged = "boundary";
  b_.emplace(static_cast<walk&>(*this), kind.samples_on_device);
  if (!split_trials(seed))
    return v_;
  v_.correct = true;
  timing_policy policy{static_cast<std::size_t>(opt.buckets), opt.max_spread, opt.max_bucket_disagreement,
                       opt.win_threshold, opt.band_floor};
  std::vector<double> ref, cand;
  // Phase 4: timing (and re-measurement) with the device to itself: no other evaluation's
  // untimed work and no worker's held initialisation beside its measured rounds (beside its
  // warm-up only with evaluator.untimed_beside_warmup / starts_beside_warmup; measure()). While
  // it waits, no new untimed work starts (unless allowed beside warm-up); what has started
  // finishes its phase.
  const auto wait0 = clock_type::now();
  timed_hold timed{ctx_.gate};
  log_gate_wait(wait0, "timing", "other timings",
                ctx_.gate.untimed_beside_warmup() ? "" : ", other evaluations' untimed device work",
                ctx_.gate.starts_beside_warmup() ? "" : ", starting workers' initialisation");
  phase("timing");
  if (!measure_once(policy, ref, cand))
    return v_;
  auto summary = summarize_rounds(ref, cand, policy);
  while (!slow_stop_ && !summary.stable && static_cast<std::int64_t>(ref.size()) + opt.rounds <= opt.max_rounds) {
    if (!measure(opt.rounds, ref, cand))
      return v_;
    summary = summarize_rounds(ref, cand, policy);
  }
  const bool settled = summary.stable || slow_stop_; // the first measurement's, before any recheck's rounds join it
  if (summary.speedup > opt.recheck_above) {
    // A large speedup is measured again, independently, before it is believed. The second
    // measurement is shorter (evaluator.recheck_rounds): it only has to agree. Two measurements
    // agree when they differ by less than the tolerance plus both their bands (ordinary noise);
    // when the first two do not, a third decides. The speedup then comes from the rounds of an
    // agreeing pair together; a candidate with no agreeing pair is rejected.
    struct rounds_of {
      std::vector<double> ref, cand;
      timing_summary summary;
    };
    std::vector<rounds_of> runs;
    runs.push_back({std::move(ref), std::move(cand), summary});
    auto agree = [&](const timing_summary& a, const timing_summary& b) {
      auto lo = std::min(a.speedup, b.speedup);
      auto hi = std::max(a.speedup, b.speedup);
      return (hi - lo) / lo <= opt.recheck_tolerance + a.band + b.band;
    };
    std::optional<std::size_t> partner; // of runs.back()
    for (int attempt = 0; attempt < 2 && !partner; ++attempt) {
      rounds_of again;
      if (!measure(opt.recheck_rounds, again.ref, again.cand, true))
        return v_;
      again.summary = summarize_rounds(again.ref, again.cand, policy);
      runs.push_back(std::move(again));
      for (std::size_t a = 0; a + 1 < runs.size() && !partner; ++a)
        if (agree(runs[a].summary, runs.back().summary))
          partner = a;
    }
    if (!partner) {
      v_.checks_failed.push_back("runtime:recheck");
      std::string what = "independent measurements of a large speedup disagree:";
      for (const auto& r : runs) {
        char buf[64];
        std::snprintf(buf, sizeof buf, " %.3fx (±%.1f%%)", r.summary.speedup, 100 * r.summary.band);
        what += buf;
      }
      set(verdict_status::rejected, what);
      v_.correct = true;
      return v_;
    }
    ref = std::move(runs[*partner].ref);
    cand = std::move(runs[*partner].cand);
    ref.insert(ref.end(), runs.back().ref.begin(), runs.back().ref.end());
    cand.insert(cand.end(), runs.back().cand.begin(), runs.back().cand.end());
    summary = summarize_rounds(ref, cand, policy);
  }
  const auto speedup = summary.speedup;
  phase("finish");
  worker& last = *cand_.proc; // the worker that ran the candidate
  wire::node n;
  worker_message msg;
  if (!thaw(last))
    return v_;
  if (!send(last, worker_msg::command("finish")))
    return v_;
  if (receive(last, opt.run_timeout_s, "finishing", n, msg)) {
    set(verdict_status::runtime_error, "unexpected message " + n["type"].as<std::string>() + " after timing");
    return v_;
  }
  if (end_.failed)
    return v_; // death, deadline, or a `done` that carried a failure (a runtime check after timing)
  if (!b_->check_clean_reference(ref))
    return v_;
  v_.status = verdict_status::ok;
  // A candidate whose forward ran the reference's own kernels (operators on the CPU), each as many
  // times, earns no speed credit: a fallback to the reference's code, or the reference itself
  // (docs/evaluator.md, Own work). Its measured times stay in ref_ms and cand_ms.
  const bool lazy = reported_.own_kernels == 0;
  // A speedup counts only when its whole band clears the threshold: a verdict of 1.04x within
  // ±11% may as well be 0.93x, and crediting it rewards noise (docs/evaluator.md, Timing: the
  // band). Below 1.00x the measured figure stands: the best estimate of a slower kernel.
  const bool cleared = band_clears(summary, opt.win_threshold);
  const bool uncertain = speedup > 1.0 && !cleared;
  v_.speedup = credited_speedup(summary, opt.win_threshold, lazy);
  v_.speedup_spread = summary.band;
  v_.ref_ms = summary.ref_ms;
  v_.cand_ms = summary.cand_ms;
  v_.rounds = static_cast<std::uint32_t>(ref.size());
  char buf[400];
  char calls[48] = "";
  if (reported_.calls > 1)
    std::snprintf(calls, sizeof calls, " of %ld calls", reported_.calls);
  std::snprintf(buf, sizeof buf, "%s: %.3fx over %zu paired rounds%s (band ±%.1f%%)%s%s%s",
                cleared && !lazy ? "faster" : speedup < 1.0 / opt.win_threshold ? "slower" : "no faster",
                speedup, ref.size(), calls, 100 * summary.band,
                slow_stop_ ? "; clearly slower: the measurement ended at the first look"
                           : settled ? "" : "; unstable after max_rounds",
                lazy && speedup > 1.0 ? "; no speed credit: the candidate ran the reference's own kernels, each as many "
                                        "times (credited 1.00x)"
                                      : "",
                uncertain && !lazy ? "; the band reaches below the win threshold, so no speedup is credited (1.00x)"
                                   : "");
  v_.message = buf;
  if (reported_.trials < opt.trials)
    v_.message += "; " + std::to_string(reported_.trials) + " correctness trial" + (reported_.trials == 1 ? "" : "s") + " of "
                  + std::to_string(opt.trials) + ": more of the task's outputs would not fit the device";
  return v_;
}

} // namespace crucible::env
