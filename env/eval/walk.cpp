// One verdict's conversation with its workers (env/eval/walk.hpp): messages out and in, the build
// service answered on the way, a worker's end or a deadline turned into the verdict, the workers
// stopped and continued, a `done` taken.
#include "env/eval/walk.hpp"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace crucible::env {

using clock_type = std::chrono::steady_clock;

void walk::ended(worker& who_ended, const std::string& when) {
  end_.done = true;
  end_.lost_worker = who_ended.died_by_signal() && who_ended.exit_signal() == SIGKILL;
  const auto how = who_ended.exit_description();
  set(verdict_status::runtime_error, std::string{who(who_ended)} + " " + (how.rfind("killed", 0) == 0 ? "was " : "") + how + " " + when);
}

bool walk::send(worker& to, const std::string& json, const std::vector<std::vector<std::byte>>* frames) {
  if (auto r = frames ? to.send(json, *frames) : to.send(json); !r) {
    // A worker killed from outside (an operator, the OOM killer) an instant before the message
    // stops taking messages before its end is seen: that is a lost worker, retried on a fresh one
    // as when it dies while answering, not a verdict on the candidate.
    if (to.ended(std::chrono::steady_clock::now() + std::chrono::seconds(1))) {
      ended(to, "before it took the job");
      return false;
    }
    set(verdict_status::runtime_error, "worker stopped listening: " + r.error().message);
    return false;
  }
  return true;
}

bool walk::receive(worker& from, double seconds, const char* phase, wire::node& header, worker_message& msg,
                         double nudge_after, const std::function<void()>& nudge) {
  auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  auto nudge_at = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(nudge_after));
  bool nudged = !nudge;
  for (;;) {
    const auto outcome = from.receive(nudged ? deadline : std::min(deadline, nudge_at), msg);
    if (outcome == receive_outcome::deadline && !nudged && clock_type::now() < deadline) {
      nudged = true;
      nudge();
      continue;
    }
    switch (outcome) {
      case receive_outcome::deadline: {
        from.kill();
        end_.done = true;
        char buf[160];
        std::snprintf(buf, sizeof buf, "no progress within %.0f s while %s; the worker was killed", seconds, phase);
        set(verdict_status::timeout, buf);
        return false;
      }
      case receive_outcome::died:
        ended(from, std::string{"while "} + phase);
        return false;
      case receive_outcome::message: break;
    }
    try {
      header = wire::parse(msg.json);
      if (!header.is_object() || !header["type"].defined())
        throw wire::error("the message has no type");
    } catch (const wire::error& e) {
      from.kill();
      end_.done = true;
      set(verdict_status::runtime_error, std::string{who(from)} + " broke the protocol while " + phase + ": " + e.what());
      return false;
    }
    const auto type = header["type"].as<std::string>();
    if (type == "build" && clock_running_) {
      // No service works for a worker while its clock runs: the builder's time is charged to no
      // one (a timed sample on the CPU is charged the worker's own CPU time), and a "build" whose
      // constructor computes in the builder hands back work done outside the clock. Every
      // legitimate build is asked for before: in the module's load, ModelNew's constructor, the
      // trials, or the untimed call that precedes each sample on the same code path.
      from.kill();
      end_.done = true;
      v_.checks_failed.push_back("runtime:service_in_timing");
      set(verdict_status::rejected, std::string{who(from)}
                                      + " asked the build service for a build during a timed sample; no service "
                                        "answers while a clock runs (work done outside the worker's processes is not "
                                        "charged to it): build in the module, the constructor or the trials");
      return false;
    }
    if (type == "build") {
      // The build service, in any phase (Triton builds at a kernel's first launch), within the
      // phase's deadline; then the message the phase waits for. A build asked for during the
      // trials (a load_inline in ModelNew's constructor) runs without the trials' hold on the
      // device, so that other evaluations time on it meanwhile instead of waiting for a compiler;
      // the hold is taken again before the worker hears the reply and goes on.
      const bool yield = trials_hold_ != nullptr && trials_hold_->has_value() && (*trials_hold_)->held();
      if (yield)
        trials_hold_->reset();
      // A build may take evaluator.load_timeout_s wherever it is asked for, and the time it takes
      // does not count against the phase's deadline (a constructor's build is no lack of progress
      // in the trials); all builds of a verdict together extend its phases by that much at most.
      const auto b0 = clock_type::now();
      const double left = std::max(0.0, ctx_.opt.load_timeout_s - build_grace_s_);
      auto reply = ctx_.builds.build(
        msg.json, std::max(deadline, b0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(left))));
      const double grant = std::min(left, std::chrono::duration<double>(clock_type::now() - b0).count());
      build_grace_s_ += grant;
      const auto more = std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(grant));
      deadline += more;
      nudge_at += more;
      if (yield)
        trials_hold_->emplace(ctx_.gate);
      if (!send(from, reply))
        return false;
      continue;
    }
    if (type == "done") {
      take_done(header);
      end_.done = true;
      return false;
    }
    return true;
  }
}

void walk::take_done(const wire::node& n) {
  if (n["host_ms"].is_object() && ctx_.log.enabled(log_level::debug)) {
    // Where the worker's host time went, step by step (docs/evaluator.md, Timing).
    std::string text;
    for (const auto& [step, ms] : n["host_ms"].fields())
      text += "; " + step + " " + ms.as<std::string>();
    ctx_.log.debug("evaluator", ctx_.device, " ", req_.target.name, ": worker host ms", text);
  }
  auto status = parse_verdict_status(n["status"].as<std::string>("runtime_error"));
  auto s = status.value_or(verdict_status::runtime_error);
  if (s == verdict_status::ok) {
    // The worker may only confirm; ok is decided here, from outputs and timings. A check of a
    // task alone (check_task) ran no candidate code: the worker's word that the reference ran
    // is the result.
    if (req_.reference_only)
      set(verdict_status::ok, n["message"].as<std::string>(""));
    return;
  }
  set(s, n["message"].as<std::string>(""));
  if (n["checks_failed"].is_list())
    for (const auto& c : n["checks_failed"])
      v_.checks_failed.push_back(c.as<std::string>());
}

bool walk::freeze(worker& w, clock_type::time_point* stopped_at) {
  if (auto r = w.freeze(stopped_at); !r) {
    if (&w == w_.proc.get())
      end_.evaluator_failed = true; // the reference's worker: not the candidate's doing
    set(verdict_status::runtime_error, std::string{who(w)} + " could not be stopped: " + r.error().message);
    return false;
  }
  return true;
}

bool walk::thaw(worker& w) {
  if (auto r = w.thaw(); !r) {
    if (w.ended(clock_type::now() + std::chrono::seconds(1))) {
      ended(w, "during the timing");
      return false;
    }
    if (&w == w_.proc.get())
      end_.evaluator_failed = true; // the reference's worker: not the candidate's doing
    set(verdict_status::runtime_error, std::string{who(w)} + " could not be continued: " + r.error().message);
    return false;
  }
  return true;
}

void walk::refuse_below_floor(double call_ms, double floor_ms, const char* besides, std::uint64_t bytes) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "the candidate's median timed call took %.2f us%s, below the floor of %.2f us (half the fastest fill "
                "of its %llu output bytes on this device); no call produces its outputs faster than the hardware "
                "writes them",
                call_ms * 1e3, besides, floor_ms * 1e3, static_cast<unsigned long long>(bytes));
  v_.checks_failed.push_back("runtime:below_floor");
  set(verdict_status::rejected, buf);
}

double walk::bound_floor_ms(double ref_call_ms) const {
  if (!ctx_.opt.limits || !v_.work.counted())
    return NAN;
  double floor = NAN;
  if (peaks_)
    floor = env::bound_floor_ms(v_.work, *peaks_);
  else if (const auto p = peaks_registry::process().find(v_.hardware))
    floor = env::bound_floor_ms(v_.work, *p);
  return ref_call_ms >= floor ? floor : NAN;
}

void walk::refuse_below_bound(double call_ms, double floor_ms, const char* besides) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "the candidate's median timed call took %.2f us%s, below the floor of %.2f us its task's bound sets "
                "on this hardware (half of %.4g MB read and written at the fastest copy measured here, %.4g GB/s); "
                "no call computes its outputs from its inputs faster than the hardware moves them",
                call_ms * 1e3, besides, floor_ms * 1e3, (v_.work.bytes_read + v_.work.bytes_written) / 1e6,
                (v_.work.bytes_read + v_.work.bytes_written) / (2 * floor_ms) / 1e6);
  v_.checks_failed.push_back("runtime:below_floor");
  set(verdict_status::rejected, buf);
}

} // namespace crucible::env
