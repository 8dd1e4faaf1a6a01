// Phases 1-3 of a verdict, the reference's outputs and the candidate's trials on the same inputs
// (docs/evaluator.md, The protocol), across the trust boundary in two workers (and a check of a
// task alone, its reference in one worker and no candidate): the reference's worker computes the
// reference and draws every input, the
// boundary's part keeps what it tells of the task and hands the candidate's worker its inputs, and
// the candidate's worker loads the candidate without the device and runs the trials. Methods of
// evaluation (env/eval/evaluation.hpp).
#include "env/eval/evaluation.hpp"
#include "env/eval/worker_messages.hpp"

#include <algorithm>
#include <utility>

namespace crucible::env {

using clock_type = std::chrono::steady_clock;

void evaluation::task_alone(std::uint64_t seed) {
  const auto& opt = ctx_.opt;
  wire::node n;
  worker_message msg;
  // The reference on the first trial's inputs, its outputs sent as host bytes; the worker then
  // says `done` (ok, or what failed), which receive() turns into the verdict.
  phase_hold device{ctx_.gate, false};
  phase("reference");
  if (!send(job_json(seed, nullptr)))
    return;
  while (receive(opt.reference_timeout_s, "computing the reference", n, msg)) {
    const auto type = n["type"].as<std::string>();
    if (type == "device_done") {
      device.release();
      phase("reference outputs");
      continue;
    }
    if (type != "reference") {
      set(verdict_status::runtime_error, "unexpected message " + type + " during the reference phase");
      return;
    }
    if (!keep_reference(n, msg))
      return;
  }
}

bool evaluation::split_trials(std::uint64_t seed) {
  const auto& opt = ctx_.opt;
  auto& facts = b_->facts();
  worker& rw = *w_.proc;
  wire::node n;
  worker_message msg;
  {
    // Phase 1: the reference's worker parses the candidate's source (the static screen; it never
    // runs it), then computes the reference on each trial's inputs and sends both.
    phase_hold device{ctx_.gate, measures_peaks()};
    phase("reference");
    if (!send(rw, job_json(seed, "reference")))
      return false;
    for (;;) {
      if (!receive(rw, opt.reference_timeout_s, "computing the reference", n, msg))
        return false;
      const auto type = n["type"].as<std::string>();
      if (type == "device_done") {
        // Outputs kept on the device are copied here (take_reference_copies), still holding it.
        if (cuda_device_ < 0)
          device.release();
        phase("reference outputs");
        continue;
      }
      if (type == "inputs") {
        boundary::trial_input t;
        t.msg = std::move(msg);
        msg = worker_message{};
        if (n["on_device"].as<bool>(false)) {
          if (!b_->on_device()) {
            set(verdict_status::runtime_error, "the reference's worker described a trial's inputs on a device the verdict does not use");
            return false;
          }
          t.on_device = true;
          t.seed = n["seed"].as<std::uint64_t>(0);
          t.dist = n["distribution"].as<int>(0);
          t.digest = n["digest"].as<std::string>("");
        }
        facts.trial_inputs.push_back(std::move(t));
        continue;
      }
      if (type == "reference") {
        if (!keep_reference(n, msg))
          return false;
        // Each output's rounding slack by distribution: the largest of that distribution's trials.
        auto& slack = facts.slack[n["distribution"].as<int>(0)];
        const auto& outs = reference_.back();
        slack.resize(std::max(slack.size(), outs.size()), 0.0);
        for (std::size_t i = 0; i < outs.size(); ++i)
          slack[i] = std::max(slack[i], outs[i].slack);
        if (cuda_device_ >= 0 && static_cast<std::int64_t>(reference_.size()) == reported_.trials) {
          if (!take_reference_copies(rw))
            return false;
          device.release();
        }
        continue;
      }
      if (type == "reference_info")
        break;
      set(verdict_status::runtime_error, "unexpected message " + type + " from the reference's worker");
      return false;
    }
    facts.info = msg.json;
    // The timed rounds draw from every distribution the reference allows but the task's own
    // (0): the others scale each value by a fresh random factor, so no two timed calls see the
    // same inputs, even where get_inputs() ignores the seed (a stored output then pays nothing).
    for (const auto& a : n["ref_aliased"])
      facts.aliased.push_back(a.as<bool>(false));
    // Rounds draw only distributions a trial measured the slack of (a timed call is held to the
    // slack of its own inputs' distribution, which the trials alone measure).
    for (const auto& d : n["dists"])
      if (const int k = d.as<int>(0); k != 0 && facts.slack.count(k) > 0)
        facts.dists.push_back(k);
    if (facts.dists.empty()) {
      // Fewer trials than distributions (evaluator.trials 1): distribution 1 (the task's inputs,
      // each value scaled by U(0.5, 2)), held to distribution 0's slack.
      facts.dists = {1};
      if (facts.slack.count(0) > 0)
        facts.slack[1] = facts.slack[0];
    }
  }
  const auto want = static_cast<std::size_t>(reported_.trials);
  if (reference_.size() != want || facts.trial_inputs.size() != want) {
    set(verdict_status::runtime_error, "the reference's worker sent " + std::to_string(reference_.size())
                                         + " reference trials and " + std::to_string(facts.trial_inputs.size())
                                         + " sets of inputs, expected " + std::to_string(want));
    return false;
  }
  // Phase 2: the candidate's worker, which gets the task's data (constructor arguments, what the
  // reference's profiled call ran) and never its module, loads the candidate without the device.
  auto c = fresh_workers_ ? ctx_.pool.start_fresh() : ctx_.pool.take();
  if (!c) {
    set(verdict_status::runtime_error, "no worker could be started for the candidate: " + c.error().message);
    return false;
  }
  cand_ = std::move(*c);
  worker& cw = *cand_.proc;
  phase("load");
  if (!send(cw, job_json(seed, "candidate")) || !send(cw, facts.info))
    return false;
  for (;;) {
    if (!receive(cw, opt.load_timeout_s, "loading the candidate", n, msg))
      return false;
    const auto type = n["type"].as<std::string>();
    if (type == "loaded")
      break;
    if (type != "phase") {
      set(verdict_status::runtime_error, "unexpected message " + type + " while loading");
      return false;
    }
  }
  // Phase 3: the trials, on the reference's inputs, passed on as the reference's worker sent them.
  std::optional<untimed_hold> device{std::in_place, ctx_.gate};
  phase("trials");
  for (std::size_t t = 0; t < facts.trial_inputs.size(); ++t)
    if (!b_->pass_trial_input(cw, t))
      return false;
  if (!send(cw, worker_msg::command("run")))
    return false;
  if (!run_trials(cw, device))
    return false;
  facts.trial_inputs.clear();
  if (b_->on_device())
    // The trials are compared: the timed rounds compare with the reference's own samples and
    // read only the dtypes and shapes from here, so the device copies go (a task's outputs may
    // be gigabytes, one copy per trial).
    for (auto& outs : reference_)
      for (auto& b : outs)
        b.device.reset();
  // From here on the candidate's worker runs only while it is timed, and between a sample and the
  // next command (its own checks); stopped, none of its processes can run while the reference is
  // timed or while its inputs are written.
  return freeze(cw);
}

} // namespace crucible::env
